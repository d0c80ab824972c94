"""PhaseTimer: accumulation, end_step keys, pause, nesting, and the CUDA event path with a fake event."""

from __future__ import annotations

import time

import pytest
import torch

from dlx import device as device_mod
from dlx.metrics.timing import STANDARD_PHASES, PhaseTimer

CPU = torch.device("cpu")


def test_end_step_has_every_standard_phase_and_step_s() -> None:
    timer = PhaseTimer(CPU)
    with timer.phase("forward"):
        pass
    timings = timer.end_step()
    assert set(timings) == {*STANDARD_PHASES, "step_s"}
    assert timings["data_wait"] == timings["communication"] == 0.0


def test_repeated_phase_accumulates_and_step_covers_phases() -> None:
    timer = PhaseTimer(CPU)
    for _ in range(3):  # three accumulation micro-steps
        with timer.phase("forward"):
            time.sleep(0.005)
    with timer.phase("my_phase"):  # unknown names are allowed
        time.sleep(0.002)
    timings = timer.end_step()
    assert timings["forward"] >= 0.015
    assert timings["my_phase"] >= 0.002
    assert timings["step_s"] >= timings["forward"] + timings["my_phase"]


def test_step_s_runs_from_previous_end_step_and_pause_is_excluded() -> None:
    timer = PhaseTimer(CPU)
    timer.end_step()
    time.sleep(0.01)  # outside any phase: still part of the step (other time)
    with timer.paused():
        time.sleep(0.05)  # evaluation: not part of the step
    timings = timer.end_step()
    assert 0.01 <= timings["step_s"] < 0.04


def test_nested_phase_raises() -> None:
    timer = PhaseTimer(CPU)
    with pytest.raises(RuntimeError, match="must not nest"), timer.phase("backward"), timer.phase("communication"):
        pass


def test_exception_inside_phase_is_still_timed() -> None:
    timer = PhaseTimer(CPU)
    with pytest.raises(KeyError), timer.phase("data_wait"):
        raise KeyError("loader died")
    assert timer.end_step()["data_wait"] > 0.0


class FakeEvent:
    """Stands in for torch.cuda.Event: a timestamp taken when recorded."""

    created = 0

    def __init__(self) -> None:
        FakeEvent.created += 1
        self.t = 0.0

    def record(self) -> None:
        self.t = time.perf_counter()


def test_cuda_path_uses_events_one_sync_per_step_and_pools_events(monkeypatch: pytest.MonkeyPatch) -> None:
    syncs: list[torch.device] = []
    FakeEvent.created = 0
    monkeypatch.setattr(device_mod, "timing_event", lambda device: FakeEvent())
    monkeypatch.setattr(device_mod, "event_elapsed_s", lambda start, end: end.t - start.t)
    monkeypatch.setattr(device_mod, "synchronize", syncs.append)
    timer = PhaseTimer(torch.device("cuda", 0))
    for _ in range(2):
        with timer.phase("data_wait"):  # host clock: no events
            time.sleep(0.002)
        for _ in range(2):
            with timer.phase("forward"):
                time.sleep(0.003)
        timings = timer.end_step()
        assert timings["forward"] >= 0.006 and timings["data_wait"] >= 0.002
    assert len(syncs) == 2  # one synchronize per end_step, none per phase
    assert FakeEvent.created == 4  # 2 spans × 2 events, reused in the second step
