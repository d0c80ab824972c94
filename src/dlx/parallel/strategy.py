"""What differs between one process, DDP, FSDP2 and DeepSpeed, with or without tensor parallelism, in a training step
and in a checkpoint.

The step loop calls the same things whatever the strategy: `gradient_sync(last)` around each micro-step,
`backward(loss, last)`, `optimizer_step()`, and for checkpoints `full_weights()`, `save_sharded(folder)`, `load(...)`.

    strategy   gradient sync on non-final micro-steps     checkpoint format (model.safetensors: checkpoint.full_weights)
    none       -                                           "full": model.safetensors + optimizer in train_state.pt
    ddp        off (DDP.no_sync)                           "full" as well: every rank holds everything
    fsdp       off (FSDPModule.set_requires_gradient_sync) "dcp": DCP, model and optimizer sharded
    hsdp       as fsdp (2-D mesh: replicate × shard)       "dcp" as well
    deepspeed  DeepSpeed's own (gradient_accumulation)     "deepspeed": DeepSpeed's save_checkpoint
    any, tp>1  as above (ddp: FSDP2 hybrid replication)    "dcp"; the loss is vocab-parallel (`loss_parallel`)

A "dcp" checkpoint resumes under none, ddp and fsdp with any tp (DCP reshards), a "full" one under none and ddp with
tp 1, a "deepspeed" one under deepspeed on the same world size.

DDP and FSDP overlap their gradient all-reduce / reduce-scatter with the backward pass, so that communication is part of
`backward_s`; the `communication` phase is the per-step collective that agrees on the loss and on stopping.
"""

from __future__ import annotations

import contextlib
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import torch
from torch import nn

from dlx.errors import UserError
from dlx.parallel import dcp
from dlx.parallel.context import ContextParallel
from dlx.parallel.distributed import DistEnv
from dlx.parallel.float8 import precompute_float8_scales, weights_gathered_in_float8
from dlx.parallel.tensor import loss_context
from dlx.parallel.traits import STRATEGY_TRAITS, resumed_by
from dlx.precision import Precision

DEEPSPEED_FOLDER, DEEPSPEED_TAG, DCP_FOLDER = "deepspeed", "state", "dcp"


class Strategy:
    """One process (or pure tensor parallelism): no gradient synchronisation across replicas."""

    name = "none"

    def __init__(
        self,
        model: nn.Module,
        train_model: nn.Module,
        optimizer: torch.optim.Optimizer,
        precision: Precision,
        grad_clip: float,
        env: DistEnv,
    ) -> None:
        self.model, self.train_model, self.optimizer = model, train_model, optimizer
        self.precision, self.grad_clip, self.env = precision, grad_clip, env
        self.context: ContextParallel | None = None
        """parallel.cp (or parallel.cp_path): how this rank's part of every sequence is cut and attended; set by
        `dlx.parallel.build`."""

    @property
    def vocab_parallel(self) -> bool:
        """The logits are sharded over the vocabulary (parallel.tp > 1): the loss must be `vocab_parallel_loss`."""
        return self.env.tp > 1

    @property
    def checkpoint_format(self) -> str:
        """ "full" where every rank holds everything, "dcp" where ranks hold shards, or "deepspeed" (see traits)."""
        return STRATEGY_TRAITS[self.name].checkpoint_format_for(self.env.tp)

    def gradient_sync(self, last: bool) -> contextlib.AbstractContextManager:
        """Around one micro-step's forward and backward: gradients are synchronised only on the last one."""
        return contextlib.nullcontext()

    def backward(self, loss: torch.Tensor, last: bool) -> None:
        with loss_context(self.vocab_parallel):
            self.precision.scale(loss).backward()

    def optimizer_step(self) -> torch.Tensor:
        """Unscale (fp16), clip, update, clear gradients; returns the global gradient norm before clipping."""
        params = [p for group in self.optimizer.param_groups for p in group["params"]]
        self.precision.unscale_(self.optimizer)
        if self.grad_clip > 0:
            grad_norm = torch.nn.utils.clip_grad_norm_(params, self.grad_clip)
        else:
            grad_norm = torch.nn.utils.get_total_norm([p.grad for p in params if p.grad is not None])
        self.precision.step(self.optimizer)
        self.zero_grad()
        return _local(grad_norm)

    def zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)

    def full_weights(self) -> dict[str, torch.Tensor] | None:
        """The whole model's weights on rank 0 (None on the others); every rank must call it (a gather when sharded)."""
        if self.checkpoint_format == "full":
            return dict(self.model.state_dict()) if self.env.is_main else None
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        options = StateDictOptions(full_state_dict=True, cpu_offload=True)  # gathered into rank 0's memory
        state = get_model_state_dict(self.model, options=options)
        return state if self.env.is_main else None

    def optimizer_state(self) -> dict[str, Any] | None:
        """For the "full" format: the optimizer state, written by rank 0 into train_state.pt."""
        return self.optimizer.state_dict() if self.checkpoint_format == "full" else None

    def save_sharded(self, folder: Path, background: bool = False) -> Future | None:
        """Each rank writes its share into the checkpoint folder (nothing for the full format). With `background`
        (DCP only) the write goes on after this returns; the future says when it is done."""
        if self.checkpoint_format != "dcp":
            return None
        return dcp.save(self.model, self.optimizer, folder / DCP_FOLDER, background)

    def start_background_saves(self) -> None:
        """checkpoint.async: the writer process started before the first step (DCP; `dcp.start_writer_process`)."""
        if self.checkpoint_format == "dcp":
            dcp.start_writer_process()

    def load(self, path: Path, saved_format: str, weights: dict[str, torch.Tensor], train_state: dict) -> None:
        """A "dcp" checkpoint is resharded into this layout; a "full" one is loaded as it is."""
        if saved_format == "dcp":
            dcp.load(self.model, self.optimizer, path / DCP_FOLDER)
            return
        self.model.load_state_dict(weights, strict=True)
        self.optimizer.load_state_dict(train_state["optimizer"])


