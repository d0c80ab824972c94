"""torchtitan as a contender: its Llama-3 model at a dlx shape, built and stepped by torchtitan's own `Trainer` from
config objects the harness writes, holding dlx's initial weights and fed dlx's synthetic batches.

What the harness sets, and why:

- **Model**: `Llama3Model.Config` built by torchtitan's own layer builder (`_build_llama3_layers`, as its `1B` flavour
  is) from dlx's `ModelArgs`: dim, layers, heads, kv heads, FFN width, vocabulary, norm eps, tied embeddings, RoPE theta
  and Llama-3 scaling with dlx's factors (torchtitan's `1B` flavour has the 3.1 factor 8; Llama 3.2 has 32). Attention
  is `ScaledDotProductAttention` with `is_causal`, the kernel dlx runs on undivided sequences; torchtitan's default
  for language models is FlexAttention with per-document masks, which synthetic rows without document ends do not
  need.
- **Trainer**: `Trainer.Config` with AdamW (lr, betas 0.9/0.95, weight decay 0.1, eps 1e-8, `fused`) as dlx's,
  gradient clipping at 1.0, no activation checkpointing, compile of model and loss when asked, CUDA graphs of the
  forward and backward as torchtitan's default has them (on CUDA; `Setting.cuda_graphs` off, or side_by_side.py
  `--no-cuda-graphs`, turns them off), checkpoints, validation, profiling and TensorBoard off. Precision:
  `training.mixed_precision_param` bf16 (torchtitan applies it through FSDP2's `MixedPrecisionPolicy`, even on one
  device: bf16 compute, fp32 master weights and gradients) or float32. The loss is
  torchtitan's `ChunkedLossWrapper(CrossEntropyLoss)`, as its Llama-3 configs use. One difference is left: dlx
  keeps norm weights out of weight decay, torchtitan's `default_adamw` decays every parameter
  (tests/integration/test_titan_peer.py: after three steps the two losses agree within 1e-4).
- **Data**: `SyntheticBatches`, a `BaseDataLoader` that yields dlx's `SyntheticLoader` batches (`{"input": inputs}`,
  targets): the same tokens in the same order as `dlx pretrain --data.path synthetic`.
- **Weights**: dlx's initial model (`build_model`, from train.seed) → Hugging Face names (`dlx.model.hf`) →
  torchtitan's own `Llama3StateDictAdapter.from_hf` (which un-permutes q/k for its complex RoPE) → q, k, v fused as
  its attention's load hook fuses them → each parameter's local shard (`load_weights`).

`titan_setup.prepare_imports` (called by `Titan`) makes torchtitan importable and points it at the device here.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from .titan_setup import prepare_imports, single_process_env

TITAN = "torchtitan"


def model_config(args):
    """torchtitan's Llama3Model.Config for dlx's ModelArgs, built by the builder of its own flavours."""
    from torchtitan.models.common import ComplexRoPE, Embedding, Linear, RMSNorm
    from torchtitan.models.common.attention import ScaledDotProductAttention
    from torchtitan.models.llama3 import (
        _EMBEDDING_INIT,
        _EMBEDDING_SKIP_INIT,
        _NORM_INIT,
        _build_llama3_layers,
        _output_linear_init,
    )
    from torchtitan.models.llama3.model import Llama3Model

    scaling = args.rope_scaling
    rope = ComplexRoPE.Config(dim=args.head_dim, max_seq_len=args.max_seq_len, theta=args.rope_theta)
    if scaling is not None:
        rope.scaling, rope.scaling_factor = "llama", scaling.factor
        rope.low_freq_factor, rope.high_freq_factor = scaling.low_freq_factor, scaling.high_freq_factor
        rope.original_max_position_embeddings = scaling.original_max_seq_len
    layers = _build_llama3_layers(
        n_layers=args.n_layers,
        dim=args.dim,
        n_heads=args.n_heads,
        n_kv_heads=args.kv_heads,
        hidden_dim=args.ffn_hidden_dim,
        rope=rope,
        attn_backend="flex",  # replaced below
    )
    for layer in layers:
        layer.attention.inner_attention = ScaledDotProductAttention.Config()
        layer.attention_norm.eps = layer.ffn_norm.eps = args.norm_eps
    vocab, dim = args.vocab_size, args.dim
    return Llama3Model.Config(
        dim=dim,
        vocab_size=vocab,
        enable_weight_tying=args.tie_embeddings,
        tok_embeddings=Embedding.Config(
            num_embeddings=vocab,
            embedding_dim=dim,
            param_init=_EMBEDDING_SKIP_INIT if args.tie_embeddings else _EMBEDDING_INIT,
        ),
        norm=RMSNorm.Config(normalized_shape=dim, eps=args.norm_eps, param_init=_NORM_INIT),
        lm_head=Linear.Config(in_features=dim, out_features=vocab, param_init=_output_linear_init(dim)),
        layers=layers,
    )


@dataclass(frozen=True)
class Setting:
    """What both contenders train with."""

    model_argv: tuple[str, ...]
    """dlx `--model.*` overrides naming the shape."""
    seq_len: int
    micro_batch: int
    precision: str
    """bf16 or fp32."""
    compile: bool
    lr: float = 3e-4
    cuda_graphs: bool = True
    """torchtitan's CUDA graphs of forward and backward (its default; CUDA only; dlx has none)."""

    def dlx_argv(self, max_steps: int = 1_000_000) -> list[str]:
        """The `dlx pretrain` overrides of this setting (synthetic data, no evaluation, constant lr after no
        warm-up, so that both schedules are flat)."""
        argv = [*self.model_argv, "--model.max_seq_len", str(self.seq_len), "--data.path", "synthetic"]
        argv += ["--data.seq_len", str(self.seq_len), "--data.micro_batch_size", str(self.micro_batch)]
        argv += ["--train.precision", self.precision, "--train.compile", str(self.compile).lower()]
        argv += ["--train.lr", str(self.lr), "--train.schedule", "constant", "--train.warmup_ratio", "0"]
        argv += ["--train.max_steps", str(max_steps), "--eval.every", "0", "--log.every", "10"]
        return [*argv, "--log.progress", "false"]


