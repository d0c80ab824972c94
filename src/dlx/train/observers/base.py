"""The one interface for what a run does besides its steps: GPU counters, the profiler, samples, Weights & Biases,
evaluations in the loop, loss-spike handling. The loop (`dlx.train.loop.trainer`) calls `run.observers`, an
`ObserverList`, at fixed points and knows none of them by name; OLMo-core's callbacks are the model. The observers a
run has are built by one function, `dlx.train.observers.build.build_observers`, and sorted by their `order`.

An observer sees the run through `RunView`, the typed parts it may touch (recipe, progress, loader, strategy,
scheduler, console, logger, run folder), handed to `attach` once the run is built. One with state across a resume
(`state_dict` not empty) has it saved under its `name` in the checkpoint's trainer_state.json and handed back by
`load_state_dict` before step 1. One may refuse a step's update (`veto_update`, before the optimizer step, from the
loss every rank agreed on): the spike guard does, as OLMo-core's SkipStep does inside the optimizer; the loss is
already on the host by then (the NaN policy reads it), so the veto adds no wait.

When each method is called, in a run's life:

| method | when | ranks |
|---|---|---|
| `attach(run)` | once, when the run is built: the `RunView` it may read and change | every rank |
| `load_state_dict(state)` | before step 1 when the checkpoint resumed holds this observer's state | every rank |
| `header()` | once, before step 1: lines for the start-up header (and report.md) | every rank; rank 0 prints |
| `step(step)` | a context around each optimizer step (the profiler) | every rank |
| `veto_update(step, loss)` | before each optimizer step: True leaves the update out | every rank alike |
| `columns(step)` | a step record is built, before it is logged: columns to add | every rank alike (collectives) |
| `on_record(record)` | the finished step record, after it is logged | every rank |
| `on_eval(record)` | a finished validation record (eval.jsonl) | every rank |
| `on_sample(record)` | a text generated during training (samples.jsonl), passed on by the sampler | every rank |
| `on_tasks(record)` | a task evaluation's metrics (tasks.jsonl), passed on by the task evaluation | every rank |
| `due(step)` | after every step: whether `between_steps(step)` will do work | every rank alike |
| `between_steps(step)` | after every step; does its work only when due | every rank alike |
| `finish(step)` | once, after the last step (also after a stop), the final checkpoint and evaluation | every rank |
| `on_report(step, verdict, files)` | report.md and its plots are written | rank 0 |
| `state_dict()` | at each checkpoint: what a resume needs (empty: nothing saved) | every rank |
| `close()` | always, also after an error; safe to call twice | every rank |

When any observer is `due` (or an evaluation or checkpoint is), the loop pauses the step clock around every
`between_steps` (its work is no step's time) and afterwards asks every rank whether a stop was requested meanwhile, so
that a signal during the work stops the run there. `due` must answer alike on every rank and have no side effects.

Every rank holds the same observers in the same order, and the loop calls every hook of every observer on every rank
(except `on_report`): an observer that runs collectives (GPU counters' mean, an evaluation of a sharded model) runs
them in the same order everywhere. One that writes files or prints does so on rank 0 only (`env.is_main`). Every
method has a no-op default: an observer overrides only what it uses.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager, nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from dlx.data.source import BatchSource
    from dlx.metrics.logger import MetricsLogger
    from dlx.parallel.distributed import DistEnv
    from dlx.parallel.strategy import Strategy
    from dlx.train.build.console import RunConsole
    from dlx.train.build.optim import ScheduledLR
    from dlx.train.build.progress import RunProgress
    from dlx.train.config import RunConfig


class RunView(Protocol):
    """The parts of a run an observer may touch (`dlx.train.run.Run` is one)."""

    @property
    def config(self) -> RunConfig: ...
    @property
    def run_dir(self) -> Path: ...
    @property
    def progress(self) -> RunProgress: ...
    @property
    def loader(self) -> BatchSource: ...
    @property
    def strategy(self) -> Strategy: ...
    @property
    def scheduler(self) -> ScheduledLR: ...
    @property
    def console(self) -> RunConsole: ...
    @property
    def logger(self) -> MetricsLogger: ...
    @property
    def env(self) -> DistEnv: ...


class Observer:
    """Base class: every hook a no-op. Subclasses override what they use."""

    name: str = ""
    """The key of its state in a checkpoint (observers with state need one)."""
    order: int = 50
    """Observers are called in ascending order (ties: the order they were built in)."""

    def attach(self, run: RunView) -> None:
        """The run this observer belongs to, once it is built."""

    def state_dict(self) -> dict[str, Any]:
        """What a resume needs to go on as if uninterrupted; empty when nothing."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """The state `state_dict` returned, read back from a checkpoint."""

    def veto_update(self, step: int, loss: float) -> bool:
        """Whether step `step`'s update is to be left out; `loss` is its finite loss, agreed by every rank."""
        return False

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

    def on_sample(self, record: dict[str, Any]) -> None:
        """A text generated during training, as logged to samples.jsonl."""

    def on_tasks(self, record: dict[str, Any]) -> None:
        """A task evaluation's metrics (lm-evaluation-harness), as logged to tasks.jsonl."""

    def due(self, step: int) -> bool:
        """Whether `between_steps(step)` will do work (the same answer on every rank, no side effects)."""
        return False

    def between_steps(self, step: int) -> None:
        """After step `step`; work only when due, with the step clock paused."""

    def finish(self, step: int) -> None:
        """After the run's last step, its final checkpoint and evaluation."""

    def on_report(self, step: int, verdict: Any, files: list[Path]) -> None:
        """Rank 0, at the end: the bottleneck verdict, and report.md and its plots (those that were written)."""

    def close(self) -> None:
        """Release what the observer holds (threads, files, profiles cut short); safe to call twice."""


