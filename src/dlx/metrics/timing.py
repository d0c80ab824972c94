"""Per-phase step timing: where each optimizer step's wall time goes.

Usage, once per optimizer step (forward/backward run once per accumulation micro-step and accumulate), and once per
logged window of steps:

    with timer.phase("data_wait"): batch = next(loader)
    with timer.phase("forward"): loss = model(batch)
    with timer.phase("backward"): loss.backward()
    with timer.phase("optimizer"): optimizer.step()
    timer.end_step()
    ...
    timings = timer.window()   # mean per step since the last window: {"data_wait": s, "forward": s, ..., "step_s": s}

Method. On a CPU every op has finished when it returns, so each phase is timed with `time.perf_counter()` around it
and nothing is synchronized. On CUDA kernels run asynchronously, so a host clock around `forward` would time the
launches, not the work: each device phase records a CUDA event on the current stream when it is entered and another
when it is left, and the events are read only at `window()`, after ONE `synchronize` per window: `end_step` does not
wait, so the host queues the next step while the device finishes this one's update, and the step's only wait is the
trainer's (the loss value, for the NaN policy). Recording an event costs a few µs, so measuring stays far below 1 % of
a step; the events are pooled, not created per step. `data_wait` is timed with events too: on the device's clock it is
how long the device went without work while the host fetched the batch (plus the batch's copy), which is what starves
an accelerator. A host clock would also count the host's own blocking while the device is busy: with grad_accum > 1
the host runs ahead, and once CUDA's launch queue is full it blocks in whichever phase launches next, the loader's
included (an H200 showed 11–51 ms of such "data wait" per step at grad accum 4 on device-side synthetic data).

`step_s` is host wall time per step over the window: from the previous `window()` (or, for the first window, the
first phase entered) to this one, after its synchronize, divided by the steps in it. So it counts everything the steps
cost, including work outside any phase (zero_grad, the scheduler, logging, Python), which the meter reports as
`other_s` and the verdict as unaccounted time. Wrap evaluation and checkpointing in `timer.paused()` so they do not
count as step time. Phases must not nest: their sum must not exceed the step, so a nested phase raises.

`spread()` gives the window's step-time spread (for the verdict's confidence) without another wait: each step's host
wall time from the previous `end_step` to its own, paused time left out. On a CPU that is the step's time. On CUDA the
host runs at most one step ahead (the trainer reads each step's loss value), so the host intervals follow the device's
pace; their mean is close to `step_s`, not equal to it.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Iterator
from typing import Any

import torch

from dlx import device as device_mod
from dlx.metrics.records import STANDARD_PHASES


class PhaseTimer:
    """Accumulates named phase times within one optimizer step; `end_step` returns them and starts the next step."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._use_events = device.type == "cuda"
        self._host_s: dict[str, float] = {}
        self._spans: list[tuple[str, Any, Any]] = []  # (phase, start event, end event), read at window()
        self._ended: list[tuple[dict[str, float], list[tuple[str, Any, Any]]]] = []  # steps ended in this window
        self._event_pool: list[Any] = []
        self._window_start: float | None = None
        self._paused_s = 0.0
        self._step_start: float | None = None  # host clock at the previous end_step (or the window's start)
        self._paused_in_step = 0.0
        self._step_walls: list[float] = []  # host wall seconds of each step ended in this window
        self._spread: dict[str, float] = {"window_steps": 0, "step_s_std": 0.0}
        self._active: str | None = None

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Time the enclosed block as `name`; entering the same phase again in the step adds to it."""
        if self._active is not None:
            raise RuntimeError(f"phase '{name}' entered inside phase '{self._active}': phases must not nest")
        if self._window_start is None:
            self._window_start = time.perf_counter()
        if self._step_start is None:
            self._step_start = self._window_start
        self._active = name
        try:
            if self._use_events:
                start = self._take_event()
                start.record()
                try:
                    yield
                finally:
                    end = self._take_event()
                    end.record()
                    self._spans.append((name, start, end))
            else:
                start_s = time.perf_counter()
                try:
                    yield
                finally:
                    self._host_s[name] = self._host_s.get(name, 0.0) + time.perf_counter() - start_s
        finally:
            self._active = None

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Leave the enclosed time (evaluation, checkpointing, sampling) out of the current step's `step_s`."""
        if self._active is not None:
            raise RuntimeError(f"timer paused inside phase '{self._active}'")
        device_mod.synchronize(self.device)  # the step's queued kernels belong to the step, not to the pause
        start_s = time.perf_counter()
        try:
            yield
        finally:
            device_mod.synchronize(self.device)  # and the pause's own kernels to the pause
            if self._window_start is not None:  # before the first phase no step clock is running
                paused_s = time.perf_counter() - start_s
                self._paused_s += paused_s
                self._paused_in_step += paused_s

    def end_step(self) -> None:
        """Close this optimizer step (no wait for the device); its timings are read by the next `window()`."""
        if self._active is not None:
            raise RuntimeError(f"end_step called inside phase '{self._active}'")
        self._ended.append((self._host_s, self._spans))
        self._host_s, self._spans = {}, []
        now = time.perf_counter()
        if self._step_start is not None:  # None only for a step that entered no phase before its window
            self._step_walls.append(max(now - self._step_start - self._paused_in_step, 0.0))
        self._step_start, self._paused_in_step = now, 0.0

    def window(self) -> dict[str, float]:
        """Seconds per step, averaged over the steps ended since the last window: every standard phase present, plus
        `step_s`. On CUDA the window's one synchronize. Call it between steps (after `end_step`)."""
        if self._active is not None or self._host_s or self._spans:
            raise RuntimeError("window() called inside a step: call it after end_step, before the next phase")
        if not self._ended:
            raise RuntimeError("window() needs at least one end_step since the last window")
        if self._use_events:
            device_mod.synchronize(self.device)  # the one synchronization per window
        now = time.perf_counter()
        sums = dict.fromkeys(STANDARD_PHASES, 0.0)
        for host_s, spans in self._ended:
            for name, seconds in host_s.items():
                sums[name] = sums.get(name, 0.0) + seconds
            for name, start, end in spans:
                sums[name] = sums.get(name, 0.0) + device_mod.event_elapsed_s(start, end)
                self._event_pool += (start, end)
        steps = len(self._ended)
        window_start = self._window_start if self._window_start is not None else now
        timings = {name: seconds / steps for name, seconds in sums.items()}
        timings["step_s"] = max(now - window_start - self._paused_s, 0.0) / steps
        self._ended, self._paused_s, self._window_start = [], 0.0, now
        self._spread = {"window_steps": steps, "step_s_std": _pstdev(self._step_walls)}
        self._step_walls, self._step_start, self._paused_in_step = [], now, 0.0
        return timings

    def spread(self) -> dict[str, float]:
        """The last window's `window_steps` and `step_s_std` (population standard deviation of its steps' host wall
        times, seconds); the verdict pools them into the step-time coefficient of variation."""
        return dict(self._spread)

    def _take_event(self) -> Any:
        return self._event_pool.pop() if self._event_pool else device_mod.timing_event(self.device)


def _pstdev(values: list[float]) -> float:
    return statistics.pstdev(values) if len(values) > 1 else 0.0
