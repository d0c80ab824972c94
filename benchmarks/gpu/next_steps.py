"""The in-process measurements of benchmarks/gpu/next_contact.py, one per call: `python next_steps.py NAME SHAPE OUT`
writes OUT (JSON). NAME is one of STEPS; SHAPE is `gpu` (llama3.2-1b on CUDA) or `dry` (the debug model on the CPU,
seconds). Timed regions are synchronised, after untimed warm-up steps.

  ceilings     a large bf16 matmul; every GEMM of one training step at its real shape (forward, input gradient,
               weight gradient of each linear; TFLOPS each); the attention kernels (dlx.model.attention_kernels);
               the AdamW floor (one fused step over as many fp32 parameters as the model has); the loss's fp32 gradient
               accumulation, one GEMM against a product and a second pass
  bare         a bare PyTorch loop on dlx's own model and batch: autocast, the chunked loss, backward, clip at 1.0,
               fused AdamW; blocks compiled as `dlx pretrain` compiles them
  hf-compiled  transformers' LlamaForCausalLM of the same shape (sdpa attention), torch.compile'd, the same loop
  seed-hf      the seed's table row: HF Trainer, fp32, micro-batch 16, seq 1024, gradient checkpointing (as
               LLaMA-Factory runs it), fused AdamW; s/it and the allocator's peak
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parents[1] / "src")]

from dlx import device as dev  # noqa: E402
from dlx.data.source import LoaderSettings  # noqa: E402
from dlx.data.synthetic import SyntheticLoader  # noqa: E402
from dlx.model.llama import Transformer  # noqa: E402
from dlx.model.presets import resolve_model_args  # noqa: E402


@dataclass(frozen=True)
class Shape:
    model: str
    seq_len: int
    micro_batch: int
    steps: int
    """Timed steps (after `warmup` untimed ones)."""
    warmup: int
    device: str
    compile: bool
    matmul: int
    """Side of the square bf16 matmul of the ceiling."""


SHAPES = {
    "gpu": Shape("llama3.2-1b", 2048, 8, 20, 3, "cuda", True, 8192),
    "dry": Shape("debug", 32, 2, 2, 1, "cpu", False, 256),
}
SEED_SHAPES = {
    "gpu": Shape("llama3.2-1b", 1024, 16, 4, 1, "cuda", False, 0),
    "dry": Shape("debug", 32, 16, 2, 1, "cpu", False, 0),
}
"""The seed's row: fp32, micro-batch 16, seq 1024, activation checkpointing (its 1B model on an A100: 8.9 s/it,
42.73 GB)."""


def timed(device: torch.device, run, repeats: int) -> float:
    """Seconds per call of `run`, after one untimed call."""
    run()
    dev.synchronize(device)
    start = time.perf_counter()
    for _ in range(repeats):
        run()
    dev.synchronize(device)
    return (time.perf_counter() - start) / repeats


def matmul_tflops(m: int, n: int, k: int, device: torch.device, repeats: int = 10) -> float:
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    a, b = torch.randn(m, k, device=device, dtype=dtype), torch.randn(k, n, device=device, dtype=dtype)
    return 2 * m * n * k / timed(device, lambda: a @ b, repeats) / 1e12


def step_gemms(shape: Shape) -> list[tuple[str, int, int, int]]:
    """(name, M, N, K) of every GEMM one training step runs per layer (and the output head): forward y = x W^T,
    input gradient dx = dy W, weight gradient dW = dy^T x, with M × K times K × N."""
    args = resolve_model_args(shape.model)
    tokens, kv = shape.seq_len * shape.micro_batch, args.kv_heads * args.head_dim
    linears = {"wq": (args.dim, args.dim), "wk": (kv, args.dim), "wv": (kv, args.dim), "wo": (args.dim, args.dim)}
    linears |= {"w1": (args.ffn_hidden_dim, args.dim), "w3": (args.ffn_hidden_dim, args.dim)}
    linears |= {"w2": (args.dim, args.ffn_hidden_dim), "output": (args.vocab_size, args.dim)}
    gemms = []
    for name, (out_f, in_f) in linears.items():
        gemms += [(f"{name} fwd", tokens, out_f, in_f), (f"{name} dgrad", tokens, in_f, out_f)]
        gemms.append((f"{name} wgrad", out_f, in_f, tokens))
    return gemms


def adamw_floor_s(n_params: int, device: torch.device) -> float:
    """One fused AdamW step over n_params fp32 parameters with gradients (in 64 tensors, like a model's)."""
    sizes = [n_params // 64] * 64
    params = [torch.zeros(s, device=device, requires_grad=True) for s in sizes]
    for p in params:
        p.grad = torch.zeros_like(p)
    optimizer = torch.optim.AdamW(params, lr=1e-4, fused=device.type == "cuda")
    return timed(device, optimizer.step, 5)


def loss_accumulation(shape: Shape, device: torch.device) -> dict:
    """The output weight's gradient over one step's loss chunks, in bf16 into fp32: one GEMM accumulating into fp32
    (`accumulate_fp32`) against the narrow product added in a second pass. ms per step each, and their largest
    difference in one chunk relative to the product's largest element (bf16 rounding: at most 2⁻⁸)."""
    from dlx.model.loss import CHUNK_LOGITS, accumulate_fp32, balanced_chunk, cuda_addmm_into_fp32

    args = resolve_model_args(shape.model)
    tokens = shape.seq_len * shape.micro_batch
    chunk = balanced_chunk(tokens, max(1, CHUNK_LOGITS // args.vocab_size))
    n_chunks = -(-tokens // chunk)
    a = torch.randn(args.vocab_size, chunk, device=device, dtype=torch.bfloat16)
    b = torch.randn(chunk, args.dim, device=device, dtype=torch.bfloat16)
    fused, separate = (torch.zeros(args.vocab_size, args.dim, device=device) for _ in range(2))
    accumulate_fp32(fused, a, b)
    product = a @ b
    separate.add_(product)
    difference = ((fused - separate).abs().max() / product.float().abs().max()).item()

    def one_step(add) -> None:
        for _ in range(n_chunks):
            add()

    return {
        "fused_ms": 1e3 * timed(device, lambda: one_step(lambda: accumulate_fp32(fused, a, b)), 3),
        "separate_ms": 1e3 * timed(device, lambda: one_step(lambda: separate.add_(a @ b)), 3),
        "relative_difference": difference,
        "chunks": n_chunks,
        "one_gemm": device.type == "cuda" and cuda_addmm_into_fp32(device),
    }


def ceilings(shape: Shape) -> dict:
    from dlx.model.args import ModelArgs
    from dlx.model.attention_kernels import AttentionShape, choose_attention

    device = torch.device(shape.device)
    args: ModelArgs = resolve_model_args(shape.model)
    gemms = [
        {"gemm": name, "m": m, "n": n, "k": k, "tflops": matmul_tflops(m, n, k, device)}
        for name, m, n, k in step_gemms(shape)
    ]
    attention_shape = AttentionShape(shape.micro_batch, args.n_heads, args.kv_heads, shape.seq_len, args.head_dim)
    attention = choose_attention("auto", attention_shape, device)  # what `dlx pretrain` does before step 1
    n_params = sum(p.numel() for p in Transformer(args).parameters()) if device.type == "cpu" else 1_235_814_400
    return {
        "matmul_tflops": matmul_tflops(shape.matmul, shape.matmul, shape.matmul, device),
        "matmul_side": shape.matmul,
        "gemms": gemms,
        "attention": attention.header,
        "attention_ms": attention.ms,
        "adamw_floor_s": adamw_floor_s(n_params, device),
        "adamw_params": n_params,
        "loss_accumulation": loss_accumulation(shape, device),
    }


def synthetic_batches(vocab: int, shape: Shape, device: torch.device) -> list[tuple[torch.Tensor, torch.Tensor]]:
    loader = SyntheticLoader(vocab, LoaderSettings(shape.seq_len, shape.micro_batch, seed=0, device=device))
    return [next(loader) for _ in range(2)]


def train_steps(model, step_fn, batches, shape: Shape, device: torch.device) -> dict:
    """tokens/s over `shape.steps` timed steps, the allocator's peak (CUDA), the last loss."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=device.type == "cuda")
    losses: list[float] = []

    def step(index: int) -> None:
        loss = step_fn(*batches[index % len(batches)])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.detach())

    for index in range(shape.warmup):
        step(index)
    dev.synchronize(device)
    dev.reset_peak_memory(device)
    start = time.perf_counter()
    for index in range(shape.steps):
        step(index)
    dev.synchronize(device)
    seconds = (time.perf_counter() - start) / shape.steps
    tokens = shape.seq_len * shape.micro_batch
    return {
        "tokens_per_s": tokens / seconds,
        "step_s": seconds,
        "it_per_s": 1 / seconds,
        "peak_mem_gb": dev.peak_memory_gb(device),
        "loss": float(losses[-1]),
    }


def bare(shape: Shape) -> dict:
    """The same model and batch in a plain PyTorch loop, on the attention kernel `dlx pretrain`'s train.attention
    auto picks for the shape, so that dlx ÷ bare measures the rest of dlx's step and not the kernel choice."""
    from dlx.model.attention_kernels import AttentionShape, choose_attention
    from dlx.parallel.wrap import apply_compile

    device = torch.device(shape.device)
    torch.manual_seed(0)
    with device:
        model = Transformer(resolve_model_args(shape.model, max_seq_len=shape.seq_len))
    args = model.args
    attention_shape = AttentionShape(shape.micro_batch, args.n_heads, args.kv_heads, shape.seq_len, args.head_dim)
    attention = choose_attention("auto", attention_shape, device)
    if attention.kernel == "flex":
        model.causal_kernel = "flex"
    if shape.compile:
        apply_compile(model)
    precision = "bf16" if device.type == "cuda" else "fp32"

    def step_fn(inputs, targets):
        with dev.autocast(device, precision):
            return model(inputs, targets=targets).loss

    batches = synthetic_batches(model.args.vocab_size, shape, device)
    with dev.prefer_sdpa_kernel(attention.kernel):
        return {**train_steps(model, step_fn, batches, shape, device), "attention": attention.header}


def hf_model(shape: Shape, gradient_checkpointing: bool = False):
    from transformers import LlamaConfig, LlamaForCausalLM

    from dlx.model.hf import hf_config

    config = hf_config(resolve_model_args(shape.model, max_seq_len=shape.seq_len), torch.float32)
    config.pop("torch_dtype", None)
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**config, attn_implementation="sdpa")).to(shape.device)
    if gradient_checkpointing:
        model.gradient_checkpointing_enable()
    return model


def hf_compiled(shape: Shape) -> dict:
    device = torch.device(shape.device)
    model = hf_model(shape)
    forward = torch.compile(model) if shape.compile else model
    precision = "bf16" if device.type == "cuda" else "fp32"

    def step_fn(inputs, targets):
        with dev.autocast(device, precision):
            return forward(input_ids=inputs, labels=inputs).loss  # HF shifts the labels itself

    batches = synthetic_batches(model.config.vocab_size, shape, device)
    return train_steps(model, step_fn, batches, shape, device)


def seed_hf(shape: Shape, out_dir: Path) -> dict:
    """HF Trainer as LLaMA-Factory runs the seed's row: fp32, gradient checkpointing, fused AdamW, no logging."""
    from transformers import Trainer, TrainerCallback, TrainingArguments

    device = torch.device(shape.device)
    model = hf_model(shape, gradient_checkpointing=True)
    inputs, _ = synthetic_batches(model.config.vocab_size, shape, torch.device("cpu"))[0]
    dataset = [{"input_ids": row, "labels": row} for row in inputs] * (shape.warmup + shape.steps + 1)
    stamps: list[float] = []

    class Stamp(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            dev.synchronize(device)
            stamps.append(time.perf_counter())
            if len(stamps) == shape.warmup:
                dev.reset_peak_memory(device)

    arguments = TrainingArguments(
        output_dir=str(out_dir),
        per_device_train_batch_size=shape.micro_batch,
        max_steps=shape.warmup + shape.steps,
        optim="adamw_torch_fused",
        logging_strategy="no",
        save_strategy="no",
        report_to=[],
        disable_tqdm=True,
        use_cpu=device.type == "cpu",
        dataloader_num_workers=0,
        gradient_checkpointing=True,
    )
    Trainer(model=model, train_dataset=dataset, callbacks=[Stamp()], args=arguments).train()
    seconds = (stamps[-1] - stamps[shape.warmup - 1]) / shape.steps
    return {"it_per_s": 1 / seconds, "step_s": seconds, "peak_mem_gb": dev.peak_memory_gb(device)}


STEPS = ("ceilings", "bare", "hf-compiled", "seed-hf")


def main(argv: list[str]) -> int:
    name, shape_name, out = argv
    shape, seed = SHAPES[shape_name], SEED_SHAPES[shape_name]
    results = {
        "ceilings": lambda: ceilings(shape),
        "bare": lambda: bare(shape),
        "hf-compiled": lambda: hf_compiled(shape),
        "seed-hf": lambda: seed_hf(seed, Path(out).with_suffix(".trainer")),
    }[name]()
    results["shape"] = asdict(seed if name == "seed-hf" else shape)
    Path(out).write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps({k: v for k, v in results.items() if k != "gemms"}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
