"""The recipe's `parallel` section: how the ranks torchrun starts share the work."""

from __future__ import annotations

import os
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationInfo, model_validator


class ParallelConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, validate_assignment=True)

    strategy: Literal["auto", "none", "ddp", "fsdp", "hsdp", "deepspeed"] = "auto"
    """Data parallelism: none (one process, or pure TP), ddp, fsdp (FSDP2), hsdp (FSDP2 hybrid), deepspeed; auto."""
    dp_replicate: int = Field(1, ge=1, le=65536)
    """hsdp: replicas of the model (e.g. nodes), each sharded over world ÷ dp_replicate ranks."""
    cp: int = Field(1, ge=1, le=1024)
    """Context-parallel ranks per sequence: each holds 1/cp of every sequence (chunks i and 2·cp−1−i of 2·cp)."""
    cp_path: bool = False
    """Run the context-parallel code path (split, key/value gather, loss weight) also at cp 1: its overhead."""
    tp: int = Field(1, ge=1, le=1024)
    """Tensor-parallel ranks per model replica (Megatron-style column/row-parallel blocks, vocab-parallel head)."""
    zero_stage: int = Field(2, ge=1, le=3)
    """DeepSpeed ZeRO stage: 1 shards optimizer state, 2 also gradients, 3 also weights (strategy deepspeed)."""
    activation_checkpointing: Literal["none", "full", "selective"] = "none"
    """Recompute activations in backward: none, every block (full), or every other block (selective)."""
    reshard_after_forward: bool = True
    """FSDP: free the gathered weights after forward (ZeRO-3 style); false keeps them until backward (ZeRO-2 style)."""
    timeout_s: float = Field(600.0, gt=0, le=86400)
    """Seconds a rank waits for the others in a collective before it fails instead of hanging."""
    _auto: str | None = PrivateAttr(default=None)

    @model_validator(mode="after")
    def _resolve_auto(self, info: ValidationInfo) -> ParallelConfig:
        """strategy auto becomes what the rank count needs (`auto_strategy`); `auto_note` says why."""
        if self.strategy == "auto":
            world = (info.context or {}).get("world_size") or int(os.environ.get("WORLD_SIZE", "1"))
            strategy, why = auto_strategy(world, self.tp, self.cp, self.dp_replicate)
            object.__setattr__(self, "strategy", strategy)
            self._auto = why
        return self

    @property
    def auto_note(self) -> str | None:
        """Why parallel.strategy auto became this strategy; None when the recipe named it."""
        return self._auto


def auto_strategy(world_size: int, tp: int, cp: int, dp_replicate: int) -> tuple[str, str]:
    """parallel.strategy auto: none for one process or pure tensor parallelism, hsdp when dp_replicate asks for
    replicas, fsdp when tensor parallelism also has data-parallel or context-parallel ranks, else ddp; and why."""
    replicas = world_size // max(1, tp * cp)
    if world_size <= 1:
        return "none", "one process"
    if dp_replicate > 1:
        return "hsdp", f"parallel.dp_replicate {dp_replicate} replicas of {world_size} ranks"
    if tp > 1:
        if replicas == 1 and cp == 1:
            return "none", f"{world_size} ranks of tensor parallelism alone"
        return "fsdp", f"{world_size} ranks: tensor parallelism with {replicas} data-parallel and {cp} cp ranks"
    what = f"{replicas} data-parallel" + (f" × {cp} context-parallel" if cp > 1 else "")
    return "ddp", f"{world_size} ranks: {what}"


CP_KERNELS = ("default", "efficient", "math")
"""train.attention settings context parallelism runs under: SDPA kernels that take a boolean mask."""


def sequence_problem(cp: int, cp_path: bool, seq_len: int, attention: str, document_mask: bool = False) -> str | None:
    """What parallel.cp cannot take in data.seq_len and train.attention, as one line; None if nothing. A mask is
    always made at cp > 1, and with document masks at cp 1 (parallel.cp_path); train.attention auto then leaves the
    kernel to SDPA, which picks one that takes the mask."""
    if cp == 1 and not cp_path:
        return None
    if seq_len % (2 * cp):
        return (
            f"data.seq_len {seq_len} does not split into 2 × parallel.cp = {2 * cp} equal chunks; pick a seq_len "
            f"divisible by {2 * cp}"
        )
    if attention == "flex" or ((cp > 1 or document_mask) and attention not in (*CP_KERNELS, "auto")):
        return (
            f"train.attention {attention} cannot run context parallelism's attention (SDPA with a boolean mask, "
            f"which the flash and cuDNN kernels refuse; flex is not wired for it): set train.attention "
            f"{', '.join(CP_KERNELS)}"
        )
    return None
