"""PhaseTimer: accumulation, window keys and means, pause, nesting, and the CUDA event path with a fake event."""

from __future__ import annotations

import time

import pytest
import torch

from dlx import device as device_mod
from dlx.metrics.records import STANDARD_PHASES
from dlx.metrics.timing import PhaseTimer

CPU = torch.device("cpu")


def test_window_has_every_standard_phase_and_step_s() -> None:
    timer = PhaseTimer(CPU)
    with timer.phase("forward"):
        pass
    timer.end_step()
    timings = timer.window()
    assert set(timings) == {*STANDARD_PHASES, "step_s"}
    assert timings["data_wait"] == timings["communication"] == 0.0


def test_repeated_phase_accumulates_and_step_covers_phases() -> None:
    timer = PhaseTimer(CPU)
    for _ in range(3):  # three accumulation micro-steps
        with timer.phase("forward"):
            time.sleep(0.005)
    with timer.phase("my_phase"):  # unknown names are allowed
        time.sleep(0.002)
    timer.end_step()
    timings = timer.window()
    assert timings["forward"] >= 0.015
    assert timings["my_phase"] >= 0.002
    assert timings["step_s"] >= timings["forward"] + timings["my_phase"]


def test_window_is_the_mean_per_step_of_the_steps_since_the_last_window() -> None:
    timer = PhaseTimer(CPU)
    for seconds in (0.01, 0.03):
        with timer.phase("forward"):
            time.sleep(seconds)
        timer.end_step()
    timings = timer.window()
    assert 0.02 <= timings["forward"] < 0.03  # (0.01 + 0.03) / 2 and a little
    assert timings["forward"] <= timings["step_s"] < 0.035
    with timer.phase("forward"):
        time.sleep(0.005)
    timer.end_step()
    assert timer.window()["forward"] < 0.01  # a new window: the earlier steps are gone


def test_step_s_runs_from_previous_window_and_pause_is_excluded() -> None:
    timer = PhaseTimer(CPU)
    with timer.phase("forward"):
        pass
    timer.end_step()
    timer.window()
    time.sleep(0.01)  # outside any phase: still part of the step (other time)
    with timer.paused():
        time.sleep(0.05)  # evaluation: not part of the step
    timer.end_step()
    timings = timer.window()
    assert 0.01 <= timings["step_s"] < 0.04


def test_window_inside_a_step_or_before_any_step_raises() -> None:
    timer = PhaseTimer(CPU)
    with pytest.raises(RuntimeError, match="at least one end_step"):
        timer.window()
    with timer.phase("forward"):
        pass
    with pytest.raises(RuntimeError, match="inside a step"):
        timer.window()


def test_nested_phase_raises() -> None:
    timer = PhaseTimer(CPU)
    with pytest.raises(RuntimeError, match="must not nest"), timer.phase("backward"), timer.phase("communication"):
        pass


def test_exception_inside_phase_is_still_timed() -> None:
    timer = PhaseTimer(CPU)
    with pytest.raises(KeyError), timer.phase("data_wait"):
        raise KeyError("loader died")
    timer.end_step()
    assert timer.window()["data_wait"] > 0.0


class FakeEvent:
    """Stands in for torch.cuda.Event: a timestamp taken when recorded."""

    created = 0

    def __init__(self) -> None:
        FakeEvent.created += 1
        self.t = 0.0

    def record(self) -> None:
        self.t = time.perf_counter()


def test_cuda_path_uses_events_one_sync_per_window_and_pools_events(monkeypatch: pytest.MonkeyPatch) -> None:
    syncs: list[torch.device] = []
    FakeEvent.created = 0
    monkeypatch.setattr(device_mod, "timing_event", lambda device: FakeEvent())
    monkeypatch.setattr(device_mod, "event_elapsed_s", lambda start, end: end.t - start.t)
    monkeypatch.setattr(device_mod, "synchronize", syncs.append)
    timer = PhaseTimer(torch.device("cuda", 0))
    for _ in range(2):  # two windows of two steps
        for _ in range(2):
            with timer.phase("data_wait"):  # events too: the device's idle time while the host fetches
                time.sleep(0.002)
            for _ in range(2):
                with timer.phase("forward"):
                    time.sleep(0.003)
            timer.end_step()
            assert not syncs or len(syncs) == 1  # end_step never waits for the device
        timings = timer.window()
        assert timings["forward"] >= 0.006 and timings["data_wait"] >= 0.002
    assert len(syncs) == 2  # one synchronize per window, none per phase or step
    assert FakeEvent.created == 12  # 2 steps × 3 spans × 2 events, reused in the second window


def test_spread_is_the_std_of_each_steps_host_wall_time_without_pauses(monkeypatch) -> None:
    """A fake clock: a 1 s step, a 5 s pause, a 3 s step; then the window, read at 11 s."""
    clock = iter([0.0, 0.0, 1.0, 1.0, 2.0, 7.0, 9.0, 9.0, 9.0, 11.0])
    monkeypatch.setattr(time, "perf_counter", lambda: next(clock))
    timer = PhaseTimer(CPU)
    with timer.phase("forward"):  # the window starts at 0; the phase runs 0 → 1
        pass
    timer.end_step()  # at 1: step 1 took 1 s
    with timer.paused():  # 2 → 7: not step time
        pass
    with timer.phase("forward"):  # 9 → 9
        pass
    timer.end_step()  # at 9: step 2 took 9 − 1 − 5 = 3 s
    timings = timer.window()  # at 11
    assert timings["step_s"] == (11 - 0 - 5) / 2
    assert timer.spread() == {"window_steps": 2, "step_s_std": 1.0}  # population std of 1 s and 3 s
    assert next(clock, None) is None  # every reading of the clock above was counted
