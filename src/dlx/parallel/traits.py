"""What each `parallel.strategy` implies, decided here once: the trainer, the run's assembly, the recipe's checks,
preflight, the planner (`dlx plan`), `dlx bench` and the strategy builder read this table, not the strategy's name.

    strategy   process group  precision  sharded (ZeRO stage)  checkpoint (tp 1)  resumes from   tp > 1  fp16  nan skip
    none       with torchrun  dlx's      0                     full               full, dcp      yes     yes   yes
    ddp        with torchrun  dlx's      0 (+ gradient buckets) full              full, dcp      yes     yes   yes
    fsdp       always         dlx's      3                     dcp                dcp            yes     no    yes
    hsdp       always         dlx's      3 (within a replica)  dcp                dcp            no      no    yes
    deepspeed  always         engine's   parallel.zero_stage   deepspeed          deepspeed      no      yes   no

Any strategy with parallel.tp > 1 writes "dcp" checkpoints (DCP reshards them across layouts).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class StrategyTraits:
    name: str
    """The `parallel.strategy` value."""
    always_grouped: bool
    """Needs a process group even in one process (FSDP2 and DeepSpeed run collectives); else only under torchrun."""
    owns_precision: bool
    """The engine runs mixed precision and loss scaling itself; dlx's `Precision` only sets the dtype."""
    sharding_stage: int | None
    """What it shards across data-parallel ranks, as a ZeRO stage (0 nothing, 1 optimizer state, 2 and gradients,
    3 and weights); None: parallel.zero_stage says."""
    gradient_buckets: bool
    """Keeps a second fp32 copy of the gradients (DDP's all-reduce buckets) when parallel.tp is 1."""
    checkpoint_format: str
    """What its checkpoints are with parallel.tp 1: "full" (model.safetensors + train_state.pt), "dcp" (sharded) or
    "deepspeed" (the engine's own)."""
    resumes: tuple[str, ...]
    """The checkpoint formats a run under it resumes from."""
    supports_tp: bool
    """Combines with parallel.tp > 1."""
    trains_fp16: bool
    """Trains in fp16 (with a loss scaler)."""
    skips_nan_steps: bool
    """Can drop a step's update for a non-finite loss (train.nan_policy skip)."""
    benched: bool
    """`dlx bench` measures it."""
    package: str | None
    """A package it needs that dlx does not install by default (checked before anything is written)."""

    def checkpoint_format_for(self, tp: int) -> str:
        return "dcp" if tp > 1 else self.checkpoint_format


_ROWS = (
    # name, always_grouped, owns_precision, sharding_stage, gradient_buckets, checkpoint_format, resumes,
    # supports_tp, trains_fp16, skips_nan_steps, benched, package
    ("none", False, False, 0, False, "full", ("full", "dcp"), True, True, True, True, None),
    ("ddp", False, False, 0, True, "full", ("full", "dcp"), True, True, True, True, None),
    ("fsdp", True, False, 3, False, "dcp", ("dcp",), True, False, True, True, None),
    ("hsdp", True, False, 3, False, "dcp", ("dcp",), False, False, True, True, None),
    ("deepspeed", True, True, None, False, "deepspeed", ("deepspeed",), False, True, False, False, "deepspeed"),
)
"""One row per strategy, in StrategyTraits' field order (the module docstring's table, in words)."""
STRATEGY_TRAITS = {row[0]: StrategyTraits(*row) for row in _ROWS}
"""Every parallel.strategy by name."""


def resumed_by(checkpoint_format: str) -> tuple[str, ...]:
    """The strategies that resume from a checkpoint of this format."""
    return tuple(name for name, traits in STRATEGY_TRAITS.items() if checkpoint_format in traits.resumes)