class DDPStrategy(Strategy):
    name = "ddp"

    def gradient_sync(self, last: bool) -> contextlib.AbstractContextManager:
        if hasattr(self.model, "set_requires_gradient_sync"):  # tp > 1: replicated by FSDP2's hybrid mode
            self.model.set_requires_gradient_sync(last)
            return contextlib.nullcontext()
        if last or not hasattr(self.train_model, "no_sync"):  # one plain process: nothing to synchronise
            return contextlib.nullcontext()
        return self.train_model.no_sync()


class FSDPStrategy(Strategy):
    """FSDP2: parameters, gradients and optimizer state sharded across ranks; checkpoints through DCP."""

    name = "fsdp"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.float8_gather = weights_gathered_in_float8(self.model)
        """train.float8 tensorwise: FSDP2 all-gathers the converted weights in float8 (dlx.parallel.float8)."""

    def optimizer_step(self) -> torch.Tensor:
        grad_norm = super().optimizer_step()
        if self.float8_gather:
            precompute_float8_scales(self.model)  # the scales the next all-gather casts with
        return grad_norm

    def gradient_sync(self, last: bool) -> contextlib.AbstractContextManager:
        self.model.set_requires_gradient_sync(last)
        return contextlib.nullcontext()


class HSDPStrategy(FSDPStrategy):
    """FSDP2's hybrid sharding: parameters sharded within each group of world ÷ parallel.dp_replicate ranks and
    replicated across the groups (gradients reduce-scattered within, all-reduced across); checkpoints through DCP."""

    name = "hsdp"


