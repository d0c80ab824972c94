"""The whole run `dlx tune` ranks layouts by: how often the recipe's run evaluates, runs its tasks and saves (as the
loop and `finish` do: the last step gets what no due one gave it), and each part's seconds, measured or predicted."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from dlx.bench.tune.space import Layout
from dlx.bench.tune.whole_run import RunShape, occurrences, run_cost, run_shape, shared_costs
from dlx.train.config import build_config


@pytest.mark.parametrize(
    ("steps", "every", "at_the_end", "expected"),
    [
        (20, 100, True, 1),
        (400, 100, True, 4),
        (20, 0, True, 1),
        (20, 0, False, 0),
        (25, 10, True, 3),
        (20, 10, True, 2),
    ],
)
def test_occurrences_count_the_due_ones_and_the_last_step(steps, every, at_the_end, expected):
    assert occurrences(steps, every, at_the_end) == expected


def test_the_demo_recipes_run_at_twenty_steps():
    config = build_config(
        {
            "model": {"preset": "demo"},
            "data": {"path": "data/stdlib-8k"},
            "train": {"max_steps": 20},
            "eval": {"every": 100, "batches": 10, "tasks": ["t"], "tasks_every": 200},
            "checkpoint": {"every": 200},
        }
    )
    shape = run_shape(config, 20)
    assert (shape.evaluations, shape.eval_batches, shape.task_evaluations, shape.saves) == (1, 10, 1, 1)
    assert shape.checkpoint_gb == pytest.approx(12 * 7_096_576 / 1e9)


@dataclass
class Fake:
    layout: Layout
    record: dict[str, Any] | None
    predicted_step_s: float | None

    @property
    def measured_step_s(self) -> float | None:
        return None if self.record is None else self.record["step_s"]


def layout(compiled: bool, accum: int = 1) -> Layout:
    return Layout("none", 1, "none", 8 // accum, accum, compiled, False, "default")


def test_measured_and_predicted_runs_add_their_parts():
    shape = RunShape(steps=100, evaluations=2, eval_batches=10, task_evaluations=1, saves=2, checkpoint_gb=0.1)
    eager = Fake(layout(False, 2), {"step_s": 2.0, "first_step_s": 2.5, "eval_batch_s": 0.3}, 2.2)
    timed = {"step_s": 1.0, "first_step_s": 31.0, "warm_first_step_s": 4.0, "eval_batch_s": 0.2}
    compiled = Fake(layout(True), {**timed, "eval_compile_s": 6.0, "warm_eval_compile_s": 0.5}, 1.1)
    shared = shared_costs([eager, compiled], tasks_s=30.0, save_s=0.4, device_type="cpu")
    assert (shared.cold_compile_s, shared.eager_warmup_s, shared.eval_compile_s) == (30.0, 0.5, 6.0)
    assert shared.eval_share == pytest.approx((0.3 * 2 / 2.0 + 0.2 / 1.0) / 2)
    measured = run_cost(compiled, shape, shared)  # its graphs are cached now: warm
    assert measured.as_dict() == pytest.approx(
        {"warmup_s": 3.5, "steps_s": 100.0, "evals_s": 4.0, "tasks_s": 30.0, "saves_s": 0.8, "total_s": 138.3}
    )
    unmeasured = run_cost(Fake(layout(True, 2), None, 1.5), shape, shared)  # cold: another compiled layout's
    assert unmeasured.warmup_s == 30.0 + 6.0 and unmeasured.steps_s == 150.0
    assert unmeasured.evals_s == pytest.approx(2 * 10 * 1.5 / 2 * shared.eval_share)
    assert run_cost(eager, shape, shared).warmup_s == pytest.approx(0.5)
