"""torch.profiler around chosen optimizer steps (`profile.start`, `profile.steps`): which op the step's time goes to.

The run enters `StepProfiler.step(n)` around each optimizer step (through its observer, `dlx.train.observers.build`);
outside the chosen steps it does nothing. Over
the chosen steps it records CPU ops (and on CUDA the kernels) with input shapes and Python stacks, each step inside a
`dlx_step_<n>` annotation. After the last one, with the step clock paused (the export is no step's time), every rank
writes into RUN/profile/:

    rank<r>-steps<a>-<b>.pt.trace.json   Chrome/Perfetto trace (chrome://tracing, ui.perfetto.dev, TensorBoard)
    rank<r>-top_ops.json                 the ops by self time, what report.md's table is made from
    rank<r>-top_ops.txt                  torch's own key_averages table, every column
    rank<r>-memory.*                     CUDA only: allocator snapshot, timeline, flame graph (metrics.cuda_memory)

Self time is an op's time minus that of the ops it called, so the self times add up to the profiled time without
counting any twice. It is device (kernel) time on CUDA, host time on CPU. The profiler slows the steps it records;
they are named in the metrics record that covers them (`profiled_steps`) and left out of throughput summaries.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from dlx.atomic import atomic_write_text
from dlx.metrics.timing import PhaseTimer

PROFILE_DIR = "profile"
STEP_LABEL = "dlx_step_"


@dataclass(frozen=True)
class ProfileWindow:
    start: int
    """First profiled optimizer step."""
    steps: int
    """Number of profiled steps; 0: off."""
    with_stack: bool = True
    top_ops: int = 15
    memory_snapshot: bool = True

    @property
    def last(self) -> int:
        return self.start + self.steps - 1

    def covers(self, step: int) -> bool:
        return self.steps > 0 and self.start <= step <= self.last


class StepProfiler:
    """Starts torch.profiler at the window's first step (or the first step of a resumed run inside it), stops it
    after the last, and writes the trace and tables; `close` writes whatever a run stopped early had recorded."""

    def __init__(
        self,
        window: ProfileWindow,
        run_dir: Path,
        rank: int,
        device: torch.device,
        timer: PhaseTimer,
        say: Callable[[str], None],
        meet: Callable[[], None] = lambda: None,
    ) -> None:
        self.window = window
        self.folder = Path(run_dir) / PROFILE_DIR
        self.rank = rank
        self.device = device
        self.timer = timer
        self.say = say
        """Prints on rank 0 (the run's console)."""
        self.meet = meet
        """Waits for every rank (a barrier under torchrun): ranks start and write their profiles in different times,
        and a rank's wait for another in the next step's collectives would become step time."""
        self._profile: profile | None = None
        self._steps: list[int] = []
        """Steps recorded by the running profile."""
        self._unreported: list[int] = []
        """Profiled steps not yet named in a metrics record."""
        self.written: list[Path] = []

    @contextlib.contextmanager
    def step(self, step: int) -> Iterator[None]:
        """Around one optimizer step; records it when the window covers it."""
        if not self.window.covers(step):
            yield
            return
        if self._profile is None:
            with self.timer.paused():
                self._start()
                self.meet()
        with record_function(f"{STEP_LABEL}{step}"):
            yield
        self._steps.append(step)
        self._unreported.append(step)
        if step == self.window.last:
            with self.timer.paused():
                self._finish()
                self.meet()

    def take_profiled_steps(self) -> list[int]:
        """The profiled steps since the last call: the metrics record being written covers them."""
        steps, self._unreported = self._unreported, []
        return steps

    def close(self) -> None:
        """A run stopped inside the window: stop the profiler and write the steps it recorded."""
        if self._profile is not None:
            self._finish()

    def _start(self) -> None:
        activities = [ProfilerActivity.CPU]
        if self.device.type == "cuda":
            activities.append(ProfilerActivity.CUDA)
            if self.window.memory_snapshot:
                from dlx.metrics import cuda_memory  # CUDA only

                cuda_memory.start_recording()
        self._profile = profile(activities=activities, record_shapes=True, with_stack=self.window.with_stack)
        self._profile.start()

    def _finish(self) -> None:
        started = time.perf_counter()
        prof, self._profile = self._profile, None
        assert prof is not None
        prof.stop()
        self.folder.mkdir(parents=True, exist_ok=True)
        first, last = self._steps[0], self._steps[-1]
        trace = self.folder / f"rank{self.rank}-steps{first}-{last}.pt.trace.json"
        export_trace(prof, trace)
        averages = prof.key_averages()
        summary = top_ops(averages, self.device, self.window.top_ops)
        summary.update(steps=list(self._steps), rank=self.rank, trace=trace.name, trace_bytes=trace.stat().st_size)
        table = averages.table(sort_by=summary["sort_by"])
        summary["finish_s"] = time.perf_counter() - started  # stop, export and tables: time outside any step
        prefix = self.folder / f"rank{self.rank}"
        atomic_write_text(f"{prefix}-top_ops.json", json.dumps(summary, indent=1) + "\n")
        atomic_write_text(f"{prefix}-top_ops.txt", table + "\n")
        self.written = [trace, Path(f"{prefix}-top_ops.json"), Path(f"{prefix}-top_ops.txt")]
        if self.device.type == "cuda" and self.window.memory_snapshot:
            from dlx.metrics import cuda_memory  # CUDA only

            self.written += cuda_memory.write_snapshot(self.folder, f"rank{self.rank}-memory")
        self._steps = []
        self.say("\n".join(top_ops_lines(summary)))
        self.say(f"profile: {', '.join(str(p) for p in self.written)} (in {time.perf_counter() - started:.1f} s)")


def export_trace(prof: profile, path: Path) -> None:
    """The Chrome/Perfetto JSON trace, written under a temporary name and renamed (never half a file)."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        prof.export_chrome_trace(str(tmp))
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def top_ops(averages: Any, device: torch.device, limit: int) -> dict[str, Any]:
    """The `limit` ops with the most self time (device time on CUDA, host time on CPU), with their share of all;
    `averages` is `profile.key_averages()`."""
    on_device = device.type == "cuda"
    field = "self_device_time_total" if on_device else "self_cpu_time_total"
    events = [e for e in averages if not e.key.startswith(STEP_LABEL)]
    total_us = sum(getattr(e, field) for e in events) or 1.0
    ranked = sorted(events, key=lambda e: getattr(e, field), reverse=True)[:limit]
    ops = [
        {
            "name": e.key,
            "calls": e.count,
            "self_ms": getattr(e, field) / 1e3,
            "self_pct": 100 * getattr(e, field) / total_us,
            "total_ms": (e.device_time_total if on_device else e.cpu_time_total) / 1e3,
        }
        for e in ranked
    ]
    clock = "device (kernel) time" if on_device else "host time"
    return {"clock": clock, "sort_by": field, "self_total_ms": total_us / 1e3, "ops": ops}


def top_ops_lines(summary: dict[str, Any]) -> list[str]:
    """A Markdown table of the top ops (console and report.md)."""
    steps = summary["steps"]
    lines = [
        f"Top {len(summary['ops'])} ops by self {summary['clock']} over profiled steps {steps[0]}..{steps[-1]} "
        f"(rank {summary['rank']}; {summary['self_total_ms']:,.1f} ms of self time in all):",
        "",
        "| op | calls | self ms | self % | total ms |",
        "|---|---:|---:|---:|---:|",
    ]
    for op in summary["ops"]:
        lines.append(
            f"| `{op['name']}` | {op['calls']} | {op['self_ms']:,.2f} | {op['self_pct']:.1f} | {op['total_ms']:,.2f} |"
        )
    return lines


def profile_report_section(run_dir: str | os.PathLike) -> list[str]:
    """report.md's profile section from rank 0's top_ops.json; [] when the run was not profiled."""
    path = Path(run_dir) / PROFILE_DIR / "rank0-top_ops.json"
    if not path.is_file():
        return []
    summary = json.loads(path.read_text())
    return [
        "## Profile",
        "",
        *top_ops_lines(summary),
        "",
        f"Trace: `{PROFILE_DIR}/{summary['trace']}` ({summary['trace_bytes'] / 1e6:.1f} MB; open it in "
        "ui.perfetto.dev or chrome://tracing). The profiled steps are left out of the summary and the verdict.",
    ]