class DeepSpeedStrategy(Strategy):
    """DeepSpeed ZeRO 1/2/3: the engine owns accumulation, clipping, mixed precision and its checkpoints."""

    name = "deepspeed"

    def __init__(self, *args: Any, zero_stage: int, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.zero_stage = zero_stage

    @property
    def engine(self) -> Any:
        return self.train_model

    def backward(self, loss: torch.Tensor, last: bool) -> None:
        self.engine.backward(loss, scale_wrt_gas=False)  # the loss is already divided by grad_accum
        if not last:
            self.engine.step()  # DeepSpeed counts micro-steps: off the accumulation boundary this only advances it

    def optimizer_step(self) -> torch.Tensor:
        self.engine.step()  # on the boundary: reduce, clip (gradient_clipping), update, zero the gradients
        norm = self.engine.get_global_grad_norm()
        return torch.as_tensor(float(norm) if norm is not None else float("nan"))

    def zero_grad(self) -> None:
        self.engine.zero_grad()

    def full_weights(self) -> dict[str, torch.Tensor] | None:
        module = self.engine.module
        if self.zero_stage < 3:
            return dict(module.state_dict()) if self.env.is_main else None
        import deepspeed

        with deepspeed.zero.GatheredParameters(list(module.parameters()), modifier_rank=None):
            return {k: v.detach().cpu().clone() for k, v in module.state_dict().items()} if self.env.is_main else None

    def optimizer_state(self) -> dict[str, Any] | None:
        return None

    def save_sharded(self, folder: Path, background: bool = False) -> Future | None:
        self.engine.save_checkpoint(str(folder / DEEPSPEED_FOLDER), tag=DEEPSPEED_TAG, save_latest=False)
        return None

    def load(self, path: Path, saved_format: str, weights: dict[str, torch.Tensor], train_state: dict) -> None:
        with deepspeed_weights_only(self.engine):
            loaded, _ = self.engine.load_checkpoint(
                str(path / DEEPSPEED_FOLDER),
                tag=DEEPSPEED_TAG,
                load_optimizer_states=True,
                load_lr_scheduler_states=False,
                load_module_strict=True,
            )
        if loaded is None:
            raise UserError(f"DeepSpeed could not load {path / DEEPSPEED_FOLDER}; the checkpoint is incomplete")


DEEPSPEED_STATE_CLASSES = (
    ("deepspeed.utils.tensor_fragment", "fragment_address"),
    ("deepspeed.runtime.zero.config", "ZeroStageEnum"),
    ("deepspeed.runtime.fp16.loss_scaler", "LossScaler"),
    ("deepspeed.runtime.fp16.loss_scaler", "DynamicLossScaler"),
)
"""The plain-data classes DeepSpeed's ZeRO state files hold besides tensors; nothing else is unpickled."""


@contextlib.contextmanager
def deepspeed_weights_only(engine: Any):
    """DeepSpeed's checkpoint engine reads with torch.load(weights_only=False); here with weights_only=True, admitting
    only `DEEPSPEED_STATE_CLASSES`. A file that names anything else is refused with a UserError, and nothing runs."""
    checkpoint_engine = engine.checkpoint_engine

    def load(path: str, map_location: Any = None) -> Any:
        return load_deepspeed_file(Path(path), map_location)

    checkpoint_engine.load = load
    try:
        yield
    finally:
        del checkpoint_engine.load  # the class's own method again


def load_deepspeed_file(path: Path, map_location: Any = None, mmap: bool = False) -> Any:
    """One DeepSpeed state file through torch.load(weights_only=True) admitting `DEEPSPEED_STATE_CLASSES`; UserError
    naming the file and what it refused. `mmap`: tensor data is mapped, not read (to check a file's pickle only)."""
    import importlib

    allowed = [getattr(importlib.import_module(module), name) for module, name in DEEPSPEED_STATE_CLASSES]
    try:
        with torch.serialization.safe_globals(allowed):
            return torch.load(path, map_location=map_location, weights_only=True, mmap=mmap)
    except Exception as e:  # weights_only's UnpicklingError names the refused global
        reason = dcp.weights_only_refusal(e)
        raise UserError(f"{path} refused by torch.load(weights_only=True): {reason}") from None


def check_deepspeed_files(folder: Path) -> None:
    """Every state file of a DeepSpeed checkpoint unpickled as `load_deepspeed_file` will at load (tensor data mapped,
    not read), so that one rank finds a refused file before the ranks enter DeepSpeed's collective load together.
    Nothing to check where DeepSpeed is not installed: then nothing reads the files."""
    try:
        import deepspeed  # noqa: F401
    except ImportError:
        return
    for path in sorted(folder.rglob("*.pt")):
        load_deepspeed_file(path, "cpu", mmap=True)


def _local(norm: torch.Tensor) -> torch.Tensor:
    """FSDP's norm is a DTensor (already reduced over all ranks): its full value as a plain tensor."""
    return norm.full_tensor() if hasattr(norm, "full_tensor") else norm


def check_format(saved_format: str, saved_world_size: int, strategy: Strategy, world_size: int, path: Path) -> None:
    """Which strategies and layouts a checkpoint resumes under (see the table above)."""
    allowed = resumed_by(saved_format)
    if strategy.name not in allowed:
        writers = " or ".join(allowed) or saved_format
        raise UserError(
            f"checkpoint {path} was written by parallel.strategy {writers} ({saved_format} format), not "
            f"{strategy.name}; resume with --parallel.strategy {writers}"
        )
    if saved_format == "full" and strategy.env.tp > 1:
        raise UserError(
            f"checkpoint {path} holds whole weights and optimizer state (parallel.tp 1, full format) and this run has "
            f"parallel.tp {strategy.env.tp}; resume with --parallel.tp 1"
        )
    if saved_format == "deepspeed" and saved_world_size != world_size:
        raise UserError(
            f"checkpoint {path} was written by {saved_world_size} DeepSpeed ranks and this run has {world_size}; "
            f"resume on {saved_world_size} ranks (dlx reshards DDP and FSDP checkpoints, not ZeRO ones)"
        )
