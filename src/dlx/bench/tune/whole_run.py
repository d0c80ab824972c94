"""What the user waits for: a layout's whole run, not its step alone. `dlx tune` ranks layouts by

    run_s = warm-up  +  steps × step_s  +  evaluations × eval_s  +  task evaluations × tasks_s  +  saves × save_s

over the recipe's own run (`RunShape`: train.max_steps, eval.every and eval.batches, eval.tasks and
eval.tasks_every, checkpoint.every, each counted as the loop and `finish` run them: the last step is evaluated,
task-evaluated and saved when no due one fell on it).

- warm-up: what the first step costs over a steady one. A measured layout's own (its first warm-up step less its
  timed step); under train.compile the first step of a fresh process whose compile cache is warm, because measuring
  the layout compiled it into the cache `dlx pretrain` reads (`dlx.train.build.compile_cache`), plus the validation
  graph's compile. An unmeasured compiled layout compiles cold: the cold warm-up measured for another compiled layout,
  else `COMPILE_PRIOR_S`. An unmeasured eager one: the eager layouts' measured median, else 0.
- eval_s: `eval.batches` forward passes at the layout's micro-batch. Measured: timed on a few batches; predicted: the
  step's per-micro-batch time × the measured layouts' median eval ÷ step ratio (else `EVAL_SHARE`).
- tasks_s: lm-eval's tasks on the recipe's model, timed once (the same for every layout: the requests run the
  blocks' eager code at their own shapes).
- save_s: one checkpoint's bytes (`checkpoint_bytes`) at the rate a write, fsync and SHA-256 ran here.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch

from dlx.bench.tune.space import Layout
from dlx.data.shards import TOKENIZER_FILE
from dlx.errors import UserError
from dlx.train.build.preflight import checkpoint_bytes
from dlx.train.config import RunConfig


class Candidate(Protocol):
    """What the whole run reads of a `dlx.bench.tune.select.Candidate`."""

    @property
    def layout(self) -> Layout: ...
    @property
    def record(self) -> dict[str, Any] | None: ...
    @property
    def measured_step_s(self) -> float | None: ...
    @property
    def predicted_step_s(self) -> float | None: ...


COMPILE_PRIOR_S = {"cpu": 40.0, "cuda": 60.0}
"""A cold torch.compile warm-up before any compiled layout is measured."""
EVAL_SHARE = 1 / 3
"""A no-gradient forward over one micro-batch as a share of a training micro-step, before any is measured."""
EVAL_SAMPLE = 4
"""Validation batches timed per measured layout (the recipe's eval.batches scaled from them)."""


@dataclass(frozen=True)
class RunShape:
    """How often each part of the recipe's run happens."""

    steps: int
    evaluations: int
    eval_batches: int
    task_evaluations: int
    saves: int
    checkpoint_gb: float

    def describe(self) -> str:
        parts = [f"{self.steps:,} steps"]
        if self.evaluations:
            parts.append(f"{self.evaluations} evaluation(s) of {self.eval_batches} batches")
        if self.task_evaluations:
            parts.append(f"{self.task_evaluations} task evaluation(s)")
        parts.append(f"{self.saves} save(s) of {self.checkpoint_gb:.2f} GB")
        return ", ".join(parts)


def occurrences(steps: int, every: int, at_the_end: bool) -> int:
    """How many times work due every `every` steps runs in `steps` steps, plus once at the end when the last step
    is not a multiple and `at_the_end` (the loop's `finish` does it then)."""
    due = steps // every if every else 0
    return due + (1 if at_the_end and (not every or steps % every) else 0)


def run_shape(config: RunConfig, steps: int) -> RunShape:
    """The recipe's run as `dlx.train.loop` runs it: validations every eval.every and at the end, task evaluations
    every eval.tasks_every and at the end, saves every checkpoint.every and at the end."""
    evaluation = config.eval
    return RunShape(
        steps=steps,
        evaluations=occurrences(steps, evaluation.every, at_the_end=bool(evaluation.every)),
        eval_batches=evaluation.batches,
        task_evaluations=occurrences(steps, evaluation.tasks_every, True) if evaluation.tasks else 0,
        saves=occurrences(steps, config.checkpoint.every, True),
        checkpoint_gb=checkpoint_bytes(config) / 1e9,
    )


@dataclass(frozen=True)
class SharedCosts:
    """What the whole run costs besides a layout's own step, from what was measured so far."""

    tasks_s: float
    """One task evaluation (0 without eval.tasks)."""
    save_s: float
    """One checkpoint save."""
    cold_compile_s: float
    """A compiled layout's first step over its steady step, with nothing in the compile cache."""
    eager_warmup_s: float
    eval_share: float
    """One validation batch ÷ one training micro-step."""
    eval_compile_s: float
    """The validation graph's compile, once per compiled run."""


@dataclass(frozen=True)
class RunCost:
    warmup_s: float
    steps_s: float
    evals_s: float
    tasks_s: float
    saves_s: float

    @property
    def total_s(self) -> float:
        return self.warmup_s + self.steps_s + self.evals_s + self.tasks_s + self.saves_s

    def as_dict(self) -> dict[str, float]:
        return {
            "warmup_s": self.warmup_s,
            "steps_s": self.steps_s,
            "evals_s": self.evals_s,
            "tasks_s": self.tasks_s,
            "saves_s": self.saves_s,
            "total_s": self.total_s,
        }


def shared_costs(measured: list[Candidate], tasks_s: float, save_s: float, device_type: str) -> SharedCosts:
    """Medians over the measured layouts' records, priors where none says."""

    def median(values: list[float], default: float) -> float:
        return statistics.median(values) if values else default

    records = [(c, c.record) for c in measured if c.record is not None]
    compiled = [r for c, r in records if c.layout.compile]
    eager = [r for c, r in records if not c.layout.compile]
    shares = [r["eval_batch_s"] * c.layout.grad_accum / r["step_s"] for c, r in records if r.get("eval_batch_s")]
    return SharedCosts(
        tasks_s=tasks_s,
        save_s=save_s,
        cold_compile_s=median([first_step_over(r) for r in compiled], COMPILE_PRIOR_S.get(device_type, 60.0)),
        eager_warmup_s=median([first_step_over(r) for r in eager], 0.0),
        eval_share=median(shares, EVAL_SHARE),
        eval_compile_s=median([r.get("eval_compile_s", 0.0) for r in compiled], 0.0),
    )


def first_step_over(record: dict[str, Any]) -> float:
    """A record's first warm-up step beyond its steady step (0 where it has none)."""
    first = record.get("first_step_s")
    return max(float(first) - float(record["step_s"]), 0.0) if first is not None else 0.0


def run_cost(candidate: Candidate, shape: RunShape, shared: SharedCosts) -> RunCost:
    """The candidate's whole run: from its measurement where it has one, else from its predicted step."""
    record, layout = candidate.record, candidate.layout
    step_s = candidate.measured_step_s or candidate.predicted_step_s or 0.0
    micro_step_s = step_s / layout.grad_accum
    eval_batch_s = record.get("eval_batch_s") if record else None
    if eval_batch_s is None:
        eval_batch_s = micro_step_s * shared.eval_share
    if record is not None and layout.compile:  # its graphs are in the compile cache now: the run starts warm
        warmup = max(float(record.get("warm_first_step_s", record.get("first_step_s", step_s))) - step_s, 0.0)
        warmup += float(record.get("warm_eval_compile_s", 0.0)) if shape.evaluations else 0.0
    elif layout.compile:
        warmup = shared.cold_compile_s + (shared.eval_compile_s if shape.evaluations else 0.0)
    else:
        warmup = first_step_over(record) if record is not None else shared.eager_warmup_s
    return RunCost(
        warmup_s=warmup,
        steps_s=shape.steps * step_s,
        evals_s=shape.evaluations * shape.eval_batches * eval_batch_s,
        tasks_s=shape.task_evaluations * shared.tasks_s,
        saves_s=shape.saves * shared.save_s,
    )


SAVE_SAMPLE_BYTES = 16 << 20
"""Bytes written, fsynced and hashed to time a save."""


def time_save(config: RunConfig, folder: Path) -> float:
    """One checkpoint's save: its bytes at the rate `SAVE_SAMPLE_BYTES` are written, fsynced and SHA-256-hashed in
    `folder` (where the run folder will be), as `dlx.train.rundir.checkpoint` writes and records each file."""
    import hashlib
    import os
    import tempfile
    import time

    folder.mkdir(parents=True, exist_ok=True)
    data = os.urandom(SAVE_SAMPLE_BYTES)
    began = time.perf_counter()
    with tempfile.NamedTemporaryFile(dir=folder) as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
        hashlib.sha256(data).hexdigest()
    seconds_per_byte = (time.perf_counter() - began) / SAVE_SAMPLE_BYTES
    return checkpoint_bytes(config) * seconds_per_byte


def time_task_evaluation(config: RunConfig, device: torch.device) -> float | None:
    """One evaluation of the recipe's eval.tasks on its model (freshly initialised weights, the recipe's precision),
    through the adapter a run uses; 0.0 without tasks, None when the dataset's tokenizer is not in a local folder."""
    import time

    if not config.eval.tasks:
        return 0.0
    tokenizer = Path(config.data.path) / TOKENIZER_FILE if config.data.path and not config.data.mix else None
    if tokenizer is None or not tokenizer.is_file():
        return None
    from dlx.evals.adapter import build_adapter
    from dlx.model.llama import Transformer
    from dlx.precision import build_precision
    from dlx.train.observers.tasks import load_run_tasks

    tasks = load_run_tasks(config.eval, tokenizer, lambda decide: decide())
    assert tasks is not None
    with torch.device(device):
        model = Transformer(config.model.args)
    model.init_weights(torch.Generator(device).manual_seed(config.train.seed))
    precision = build_precision(config.train.precision, device)
    began = time.perf_counter()
    tasks.run(build_adapter(model, tokenizer, precision.autocast))
    return time.perf_counter() - began


@dataclass
class RunContext:
    """The recipe's run and what it costs besides each layout's steps, refreshed as layouts are measured."""

    shape: RunShape | None
    shared: SharedCosts

    def refresh(self, measured: list[Candidate], device_type: str) -> None:
        self.shared = shared_costs(measured, self.shared.tasks_s, self.shared.save_s, device_type)


def recipe_shape(base: RunConfig, world_size: int) -> RunShape | None:
    """The recipe's run: train.max_steps, else epochs over its dataset where the dataset is here (None otherwise)."""
    if base.train.max_steps is not None:
        return run_shape(base, base.train.max_steps)
    from dlx.train.build.data import build_train_loader
    from dlx.train.build.step_plan import plan_steps

    dp = max(1, world_size // base.parallel.tp)
    try:
        loader = build_train_loader(base, torch.device("cpu"), 0, dp)
    except UserError:  # its dataset is not here
        return None
    try:
        plan = plan_steps(base, loader.batches_per_epoch, loader.windows_per_epoch, dp, base.parallel.tp)
    finally:
        loader.close()
    return run_shape(base, plan.total_steps)


def base_costs(base: RunConfig, device: torch.device, save_folder: Path) -> SharedCosts:
    """One task evaluation and one save, timed here once (the same for every layout); the rest from priors until
    layouts are measured."""
    tasks_s = time_task_evaluation(base, device) if base.eval.tasks else 0.0
    save_s = time_save(base, save_folder)
    return shared_costs([], tasks_s or 0.0, save_s, device.type)
