"""What each `parallel.strategy` implies, decided here once: the trainer, the run's assembly, the recipe's checks,
preflight, the planner (`dlx plan`), `dlx bench` and the strategy builder read this table, not the strategy's name.

    strategy   group          precision  sharded (ZeRO stage)   checkpoint (tp 1)  resumes    tp>1  fp16  nan skip  fp8
    none       with torchrun  dlx's      0                      full               full, dcp  yes   yes   yes       yes
    ddp        with torchrun  dlx's      0 (+ gradient buckets) full               full, dcp  yes   yes   yes       yes
    fsdp       always         dlx's      3                      dcp                dcp        yes   no    yes       yes
    hsdp       always         dlx's      3 (within a replica)   dcp                dcp        no    no    yes       yes
    deepspeed  always         engine's   parallel.zero_stage    deepspeed          deepspeed  no    yes   no        no

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
    runs_float8: bool
    """Trains float8 linears (train.float8, torchao) with parallel.tp 1."""
    benched: bool
    """`dlx bench` measures it."""
    package: str | None
    """A package it needs that dlx does not install by default (checked before anything is written)."""
    fixed_grad_accum: bool = False
    """Counts the micro-batches of a step itself (DeepSpeed's gradient_accumulation_steps), so every stage of
    data.stages keeps train.grad_accum."""

    def checkpoint_format_for(self, tp: int) -> str:
        return "dcp" if tp > 1 else self.checkpoint_format


_FULL = {"checkpoint_format": "full", "resumes": ("full", "dcp"), "supports_tp": True, "trains_fp16": True}
_DLX_RUN = {"owns_precision": False, "sharding_stage": 0, "skips_nan_steps": True, "runs_float8": True, "benched": True}
_SHARDED = {
    "always_grouped": True,
    "owns_precision": False,
    "sharding_stage": 3,
    "gradient_buckets": False,
    "checkpoint_format": "dcp",
    "resumes": ("dcp",),
    "trains_fp16": False,
    "skips_nan_steps": True,
    "runs_float8": True,
    "benched": True,
    "package": None,
}
_STRATEGIES = (
    StrategyTraits("none", always_grouped=False, gradient_buckets=False, package=None, **_FULL, **_DLX_RUN),
    StrategyTraits("ddp", always_grouped=False, gradient_buckets=True, package=None, **_FULL, **_DLX_RUN),
    StrategyTraits("fsdp", supports_tp=True, **_SHARDED),
    StrategyTraits("hsdp", supports_tp=False, **_SHARDED),  # tp joins fsdp's mesh, not hsdp's 2-D one
    StrategyTraits(
        "deepspeed",
        always_grouped=True,
        owns_precision=True,
        sharding_stage=None,
        gradient_buckets=False,
        checkpoint_format="deepspeed",
        resumes=("deepspeed",),
        supports_tp=False,
        trains_fp16=True,
        skips_nan_steps=False,
        runs_float8=False,
        benched=False,
        package="deepspeed",
        fixed_grad_accum=True,
    ),
)
"""One per strategy, every trait named (the module docstring's table, in words)."""
STRATEGY_TRAITS = {traits.name: traits for traits in _STRATEGIES}
"""Every parallel.strategy by name."""


def resumed_by(checkpoint_format: str) -> tuple[str, ...]:
    """The strategies that resume from a checkpoint of this format."""
    return tuple(name for name, traits in STRATEGY_TRAITS.items() if checkpoint_format in traits.resumes)
