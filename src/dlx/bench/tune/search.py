"""`dlx tune`: the fastest layout of a recipe that fits, chosen by measuring.

1. The layouts the recipe allows (`tune_space`), each validated as a recipe; those `dlx plan` says do not fit with
   the stated margin are dropped unmeasured (`tune_select`): no layout is tried to see whether it runs out of memory.
2. The rest are ranked by their whole run (`dlx.bench.tune.whole_run`: the recipe's steps, evaluations, task
   evaluations, saves and the compile warm-up), each step priced by the time model (`time_model`) from rates measured
   here (`rates`).
3. The best predicted is measured (`dlx.bench.measure.measure_config`: the real step, warm-up excluded, with its
   first step, validation batches and, compiled, a warm restart), the model is refitted on every measured layout,
   the rest re-ranked, and the next best measured, until the budget would run out or the next prediction is slower
   than the best measurement by more than `STOP_MARGIN` (after `MIN_MEASURED`).
4. The winner: the measured layout whose whole run is shortest (the best predicted one where nothing could be
   measured).

Ranks: without torchrun `dlx tune` measures in one process, so it measures only for --world-size 1; for a larger
world size it ranks by the model alone (nothing measured) unless it runs under torchrun with that many ranks, where
every rank measures each layout together and rank 0's results decide for all.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from dlx.bench.measure import measure_config
from dlx.bench.tune.rates import measure_attention, measure_rates
from dlx.bench.tune.select import Candidate, MemoryRule, admit, check_some_fit, mark_recipe, memory_rule
from dlx.bench.tune.space import (
    ATTENTION_BY_DEVICE,
    SearchSpace,
    context_parallel_sizes,
    enumerate_layouts,
    global_batch_of,
    keep_values,
    tensor_parallel_sizes,
)
from dlx.bench.tune.time_model import Rates, TimeModel, calibrate, layout_cost
from dlx.bench.tune.whole_run import EVAL_SAMPLE, RunContext, RunShape, SharedCosts, base_costs, recipe_shape, run_cost
from dlx.data import SYNTHETIC
from dlx.device import float8_capability, training_device
from dlx.errors import UserError
from dlx.model.args import ModelArgs
from dlx.parallel import distributed
from dlx.parallel.config import auto_strategy
from dlx.parallel.traits import STRATEGY_TRAITS
from dlx.precision import resolve_precision
from dlx.train.config import RunConfig
from dlx.train.recipe import apply_overrides, load_recipe, parse_overrides, read_recipe_file

STOP_MARGIN = 0.05
"""Stop once the best unmeasured prediction is this much slower than the best measured step."""
MIN_MEASURED = 3
"""Layouts measured before that stop may apply (the model's calibration points)."""
SETUP_S = {"cpu": 3.0, "cuda": 20.0}
"""A measurement's cost besides its steps before one has been timed: model, strategy and loader built."""
COMPILE_S = {"cpu": 60.0, "cuda": 60.0}
"""What torch.compile adds to a measurement before one has been timed."""
SAFETY = 2.0
"""The predicted steps' share of a measurement's expected time is doubled: on a shared machine a measurement runs
slower than the rates measured at the start say, and the last one must still end within the budget."""


@dataclass(frozen=True)
class TuneSettings:
    recipe: str
    overrides: tuple[str, ...] = ()
    world_size: int | None = None
    """Ranks the layouts are for; default: torchrun's world size (1 without torchrun)."""
    budget_s: float = 300.0
    memory_limit_gb: float | None = None
    margin: float | None = None
    keep: tuple[str, ...] = ()
    warmup: int = 2
    steps: int = 3
    link_gbps: float | None = None
    max_measured: int = 12
    save_folder: str = "runs"
    """Where a save is timed (the run folder's disk)."""


@dataclass
class TuneResult:
    raw: dict[str, Any]
    """The recipe mapping (file and overrides) the layouts were set on."""
    candidates: list[Candidate]
    winner: Candidate
    model: TimeModel
    rates: Rates
    rule: MemoryRule
    world_size: int
    global_batch: int
    seq_len: int
    precision: str
    device: str
    measured: bool
    """False: ranked by the model alone (see the module docstring)."""
    elapsed_s: float
    args: ModelArgs
    shape: RunShape | None = None
    """The recipe's run (None when its length is unknown: no train.max_steps and no dataset here)."""
    shared: SharedCosts | None = None


def run_tune(settings: TuneSettings, progress: Callable[[str, float], None] | None = None) -> TuneResult:
    """Enumerate, prune, rank, measure; `progress(label, elapsed_s)` before each measurement."""
    start = time.monotonic()
    raw = apply_overrides(read_recipe_file(settings.recipe), parse_overrides(list(settings.overrides)))
    base = load_recipe(settings.recipe, list(settings.overrides))
    launched = distributed.env_from_torchrun()
    world_size = settings.world_size or launched.world_size
    if world_size < 1:
        raise UserError(f"--world-size must be at least 1, got {world_size}")
    measuring = world_size == launched.world_size
    device = training_device(base.train.device, launched.local_rank, launched.world_size, "train.device")
    if launched.world_size > 1:  # every rank measures each layout together; rank 0 decides
        distributed.init_distributed(device, True, timeout_s=600.0)
    try:
        return tune_on(settings, raw, base, world_size, measuring, device, start, progress)
    finally:
        distributed.teardown()


def tune_on(
    settings: TuneSettings,
    raw: dict[str, Any],
    base: RunConfig,
    world_size: int,
    measuring: bool,
    device: torch.device,
    start: float,
    progress: Callable[[str, float], None] | None,
) -> TuneResult:
    """`run_tune` once the recipe, the device and (under torchrun) the group are set up."""
    precision = resolve_precision(base.train.precision, device)
    global_batch = global_batch_of(raw, world_size)
    candidates, rule = candidates_of(settings, raw, base, world_size, global_batch, device, precision)
    check_some_fit(candidates, global_batch, base.data.seq_len, rule)
    admitted = [c for c in candidates if c.drop is None]
    seq_len = base.data.seq_len
    keys = {("float8" if c.layout.float8 else precision, c.layout.tokens_per_micro(seq_len)) for c in admitted}
    rates = measure_rates(base.model.args, device, keys, settings.link_gbps)
    calls = {(c.layout.attention, c.layout.micro_batch) for c in admitted}
    attention_s = measure_attention(base.model.args, device, base.data.seq_len, precision, calls)
    rates = replace(rates, attention_s=attention_s)
    for c in admitted:
        c.cost = layout_cost(base.model.args, c.layout, base.data.seq_len, precision, world_size, rates)
    run = RunContext(recipe_shape(base, world_size), base_costs(base, device, Path(settings.save_folder)))
    model = reprice(admitted, TimeModel(), run)
    if measuring:
        check_budget(settings, admitted, device, start)
        model = measure_best(settings, admitted, device, start, progress, run)
    winner = pick_winner(admitted, measuring)
    listed = [c for c in candidates if not c.impossible]
    return TuneResult(
        raw, listed, winner, model, rates, rule, world_size, global_batch, base.data.seq_len, precision,
        str(device), measuring, time.monotonic() - start, base.model.args, run.shape, run.shared,
    )  # fmt: skip


def candidates_of(
    settings: TuneSettings,
    raw: dict[str, Any],
    base: RunConfig,
    world_size: int,
    global_batch: int,
    device: torch.device,
    precision: str,
) -> tuple[list[Candidate], MemoryRule]:
    """Every layout of the recipe's space (those --keep holds at the recipe's value), validated and memory-checked."""
    args = base.model.args
    # A CPU's float8 matmul (torch._scaled_mm) is a reference kernel, slower than bf16 by orders: not searched there.
    has_float8 = device.type == "cuda" and precision == "bf16" and float8_capability(device) is None
    cps = context_parallel_sizes(world_size, base.data.seq_len)
    space = SearchSpace(
        world_size=world_size,
        global_batch=global_batch,
        tps=tensor_parallel_sizes(args, world_size, global_batch, cps),
        cps=cps,
        float8=(False, True) if has_float8 else (False,),
        attention=ATTENTION_BY_DEVICE.get(device.type, ("auto",)),
    )
    kept = keep_values(raw, settings.keep)
    if kept.get("parallel.strategy") == "auto":  # what the recipe's auto becomes at this world size
        parallel = raw.get("parallel") or {}
        tp, cp = (int(kept.get(f"parallel.{key}", parallel.get(key, 1))) for key in ("tp", "cp"))
        kept["parallel.strategy"] = auto_strategy(world_size, tp, cp, int(parallel.get("dp_replicate", 1)))[0]
    space = replace(  # a kept value outside the device's own choices (train.attention auto on a CPU) is searched
        space,
        attention=(kept["train.attention"],) if "train.attention" in kept else space.attention,
        float8=(kept["train.float8"],) if "train.float8" in kept else space.float8,
        kept_strategy=kept.get("parallel.strategy"),
        cps=(kept["parallel.cp"],) if "parallel.cp" in kept else space.cps,
    )
    layouts = [layout for layout in enumerate_layouts(space) if holds_kept(layout.as_dict(), kept)]
    rule = memory_rule(device, settings.memory_limit_gb, settings.margin)
    candidates = admit(raw, layouts, base, world_size, device, precision, rule)
    mark_recipe(candidates, base, ATTENTION_BY_DEVICE.get(device.type, ("auto",)))
    return candidates, rule


def holds_kept(values: dict[str, Any], kept: dict[str, Any]) -> bool:
    return all(values[key.split(".")[1]] == value for key, value in kept.items())


def reprice(candidates: list[Candidate], model: TimeModel, run: RunContext) -> TimeModel:
    """Each candidate's step from the model and its whole run (`run_s`: measured where measured, else predicted)."""
    for c in candidates:
        assert c.cost is not None
        c.predicted_step_s = model.predict(c.cost)
        c.run = run_cost(c, run.shape, run.shared) if run.shape is not None else None
    return model


def run_s(c: Candidate) -> float:
    """What ranks candidates: the whole run where its length is known, else the step."""
    return c.run.total_s if c.run is not None else (c.measured_step_s or c.predicted_step_s or 0.0)


def expected_measure_s(candidate: Candidate, settings: TuneSettings, device: torch.device, setup_s: float) -> float:
    """What measuring the candidate should take: its setup, warm-up and timed steps and a few validation batches,
    compile (and its warm restart) where on."""
    restart = 1 if candidate.layout.compile else 0  # a compiled layout's first step again, from the cache
    steps = SAFETY * (settings.warmup + settings.steps + restart) * (candidate.predicted_step_s or 0.0)
    compile_s = COMPILE_S.get(device.type, 60.0) if candidate.layout.compile else 0.0
    return setup_s + steps + compile_s


def check_budget(settings: TuneSettings, admitted: list[Candidate], device: torch.device, start: float) -> None:
    """One line when the budget cannot hold even the quickest measurement."""
    setup_s = SETUP_S.get(device.type, 20.0)
    quickest = min(expected_measure_s(c, settings, device, setup_s) for c in admitted)
    left = settings.budget_s - (time.monotonic() - start)
    if quickest > left:
        raise UserError(
            f"--budget-min {settings.budget_s / 60:g} is too small for one measurement: the quickest layout takes "
            f"about {quickest:.0f} s to measure and {max(left, 0):.0f} s are left after the set-up; give --budget-min "
            f"{(quickest + settings.budget_s - left) / 60 * 1.5:.1f} or more"
        )


def measure_best(
    settings: TuneSettings,
    admitted: list[Candidate],
    device: torch.device,
    start: float,
    progress: Callable[[str, float], None] | None,
    run: RunContext,
) -> TimeModel:
    """Measure the best predicted layouts in turn, refitting the model after each (see the module docstring)."""
    model, setup_s, measured = TimeModel(), SETUP_S.get(device.type, 20.0), []
    group = needs_group(admitted) and not distributed.group_active()
    if group:
        distributed.init_distributed(device, True, timeout_s=600.0)
    try:
        while len(measured) < settings.max_measured:
            candidate = next_to_measure(settings, admitted, measured, device, start, setup_s)
            if candidate is None:
                break
            if progress is not None:
                progress(candidate.layout.label(), time.monotonic() - start)
            began = time.monotonic()
            measure_one(candidate, settings, device, run.shape)
            if candidate.record is not None:
                measured.append(candidate)
                setup_s = max(setup_s if len(measured) > 1 else 0.0, setup_seconds(candidate, began, settings))
                run.refresh(measured, device.type)
                fitted = calibrate([c.cost for c in measured], [c.measured_step_s for c in measured])
                model = reprice(admitted, fitted, run)
    finally:
        if group:
            distributed.teardown()
    return model


def needs_group(candidates: list[Candidate]) -> bool:
    return any(STRATEGY_TRAITS[c.layout.strategy].always_grouped for c in candidates)


def setup_seconds(candidate: Candidate, began: float, settings: TuneSettings) -> float:
    """The measurement's wall time beyond its steps (builders, compile): what the next measurement will also pay."""
    assert candidate.record is not None
    steps_s = (settings.warmup + settings.steps) * float(candidate.record["step_s"])
    return max(time.monotonic() - began - steps_s, 0.0)


def next_to_measure(
    settings: TuneSettings,
    admitted: list[Candidate],
    measured: list[Candidate],
    device: torch.device,
    start: float,
    setup_s: float,
) -> Candidate | None:
    """The best predicted unmeasured candidate whose measurement fits in the budget left, or None when none does or
    the stop rule says enough (rank 0 decides under torchrun)."""

    def decide() -> int | None:
        waiting = [i for i, c in enumerate(admitted) if c.record is None and c.drop is None]
        waiting.sort(key=lambda i: (not admitted[i].is_recipe, run_s(admitted[i])))  # the recipe's own first
        left = settings.budget_s - (time.monotonic() - start)
        affordable = [i for i in waiting if expected_measure_s(admitted[i], settings, device, setup_s) <= left]
        if not affordable:
            return None
        best = affordable[0]
        if len(measured) >= MIN_MEASURED:
            fastest = min(run_s(c) for c in measured)
            if run_s(admitted[best]) > fastest * (1 + STOP_MARGIN):
                return None
        return best

    index = distributed.main_decides(decide)
    return None if index is None else admitted[index]


def measure_one(candidate: Candidate, settings: TuneSettings, device: torch.device, shape: RunShape | None) -> None:
    """Measure the candidate with the real step (and a few validation batches where the run evaluates); a failure
    (out of memory on a GPU, a kernel the device lacks) becomes its drop reason and the search goes on. Rank 0's
    record stands for all ranks."""
    assert candidate.config is not None
    config = short_run(candidate.config, settings)
    candidate.predicted_before_s = candidate.predicted_step_s
    candidate.predicted_run_before_s = candidate.run.total_s if candidate.run is not None else None
    eval_batches = min(EVAL_SAMPLE, shape.eval_batches) if shape is not None and shape.evaluations else 0
    try:
        record = measure_config(config, device, settings.warmup, settings.steps, eval_batches)
    except UserError as e:
        record = {"error": str(e)}
    except Exception as e:
        from dlx import device as dev

        if dev.is_out_of_memory(e):
            dev.release_memory(device)
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        record = {"error": f"{type(e).__name__}: {first[:200]}"}
    record = distributed.main_decides(lambda: record)
    if "error" in record:
        candidate.drop = f"failed when measured: {record['error']}"
    else:
        candidate.record = record


def short_run(config: RunConfig, settings: TuneSettings) -> RunConfig:
    """The layout's recipe as a measurement runs it: warm-up plus timed steps, no progress bar, and synthetic tokens
    of the model's vocabulary unless data.document_mask needs the data's documents (a step's time does not depend on
    which token ids it reads; the recipe's dataset need not be on this machine)."""
    train = config.train.model_copy(update={"max_steps": settings.warmup + settings.steps})
    log = config.log.model_copy(update={"progress": False})
    update: dict[str, Any] = {"train": train, "log": log}
    if not config.data.document_mask:
        update["data"] = config.data.model_copy(update={"path": SYNTHETIC, "mix": None})
    return config.model_copy(update=update)


def pick_winner(admitted: list[Candidate], measuring: bool = True) -> Candidate:
    """The measured layout with the shortest whole run; where none was measured, the best predicted; the others keep
    why they lost."""
    measured = [c for c in admitted if c.record is not None]
    if measured:
        winner = min(measured, key=run_s)
    else:
        running = [c for c in admitted if c.drop is None]
        if not running:
            raise UserError(f"every layout measured failed; the first: {admitted[0].drop}")
        winner = min(running, key=run_s)
    best_s = run_s(winner)
    for c in admitted:
        if c is winner or c.drop is not None:
            continue
        if c.record is not None:
            c.drop = "slower when measured"
        elif not measuring:
            c.drop = "predicted slower (ranked by the model only)"
        elif run_s(c) <= best_s * (1 + STOP_MARGIN):
            c.drop = "not measured: the budget ran out first"
        else:
            c.drop = "not measured: predicted slower"
    return winner
