"""`dlx tune`'s candidates before anything is measured: each layout validated as a recipe, dropped when `dlx plan`'s
estimate with the stated margin does not fit, and the rest priced by the time model.

The memory rule: a layout is admitted when `estimate × (1 + margin) + fixed + baseline ≤ budget`. The budget is
--memory-limit-gb, else the device's memory (a GPU's total, a CPU's available memory). The margin covers what the
estimate leaves out: on CUDA the allocator's slack (10 %); on a CPU, where the measured peak is the process's resident
set, glibc's heaps that keep freed memory (measured 14-46 % above the tensors: BENCHMARKS.md, Memory estimate), so
60 %, and a fixed 0.3 GB that a training step adds to the resident set whatever the model (autograd's graph, the
thread pools, the loader; measured 0.15 GB for the debug model). The baseline is what the process holds before the
first layout is built (the CPU's resident set: Python, torch and whatever ran before; on CUDA the memory already
allocated).
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from typing import Any

import torch

from dlx import device as dev
from dlx.bench.tune.space import Layout, layout_recipe
from dlx.bench.tune.time_model import LayoutCost, training_shape
from dlx.bench.tune.whole_run import RunCost
from dlx.errors import UserError
from dlx.metrics.estimate import plan_memory
from dlx.parallel.tensor import check_layout
from dlx.parallel.traits import STRATEGY_TRAITS
from dlx.train.config import RunConfig, build_config

MARGIN = {"cuda": 0.10, "cpu": 0.60}
"""The share added to `dlx plan`'s estimate before it is compared with the budget, per device type."""
FIXED_GB = {"cuda": 0.0, "cpu": 0.3}
"""What a step adds besides the estimate's tensors whatever the model, per device type."""


@dataclass
class Candidate:
    layout: Layout
    estimate_gb: float | None = None
    """`dlx plan`'s peak per rank for the layout (live tensors)."""
    drop: str | None = None
    """Why it was not measured or not chosen; None while it is in the running."""
    cost: LayoutCost | None = None
    predicted_step_s: float | None = None
    predicted_before_s: float | None = None
    """The prediction the model made just before the layout was measured (not fitted to its own measurement)."""
    record: dict[str, Any] | None = None
    """The measured ThroughputMeter record (step_s, tokens_per_s, mfu, peak_mem_gb)."""
    config: RunConfig | None = field(default=None, repr=False)
    run: RunCost | None = None
    """The whole run with this layout (`dlx.bench.tune.whole_run`): from its measurement once measured."""
    predicted_run_before_s: float | None = None
    """The whole run predicted just before the layout was measured."""
    impossible: bool = False
    """The recipe refuses the layout at this world size: not listed."""
    is_recipe: bool = False
    """The layout the recipe sets itself: measured first, so that the winner is never a run slower than it."""

    @property
    def measured_step_s(self) -> float | None:
        return None if self.record is None else float(self.record["step_s"])


@dataclass(frozen=True)
class MemoryRule:
    budget_gb: float
    margin: float
    fixed_gb: float
    baseline_gb: float

    def fits(self, estimate_gb: float) -> bool:
        return estimate_gb * (1 + self.margin) + self.fixed_gb + self.baseline_gb <= self.budget_gb

    def describe(self) -> str:
        return (
            f"estimate × {1 + self.margin:.2f} + {self.fixed_gb:.2f} GB + {self.baseline_gb:.2f} GB already held "
            f"≤ {self.budget_gb:.2f} GB"
        )


def memory_rule(device: torch.device, limit_gb: float | None, margin: float | None) -> MemoryRule:
    """The budget, margin and baseline for this device (see the module docstring)."""
    if limit_gb is not None and limit_gb <= 0:
        raise UserError(f"--memory-limit-gb must be positive, got {limit_gb}")
    budget = limit_gb if limit_gb is not None else dev.memory_budget_gb(device)
    baseline = dev.memory_in_use_gb(device)
    chosen = MARGIN.get(device.type, 0.6) if margin is None else margin
    return MemoryRule(budget, chosen, FIXED_GB.get(device.type, 0.3), baseline)


def admit(
    raw: dict[str, Any],
    layouts: list[Layout],
    base: RunConfig,
    world_size: int,
    device: torch.device,
    precision: str,
    rule: MemoryRule,
) -> list[Candidate]:
    """Every layout as a candidate; those the recipe refuses or the memory rule does not admit carry `drop`. `base`:
    the recipe as loaded, whose model (and model.init_from's weights, read once) every layout shares."""
    candidates, args = [], base.model.args
    for layout in layouts:
        candidate = Candidate(layout)
        try:
            candidate.config = build_config(layout_recipe(raw, layout), base.model.init)
            check_layout(candidate.config.parallel, world_size)
        except UserError as e:
            candidate.drop = str(e).removeprefix("recipe: ")
            candidate.impossible = True
            candidates.append(candidate)
            continue
        candidate.drop = missing_package(layout.strategy)
        seq_len = candidate.config.data.seq_len
        device_type = "cpu" if device.type == "cpu" else "cuda"
        shape = training_shape(layout, seq_len, precision, world_size, device_type)
        candidate.estimate_gb = plan_memory(args, shape).total_gb
        if candidate.drop is None and not rule.fits(candidate.estimate_gb):
            candidate.drop = f"does not fit: estimate {candidate.estimate_gb:.2f} GB; needs {rule.describe()}"
        candidates.append(candidate)
    return candidates


def missing_package(strategy: str) -> str | None:
    package = STRATEGY_TRAITS[strategy].package
    if package is None or importlib.util.find_spec(package) is not None:
        return None
    return f"parallel.strategy {strategy} needs {package}, which is not installed (pip install 'dlx[{package}]')"


def check_some_fit(candidates: list[Candidate], global_batch: int, seq_len: int, rule: MemoryRule) -> None:
    """One line when no layout reaches the global batch within memory (or the recipe refuses them all)."""
    if any(c.drop is None for c in candidates):
        return
    estimated = [c for c in candidates if c.estimate_gb is not None]
    if not estimated:
        reason = candidates[0].drop if candidates else "no layout"
        raise UserError(f"no layout reaches the global batch of {global_batch} sequences: {reason}")
    smallest = min(estimated, key=lambda c: c.estimate_gb or 0.0)
    raise UserError(
        f"no layout reaches the global batch of {global_batch} sequences of {seq_len} tokens within memory: the "
        f"smallest estimate is {smallest.estimate_gb:.2f} GB ({smallest.layout.label()}) and admission needs "
        f"{rule.describe()}; shorten data.seq_len, add ranks (--world-size) or raise --memory-limit-gb"
    )


def mark_recipe(candidates: list[Candidate], base: RunConfig, searched_attention: tuple[str, ...]) -> None:
    """The candidate whose layout is the recipe's own (train.attention auto, where the device's search has no auto,
    is SDPA's own choice: default)."""
    attention = base.train.attention
    if attention == "auto" and "auto" not in searched_attention:
        attention = "default"
    own = {
        "strategy": base.parallel.strategy,
        "tp": base.parallel.tp,
        "cp": base.parallel.cp,
        "activation_checkpointing": base.parallel.activation_checkpointing,
        "micro_batch_size": base.data.micro_batch_size,
        "compile": base.train.compile,
        "float8": base.train.float8,
        "attention": attention,
    }
    for c in candidates:  # at the recipe's global batch, its micro-batch sets its accumulation too
        values = c.layout.as_dict()
        c.is_recipe = c.config is not None and all(values[key] == value for key, value in own.items())
