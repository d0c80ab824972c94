"""What differs between one process, DDP, FSDP2 and DeepSpeed in a training step and in a checkpoint.

The step loop calls the same five things whatever the strategy: `gradient_sync(last)` around each micro-step,
`backward(loss, last)`, `optimizer_step()`, and for checkpoints `full_weights()`, `save_sharded(folder)`, `load(...)`.

    strategy   gradient sync on non-final micro-steps     checkpoint (besides model.safetensors, always full)
    none       -                                           optimizer state in train_state.pt ("full")
    ddp        off (DDP.no_sync)                           the same ("full"): every rank holds everything
    fsdp       off (FSDPModule.set_requires_gradient_sync) DCP, sharded: model and optimizer ("dcp")
    deepspeed  DeepSpeed's own (gradient_accumulation)     DeepSpeed's save_checkpoint ("deepspeed")

DDP and FSDP overlap their gradient all-reduce / reduce-scatter with the backward pass, so that communication is part of
`backward_s`; the `communication` phase is the per-step collective that agrees on the loss and on stopping.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import torch
from torch import nn

from dlx.errors import UserError
from dlx.parallel.distributed import DistEnv
from dlx.precision import Precision

FORMAT_STRATEGIES = {"full": ("none", "ddp"), "dcp": ("fsdp",), "deepspeed": ("deepspeed",)}
DEEPSPEED_FOLDER, DEEPSPEED_TAG, DCP_FOLDER = "deepspeed", "state", "dcp"


class Strategy:
    """One process, or DDP: every rank holds the whole model and the whole optimizer state."""

    name = "none"
    checkpoint_format = "full"

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

    def gradient_sync(self, last: bool) -> contextlib.AbstractContextManager:
        """Around one micro-step's forward and backward: gradients are synchronised only on the last one."""
        return contextlib.nullcontext()

    def backward(self, loss: torch.Tensor, last: bool) -> None:
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
        """The whole model's weights on rank 0 (None on the others); every rank must call it."""
        return dict(self.model.state_dict()) if self.env.is_main else None

    def optimizer_state(self) -> dict[str, Any] | None:
        """For the "full" format: the optimizer state, written by rank 0 into train_state.pt."""
        return self.optimizer.state_dict()

    def save_sharded(self, folder: Path) -> None:
        """Each rank writes its share into the checkpoint folder (nothing for the full format)."""

    def load(self, path: Path, weights: dict[str, torch.Tensor], train_state: dict[str, Any]) -> None:
        self.model.load_state_dict(weights, strict=True)
        self.optimizer.load_state_dict(train_state["optimizer"])


class DDPStrategy(Strategy):
    name = "ddp"

    def gradient_sync(self, last: bool) -> contextlib.AbstractContextManager:
        if last or not hasattr(self.train_model, "no_sync"):  # one plain process: nothing to synchronise
            return contextlib.nullcontext()
        return self.train_model.no_sync()


class FSDPStrategy(Strategy):
    """FSDP2: parameters, gradients and optimizer state sharded across ranks; checkpoints through DCP."""

    name = "fsdp"
    checkpoint_format = "dcp"

    def gradient_sync(self, last: bool) -> contextlib.AbstractContextManager:
        self.model.set_requires_gradient_sync(last)
        return contextlib.nullcontext()

    def full_weights(self) -> dict[str, torch.Tensor] | None:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        options = StateDictOptions(full_state_dict=True, cpu_offload=True)  # gathered into rank 0's memory
        state = get_model_state_dict(self.model, options=options)
        return state if self.env.is_main else None

    def optimizer_state(self) -> dict[str, Any] | None:
        return None

    def save_sharded(self, folder: Path) -> None:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict

        model_state, optim_state = get_state_dict(self.model, self.optimizer)
        dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=folder / DCP_FOLDER)

    def load(self, path: Path, weights: dict[str, torch.Tensor], train_state: dict[str, Any]) -> None:
        """DCP reshards on load: a checkpoint saved by N ranks loads on M."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

        model_state, optim_state = get_state_dict(self.model, self.optimizer)
        state = {"model": model_state, "optim": optim_state}
        dcp.load(state, checkpoint_id=path / DCP_FOLDER)
        set_state_dict(self.model, self.optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])


class DeepSpeedStrategy(Strategy):
    """DeepSpeed ZeRO 1/2/3: the engine owns accumulation, clipping, mixed precision and its checkpoints."""

    name = "deepspeed"
    checkpoint_format = "deepspeed"

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

    def save_sharded(self, folder: Path) -> None:
        self.engine.save_checkpoint(str(folder / DEEPSPEED_FOLDER), tag=DEEPSPEED_TAG, save_latest=False)

    def load(self, path: Path, weights: dict[str, torch.Tensor], train_state: dict[str, Any]) -> None:
        loaded, _ = self.engine.load_checkpoint(
            str(path / DEEPSPEED_FOLDER),
            tag=DEEPSPEED_TAG,
            load_optimizer_states=True,
            load_lr_scheduler_states=False,
            load_module_strict=True,
        )
        if loaded is None:
            raise UserError(f"DeepSpeed could not load {path / DEEPSPEED_FOLDER}; the checkpoint is incomplete")


def _local(norm: torch.Tensor) -> torch.Tensor:
    """FSDP's norm is a DTensor (already reduced over all ranks): its full value as a plain tensor."""
    return norm.full_tensor() if hasattr(norm, "full_tensor") else norm


def check_format(saved_format: str, saved_world_size: int, strategy: Strategy, world_size: int, path: Path) -> None:
    """A checkpoint resumes under the strategy family that wrote it; ZeRO checkpoints also need the same world size."""
    allowed = FORMAT_STRATEGIES.get(saved_format, ())
    if strategy.name not in allowed:
        writers = " or ".join(allowed) or saved_format
        raise UserError(
            f"checkpoint {path} was written by parallel.strategy {writers} ({saved_format} format), not "
            f"{strategy.name}; resume with --parallel.strategy {writers}"
        )
    if saved_format == "deepspeed" and saved_world_size != world_size:
        raise UserError(
            f"checkpoint {path} was written by {saved_world_size} DeepSpeed ranks and this run has {world_size}; "
            f"resume on {saved_world_size} ranks (dlx reshards DDP and FSDP checkpoints, not ZeRO ones)"
        )