def dlx_config(setting: Setting):
    from dlx.train.recipe import load_recipe

    return load_recipe(None, setting.dlx_argv())


def synthetic_loader(setting: Setting, vocab_size: int):
    """dlx's synthetic stream for this setting, as `dlx pretrain --data.path synthetic` builds it."""
    from dlx.data.source import LoaderSettings
    from dlx.data.synthetic import SyntheticLoader

    return SyntheticLoader(vocab_size, LoaderSettings(seq_len=setting.seq_len, micro_batch_size=setting.micro_batch))


def trainer_config(setting: Setting, args, dump_folder: Path):
    """torchtitan's Trainer.Config for this setting, written field by field."""
    from torchtitan.components.checkpoint import CheckpointManager
    from torchtitan.components.loss import ChunkedLossWrapper, CrossEntropyLoss
    from torchtitan.components.metrics import MetricsProcessor
    from torchtitan.components.optimizer import LRSchedulersContainer, default_adamw
    from torchtitan.components.validate import Validator
    from torchtitan.config import CompileConfig, TrainingConfig
    from torchtitan.models.llama3 import Llama3StateDictAdapter, parallelize_llama
    from torchtitan.protocols.model_spec import ModelSpec
    from torchtitan.trainer import Trainer

    spec = ModelSpec(
        name="llama3",
        flavor="dlx-shape",
        model=model_config(args),
        parallelize_fn=parallelize_llama,
        pipelining_fn=None,
        post_optimizer_build_fn=None,
        state_dict_adapter=Llama3StateDictAdapter,
    )
    batches, no_tokenizer = components()
    precision = "bfloat16" if setting.precision == "bf16" else "float32"
    return Trainer.Config(
        model_spec=spec,
        dump_folder=str(dump_folder),
        tokenizer=no_tokenizer.Config(),
        dataloader=batches.Config(vocab_size=args.vocab_size, setting=setting),
        loss=ChunkedLossWrapper.Config(loss_fn=CrossEntropyLoss.Config(global_vocab_size=args.vocab_size)),
        optimizer=default_adamw(lr=setting.lr, fused=True),
        lr_scheduler=LRSchedulersContainer.Config(warmup_steps=0, decay_ratio=None),
        training=TrainingConfig(
            local_batch_size=setting.micro_batch,
            seq_len=setting.seq_len,
            steps=1_000_000,
            max_norm=1.0,
            mixed_precision_param=precision,
            disable_cuda_graphs=not (setting.cuda_graphs and torch.cuda.is_available()),
        ),
        metrics=MetricsProcessor.Config(log_freq=10, enable_tensorboard=False),
        checkpoint=CheckpointManager.Config(enable=False),
        activation_checkpoint=None,
        compile=CompileConfig(enable=setting.compile, components=["model", "loss"]),
        validator=Validator.Config(enable=False),
    )


