"""The one interface for what a run does besides its steps: GPU counters, the profiler, samples, Weights & Biases,
evaluations in the loop, loss-spike handling. The loop (`dlx.train.trainer`) iterates over `run.observers` at fixed
points and knows none of them by name; OLMo-core's callbacks are the model.

When each method is called, in a run's life:

| method | when | ranks |
|---|---|---|
| `header()` | once, before step 1: lines for the start-up header (and report.md) | every rank; rank 0 prints |
| `step(step)` | a context around each optimizer step (the profiler) | every rank |
| `columns(step)` | a step record is built, before it is logged: columns to add | every rank alike (collectives) |
| `on_record(record)` | the finished step record, after it is logged | every rank |
| `on_eval(record)` | a finished validation record (eval.jsonl) | every rank |
| `between_steps(step)` | after every step, the step clock paused; does its work only when due | every rank alike |
| `finish(step)` | once, after the last step, the final checkpoint and evaluation | every rank |
| `close()` | always, also after an error; safe to call twice | every rank |

An observer that writes files or prints does so on rank 0 (`env.is_main`); one that runs collectives (GPU counters'
mean, an evaluation of a sharded model) runs them on every rank in the same order, so the base methods never skip a
rank. Every method has a no-op default: an observer overrides only what it uses.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from typing import Any


class Observer:
    """Base class: every hook a no-op. Subclasses override what they use."""

    def header(self) -> list[str]:
        """Lines for the start-up header (and report.md)."""
        return []

    def step(self, step: int) -> AbstractContextManager[Any]:
        """A context around optimizer step `step` (wait for data, forward, backward, optimizer)."""
        return nullcontext()

    def columns(self, step: int) -> dict[str, Any]:
        """Columns to add to the record of `step`, before it is logged."""
        return {}

    def on_record(self, record: dict[str, Any]) -> None:
        """The finished step record, as logged to metrics.jsonl."""

    def on_eval(self, record: dict[str, Any]) -> None:
        """A finished validation record, as logged to eval.jsonl."""

    def between_steps(self, step: int) -> None:
        """After step `step`, with the step clock paused; work only when due."""

    def finish(self, step: int) -> None:
        """After the run's last step, its final checkpoint and evaluation."""

    def close(self) -> None:
        """Release what the observer holds (threads, files, profiles cut short); safe to call twice."""