class ObserverList(Observer):
    """Observers called in their order, every hook of each: what the loop holds as `run.observers`."""

    def __init__(self, observers: Iterable[Observer] = ()) -> None:
        self.observers = sorted(observers, key=lambda observer: observer.order)

    def __iter__(self) -> Iterator[Observer]:
        return iter(self.observers)

    def extend(self, observers: Iterable[Observer]) -> None:
        self.observers = sorted([*self.observers, *observers], key=lambda observer: observer.order)

    def attach(self, run: RunView) -> None:
        for observer in self.observers:
            observer.attach(run)

    def state_dict(self) -> dict[str, Any]:
        """Each observer's state under its name; observers without state are left out."""
        states = {observer.name: observer.state_dict() for observer in self.observers}
        return {name: state for name, state in states.items() if state}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for observer in self.observers:
            if observer.name in state:
                observer.load_state_dict(state[observer.name])

    def veto_update(self, step: int, loss: float) -> bool:
        """Every observer judges the step (each keeps its own account); one veto leaves the update out."""
        vetoes = [observer.veto_update(step, loss) for observer in self.observers]
        return any(vetoes)

    def header(self) -> list[str]:
        return [line for observer in self.observers for line in observer.header()]

    @contextmanager
    def step(self, step: int) -> Iterator[None]:
        with ExitStack() as stack:
            for observer in self.observers:
                stack.enter_context(observer.step(step))
            yield

    def columns(self, step: int) -> dict[str, Any]:
        columns: dict[str, Any] = {}
        for observer in self.observers:
            columns.update(observer.columns(step))
        return columns

    def on_record(self, record: dict[str, Any]) -> None:
        for observer in self.observers:
            observer.on_record(record)

    def on_eval(self, record: dict[str, Any]) -> None:
        for observer in self.observers:
            observer.on_eval(record)

    def on_sample(self, record: dict[str, Any]) -> None:
        for observer in self.observers:
            observer.on_sample(record)

    def on_tasks(self, record: dict[str, Any]) -> None:
        for observer in self.observers:
            observer.on_tasks(record)

    def due(self, step: int) -> bool:
        return any(observer.due(step) for observer in self.observers)

    def between_steps(self, step: int) -> None:
        for observer in self.observers:
            observer.between_steps(step)

    def finish(self, step: int) -> None:
        for observer in self.observers:
            observer.finish(step)

    def on_report(self, step: int, verdict: Any, files: list[Path]) -> None:
        for observer in self.observers:
            observer.on_report(step, verdict, files)

    def close(self) -> None:
        """Closes every observer, also when one fails to close; the first error is raised after the last close."""
        error: BaseException | None = None
        for observer in self.observers:
            try:
                observer.close()
            except BaseException as e:  # the others still release their threads and files
                error = error or e
        if error is not None:
            raise error
