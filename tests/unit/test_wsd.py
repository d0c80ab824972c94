"""train.schedule wsd: warm-up, stable, decay shapes; the plan survives a resume and re-plans for a new length."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from dlx.train.build.optim import LRSchedule, ScheduledLR, WSDSchedule, build_scheduler
from dlx.train.config import TrainSection


def wsd(**overrides) -> TrainSection:
    options = {"lr": 1.0, "min_lr": 0.1, "warmup_ratio": 0.1, "schedule": "wsd", "decay_ratio": 0.2, **overrides}
    return TrainSection(**options)


def multipliers(schedule, steps: int) -> list[float]:
    return [schedule(step) for step in range(steps)]


@pytest.mark.parametrize(
    ("shape", "middle"),
    [("linear", 0.1 + 0.9 * 0.5), ("cosine", 0.1 + 0.9 * 0.5), ("1-sqrt", 0.1 + 0.9 * (1 - math.sqrt(0.5)))],
)
def test_warmup_stable_then_decay_to_min_lr_in_the_last_decay_ratio(shape, middle):
    values = multipliers(WSDSchedule(wsd(decay_shape=shape), total_steps=100), 100)
    assert values[:10] == pytest.approx([(s + 1) / 10 for s in range(10)])
    assert values[9:80] == [1.0] * 71  # the peak held through the stable phase
    assert all(a > b for a, b in itertools.pairwise(values[79:]))  # 20 decay steps, falling every step
    assert values[89] == pytest.approx(middle)  # halfway through the decay
    assert values[99] == pytest.approx(0.1)  # min_lr / lr at the last step


def test_decay_ratio_zero_and_one():
    assert multipliers(WSDSchedule(wsd(decay_ratio=0.0), 50), 50)[5:] == [1.0] * 45
    full = multipliers(WSDSchedule(wsd(decay_ratio=1.0, warmup_ratio=0.0), 50), 50)
    assert full[0] < 1.0 and full[-1] == pytest.approx(0.1)  # decays from the first step


def scheduler_after(cfg: TrainSection, total: int, steps: int) -> ScheduledLR:
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=cfg.lr)
    scheduler = build_scheduler(optimizer, cfg, total)
    for _ in range(steps):
        optimizer.step()
        scheduler.step()
    return scheduler


def resumed(
    cfg: TrainSection, old_total: int, new_total: int, at: int, until: int | None = None
) -> tuple[ScheduledLR, list[float]]:
    """A scheduler saved after `at` steps of `old_total`, loaded into one for `new_total`; its lrs up to `until`."""
    return resume(scheduler_after(cfg, old_total, at), cfg, new_total, until)


def resume(saved: ScheduledLR, cfg: TrainSection, total: int, until: int | None) -> tuple[ScheduledLR, list[float]]:
    state = saved.state_dict()
    state["lr_lambdas"] = [None]  # as dlx.train.rundir.checkpoint saves it
    scheduler = scheduler_after(cfg, total, 0)
    scheduler.load_state_dict(state)
    lrs = []
    for _ in range(saved.last_epoch, until or total):
        lrs.append(scheduler.get_last_lr()[0])
        scheduler.optimizer.step()
        scheduler.step()
    return scheduler, lrs


def test_resume_with_the_same_length_is_exact():
    cfg = wsd()
    uninterrupted = multipliers(WSDSchedule(cfg, 100), 100)
    scheduler, lrs = resumed(cfg, 100, 100, at=85)  # inside the decay
    assert lrs == uninterrupted[85:] and scheduler.resume_note is None


def test_a_longer_run_before_the_decay_extends_the_stable_phase():
    cfg = wsd(warmup_ratio=0.0)
    scheduler, lrs = resumed(cfg, 100, 300, at=50)
    assert lrs == multipliers(WSDSchedule(cfg, 300), 300)[50:]  # what a 300-step run does from step 50
    assert "the decay has not begun: it runs over steps 241-300" in scheduler.resume_note


def test_a_longer_run_after_the_decay_began_continues_it_without_a_jump():
    cfg = wsd(warmup_ratio=0.0, decay_shape="cosine")
    before = multipliers(WSDSchedule(cfg, 100), 100)
    scheduler, lrs = resumed(cfg, 100, 200, at=90)  # half-way through the decay
    assert before[89] > lrs[0] > before[90]  # the next lr: below the last one taken, above the old plan's
    assert all(a > b for a, b in itertools.pairwise(lrs))
    assert lrs[-1] == pytest.approx(0.1)
    assert "the decay had begun (50% through): it continues from there to min_lr at step 200" in scheduler.resume_note
    # Stopped again at step 150 and resumed with this length: the re-planned decay is kept exactly.
    at_150, _ = resumed(cfg, 100, 200, at=90, until=150)
    again, rest = resume(at_150, cfg, 200, None)
    assert rest == lrs[60:] and again.resume_note is None


def test_a_shorter_run_starts_the_decay_at_once_and_warmup_keeps_its_length():
    cfg = wsd(warmup_ratio=0.1)
    scheduler, lrs = resumed(cfg, 1000, 120, at=100)  # stable at step 100; 20 % of 120 would have begun at 96
    assert lrs[0] < 1.0 and lrs[-1] == pytest.approx(0.1) and len(lrs) == 20
    assert scheduler.resume_note.endswith("the decay has not begun: it runs over steps 101-120")
    _, during_warmup = resumed(cfg, 100, 1000, at=5)  # warm-up of 10 steps, not 100
    assert during_warmup[:5] == pytest.approx([0.6, 0.7, 0.8, 0.9, 1.0])


def test_every_schedule_saves_its_plan():
    scheduler = scheduler_after(TrainSection(schedule="cosine"), 10, 3)
    assert scheduler.state_dict()["plan"] == {"total_steps": 10, "warmup_steps": 0, "decay": [0, 0.0, 9]}


def cosine(**overrides) -> TrainSection:
    return TrainSection(**{"lr": 1.0, "min_lr": 0.1, "warmup_ratio": 0.1, "schedule": "cosine", **overrides})


@pytest.mark.parametrize("kind", ["cosine", "linear"])
def test_a_longer_cosine_or_linear_run_continues_the_decay_without_a_jump(kind):
    cfg = cosine(schedule=kind)
    before = multipliers(LRSchedule(cfg, 10), 10)
    scheduler, lrs = resumed(cfg, 10, 20, at=7)
    assert before[6] > lrs[0] > before[7]  # the next lr: below the last one taken, above the old plan's
    assert all(a > b for a, b in itertools.pairwise(lrs))
    assert lrs[-1] == pytest.approx(0.1) and len(lrs) == 13
    assert f"train.schedule {kind}: 10 → 20 steps at step 7; the decay continues from where it was" in (
        scheduler.resume_note
    )
    at_15, _ = resumed(cfg, 10, 20, at=7, until=15)  # stopped again and resumed with this length: kept exactly
    again, rest = resume(at_15, cfg, 20, None)
    assert rest == lrs[8:] and again.resume_note is None


def test_cosine_resumed_with_the_same_length_is_exact_and_warmup_keeps_its_length():
    cfg = cosine()
    _, lrs = resumed(cfg, 100, 100, at=40)
    assert lrs == multipliers(LRSchedule(cfg, 100), 100)[40:]
    scheduler, during_warmup = resumed(cfg, 100, 1000, at=5)  # warm-up of 10 steps, not 100
    assert during_warmup[:6] == pytest.approx([0.6, 0.7, 0.8, 0.9, 1.0, 1.0])
    assert during_warmup[-1] == pytest.approx(0.1)
    assert "after the warm-up the decay runs to min_lr at step 1,000" in scheduler.resume_note


def test_a_checkpoint_with_the_old_wsd_key_still_resumes():
    cfg = wsd()
    state = scheduler_after(cfg, 100, 85).state_dict()
    state["wsd"] = state.pop("plan")
    state["lr_lambdas"] = [None]
    scheduler = scheduler_after(cfg, 100, 0)
    scheduler.load_state_dict(state)
    assert scheduler.get_last_lr()[0] == pytest.approx(WSDSchedule(cfg, 100)(85))
