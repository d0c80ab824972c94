"""The recipe's `parallel` section: how the ranks torchrun starts share the work."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class ParallelConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, validate_assignment=True)

    strategy: Literal["none", "ddp", "fsdp", "hsdp", "deepspeed"] = "none"
    """Data parallelism: none (one process, or pure TP), ddp, fsdp (FSDP2), hsdp (FSDP2 hybrid) or deepspeed."""
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


CP_KERNELS = ("default", "efficient", "math")
"""train.attention settings context parallelism runs under: SDPA kernels that take a boolean mask."""


def sequence_problem(cp: int, cp_path: bool, seq_len: int, attention: str, document_mask: bool = False) -> str | None:
    """What parallel.cp cannot take in data.seq_len and train.attention, as one line; None if nothing. A mask is
    always made at cp > 1, and with document masks at cp 1 (parallel.cp_path)."""
    if cp == 1 and not cp_path:
        return None
    if seq_len % (2 * cp):
        return (
            f"data.seq_len {seq_len} does not split into 2 × parallel.cp = {2 * cp} equal chunks; pick a seq_len "
            f"divisible by {2 * cp}"
        )
    if attention == "flex" or ((cp > 1 or document_mask) and attention not in CP_KERNELS):
        return (
            f"train.attention {attention} cannot run context parallelism's attention (SDPA with a boolean mask, "
            f"which the flash and cuDNN kernels refuse; flex is not wired for it): set train.attention "
            f"{', '.join(CP_KERNELS)}"
        )
    return None