@functools.cache
def components() -> tuple[type, type]:
    """(SyntheticBatches, NoTokenizer): the harness's data loader and tokenizer, torchtitan Configurables defined once
    torchtitan is importable."""
    from torchtitan.components.dataloader import BaseDataLoader
    from torchtitan.components.tokenizer import BaseTokenizer

    class SyntheticBatches(BaseDataLoader):
        """dlx's synthetic batches as torchtitan's trainer takes them: ({"input": inputs}, labels) on the host."""

        @dataclass(kw_only=True, slots=True)
        class Config(BaseDataLoader.Config):
            vocab_size: int = 0
            setting: Setting | None = None

        def __init__(self, config: Config, **runtime) -> None:
            if runtime["local_batch_size"] != config.setting.micro_batch or runtime["dp_world_size"] != 1:
                raise ValueError("SyntheticBatches serves one process at the setting's micro-batch")
            self.loader = synthetic_loader(config.setting, config.vocab_size)

        def __iter__(self) -> Iterator[tuple[dict[str, torch.Tensor], torch.Tensor]]:
            while True:
                inputs, targets = next(self.loader)[:2]
                yield {"input": inputs}, targets

        def state_dict(self) -> dict:
            return {}

        def load_state_dict(self, state_dict: dict) -> None:
            pass

    class NoTokenizer(BaseTokenizer):
        """The trainer builds a tokenizer; synthetic token ids need none, so every use is refused."""

        @dataclass(kw_only=True, slots=True)
        class Config(BaseTokenizer.Config):
            pass

        def __init__(self, config: Config, **runtime) -> None:
            super().__init__()

        def encode(self, *args, **kwargs) -> list[int]:
            raise RuntimeError("the harness feeds token ids; nothing is encoded")

        decode = get_vocab_size = encode

    return SyntheticBatches, NoTokenizer


def dlx_initial_model(setting: Setting, device: torch.device = torch.device("cpu")):
    """dlx's model with the weights `dlx pretrain` starts from (drawn from train.seed), on `device`."""
    from dlx.train.build.model import build_model

    return build_model(dlx_config(setting), device)


def titan_state_dict(model, trainer) -> dict[str, torch.Tensor]:
    """dlx's weights in torchtitan's names and layout: dlx → Hugging Face names → torchtitan's own adapter."""
    from dlx.model.hf import dlx_to_hf_name
    from dlx.model.io import unique_state_dict

    hf = {dlx_to_hf_name(name): tensor for name, tensor in unique_state_dict(model).items()}
    adapter = trainer.config.model_spec.state_dict_adapter(trainer.model_config, None)
    return adapter.from_hf(hf)


def load_weights(trainer, state: dict[str, torch.Tensor]) -> None:
    """Write `state` (full tensors, torchtitan's stock wq/wk/wv names) into the trainer's parameters in place: q, k
    and v fused as the attention modules' own load hook fuses them, each tensor then copied into the parameter's local
    shard, which is what FSDP2 all-gathers and the optimizer updates (`load_state_dict` on the module would write the
    unsharded views, which the first optimizer step never sees). One process: a shard is the whole tensor."""
    from torch.distributed.tensor import DTensor

    model, state = trainer.model_parts[0], dict(state)
    for prefix, module in model.named_modules():
        if hasattr(module, "_merge_qkv_on_load"):
            module._merge_qkv_on_load(module, state, f"{prefix}.")
    parameters = dict(model.named_parameters())
    if set(parameters) - set(state):
        raise RuntimeError(f"dlx's weights lack torchtitan's {sorted(set(parameters) - set(state))[:4]}")
    with torch.no_grad():
        for name, parameter in parameters.items():
            local = parameter.to_local() if isinstance(parameter, DTensor) else parameter
            if local.shape != state[name].shape:
                raise RuntimeError(f"{name}: torchtitan's shard {tuple(local.shape)}, dlx's {tuple(state[name].shape)}")
            local.copy_(state[name])


class Titan:
    """torchtitan's Trainer at one setting, advanced `steps` steps at a time as `Trainer.train` advances it."""

    def __init__(self, setting: Setting, dump_folder: Path) -> None:
        self.stood_in = prepare_imports()
        from torchtitan.trainer import Trainer

        self.setting, self.name = setting, f"{TITAN} {setting.precision}"
        args = dlx_config(setting).model.args
        with single_process_env():
            self.trainer = Trainer(trainer_config(setting, args, dump_folder))
        initial = dlx_initial_model(setting, self.trainer.device)
        load_weights(self.trainer, titan_state_dict(initial, self.trainer))
        del initial
        self.batches = self.trainer.batch_generator(self.trainer.dataloader)

    def first_loss(self, rows: int) -> float:
        """The model's loss, as it stands, on the first `rows` rows of the stream's first batch (read from a fresh
        stream: the trainer's own is left where it is)."""
        trainer = self.trainer
        inputs, labels = next(synthetic_loader(self.setting, trainer.model_config.vocab_size))[:2]
        inputs, labels = inputs[:rows].to(trainer.device), labels[:rows].to(trainer.device)
        with torch.no_grad():
            hidden = trainer.model_parts[0](inputs)  # (B, T, dim): the loss applies lm_head
            loss, _ = trainer.loss_fn(hidden, labels, torch.tensor(labels.numel(), device=trainer.device))
        return loss.item()

    def run(self, steps: int) -> float:
        """Seconds for `steps` optimizer steps of `Trainer.train_step` (its loop's body without checkpoint and
        validation, both off)."""
        trainer = self.trainer
        synchronize(trainer.device)
        start = time.perf_counter()
        for _ in range(steps):
            trainer.step += 1
            trainer.gc_handler.run(trainer.step)
            trainer.train_step(self.batches)
        synchronize(trainer.device)
        return time.perf_counter() - start

    def close(self) -> None:
        self.trainer.close()
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
