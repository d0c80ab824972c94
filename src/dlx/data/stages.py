"""`StagedLoader`: a run's data in stages (`data.stages`), each stage read by a batch source of its own.

A stage is a span of optimizer steps, first_step to last_step, with its own source (one prepared dataset, a mixture,
or generated tokens) at its own seq_len and micro-batch size; `grad_accum` micro-batches of this rank make one of its
steps. The next stage's source is opened and starts reading ahead `WARM_MICRO_BATCHES` micro-batches before the
boundary (its workers have batches ready when it begins); a finished stage's source is closed at once, its workers
killed (an exiting interpreter would take CPU from the step). What carries from one stage to the next
(each source's draws, `dlx.data.mixture.order.MixOrder.first_draws`) is decided by whoever opens the stage
(`StageSources`), from the stage plan alone: the position is (stage, that stage source's own state), independent of
the rank and the world size as each source's is.

A checkpoint keeps the stages as the run realised them (`StageSpan.describe`). A resume may append stages and move
the end of the stage it resumes in, never change a stage that has begun (`check_saved_stages`). A state saved by a
run without stages is its one stage's, in progress where that run stopped.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol

from dlx.data.source import BatchSource
from dlx.errors import UserError

if TYPE_CHECKING:
    import torch

STATE_FORMAT = "dlx-stages-state"
STATE_VERSION = 1
WARM_MICRO_BATCHES = 32
"""The next stage's source starts reading this many micro-batches before the boundary (its workers start early)."""


UNTIL_SYNTAX = (
    "until takes a step (12000), a token count of the run (40B, 500M, 12k, 1.5T), a share of train.max_steps (80%) or "
    "decay (the last step before train.schedule wsd's decay)"
)
_TOKEN_UNITS = {"k": 1e3, "K": 1e3, "M": 1e6, "B": 1e9, "T": 1e12}


@dataclass(frozen=True)
class Until:
    """Where a stage ends, as written: `until`."""

    kind: Literal["step", "tokens", "share", "decay"]
    value: float = 0.0
    """The step, the tokens, or the share in (0, 1)."""

    def last_step(self, total_steps: int, tokens_per_step: int, decay_begins: int | None) -> int:
        """The stage's last optimizer step: a token count ends with the step that reaches it; `decay_begins` is the
        first step of the schedule's decay (None: the schedule has none)."""
        if self.kind == "step":
            return int(self.value)
        if self.kind == "tokens":
            return math.ceil(self.value / tokens_per_step)
        if self.kind == "share":
            return round(self.value * total_steps)
        if decay_begins is None:
            raise ValueError("until decay needs train.schedule wsd (the step its decay begins)")
        return decay_begins - 1


def parse_until(value: int | str) -> Until:
    """`until` as written; ValueError naming the syntax."""
    if isinstance(value, bool):
        raise ValueError(f"{value!r}: {UNTIL_SYNTAX}")
    if isinstance(value, int) or (isinstance(value, str) and value.strip().isdigit()):
        if int(value) < 1:
            raise ValueError(f"{value!r} is not a step ≥ 1; {UNTIL_SYNTAX}")
        return Until("step", int(value))
    text = str(value).strip()
    if text == "decay":
        return Until("decay")
    share = re.fullmatch(r"(\d+(?:\.\d+)?)\s*%", text)
    if share and 0 < float(share[1]) < 100:
        return Until("share", float(share[1]) / 100)
    tokens = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([kKMBT])", text)
    if tokens and float(tokens[1]) > 0:
        return Until("tokens", float(tokens[1]) * _TOKEN_UNITS[tokens[2]])
    raise ValueError(f"{value!r}: {UNTIL_SYNTAX}")


@dataclass(frozen=True)
class StageSpan:
    """One stage as the loader sees it."""

    first_step: int
    last_step: int
    grad_accum: int
    """Micro-batches of this rank per optimizer step."""
    reads: dict[str, Any] = field(default_factory=dict)
    """What the stage reads, JSON-ready (seq_len, sources and weights, RoPE, `until` as written)."""

    @property
    def micro_batches(self) -> int:
        """This rank's micro-batches in the whole stage."""
        return (self.last_step - self.first_step + 1) * self.grad_accum

    def describe(self) -> dict[str, Any]:
        """The stage as a checkpoint records it."""
        return {"first_step": self.first_step, "last_step": self.last_step, **self.reads}


class StageSources(Protocol):
    """Opens each stage's batch source and counts what a stage supplies."""

    def open(self, stage: int) -> BatchSource:
        """Stage `stage`'s source at the stage's start."""
        ...

    def stage_tokens(self, stage: int, steps: int | None = None) -> dict[str, int]:
        """Training tokens each named source supplies in the first `steps` steps of the stage (None: all of them),
        all ranks together."""
        ...


class StagedLoader:
    """A `BatchSource` that reads each stage's source for that stage's micro-batches, then the next stage's."""

    def __init__(self, spans: list[StageSpan], sources: StageSources):
        self.spans, self._sources = spans, sources
        self._stage, self._read = 0, 0
        """The stage being read, and this rank's micro-batches read in it."""
        self._loader = sources.open(0)
        self._next: BatchSource | None = None
        self._finished: list[BatchSource] = []
        """Closed sources of earlier stages: the shards their batches came from are verified with the current's."""

    @property
    def stage(self) -> int:
        """The stage the next micro-batch belongs to (the last one once the run's steps are all read)."""
        if self._read == self.spans[self._stage].micro_batches and self._stage + 1 < len(self.spans):
            return self._stage + 1
        return self._stage

    @property
    def steps_done(self) -> int:
        span = self.spans[self._stage]
        return span.first_step - 1 + self._read // span.grad_accum

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        return self

    def __next__(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self.stage != self._stage:
            self._enter(self._stage + 1)
        batch = next(self._loader)
        self._read += 1
        self._warm_next()
        return batch

    def _enter(self, stage: int) -> None:
        """Make `stage`'s source the current one; the previous one is closed at once (its workers killed: an exiting
        interpreter would compete with the step for the CPU) and kept for verification."""
        self._loader.close(at_once=True)
        self._finished.append(self._loader)
        self._loader = self._next if self._next is not None else self._sources.open(stage)
        self._next, self._stage, self._read = None, stage, 0

    def _warm_next(self) -> None:
        """Open the next stage's source and read ahead into it a few micro-batches before the boundary."""
        left = self.spans[self._stage].micro_batches - self._read
        if self._next is None and left <= WARM_MICRO_BATCHES and self._stage + 1 < len(self.spans):
            self._next = self._sources.open(self._stage + 1)
            self._next.warm()

    # The protocol's figures: the current stage's, and tokens counted over every stage.
    @property
    def epoch(self) -> int:
        return self._loader.epoch

    @property
    def batches_per_epoch(self) -> int | None:
        return None

    @property
    def windows_per_epoch(self) -> int | None:
        return None

    @property
    def vocab_size(self) -> int:
        return self._loader.vocab_size

    @property
    def eos_id(self) -> int:
        return self._loader.eos_id

    @property
    def bos_id(self) -> int | None:
        return self._loader.bos_id

    @property
    def worker_pids(self) -> list[int]:
        pids = list(self._loader.worker_pids)
        return pids + (list(self._next.worker_pids) if self._next is not None else [])

    def stage_source_tokens(self) -> dict[str, int]:
        """Training tokens each named source has supplied in the current stage, all ranks together."""
        return self._sources.stage_tokens(self._stage, self._read // self.spans[self._stage].grad_accum)

    def source_tokens(self) -> dict[str, int]:
        """Training tokens each named source has supplied since step 0, over every stage."""
        total: dict[str, int] = {}
        for stage in range(self._stage):
            for name, tokens in self._sources.stage_tokens(stage).items():
                total[name] = total.get(name, 0) + tokens
        for name, tokens in self.stage_source_tokens().items():
            total[name] = total.get(name, 0) + tokens
        return total

    def new_source_epochs(self) -> list[tuple[str, int]]:
        return self._loader.new_source_epochs()

    def warm(self) -> None:
        self._loader.warm()

    def state_dict(self) -> dict:
        """The stage, the steps read, the current stage source's state and every stage as planned (JSON-ready, the
        same on every rank)."""
        return {
            "format": STATE_FORMAT,
            "version": STATE_VERSION,
            "step": self.steps_done,
            "stage": self._stage,
            "stages": [span.describe() for span in self.spans],
            "loader": self._loader.state_dict(),
        }

    def load_state_dict(self, state: dict, steps_done: int | None = None) -> None:
        """Continue after `steps_done` steps (default: the state's own) from a staged state, or from a state saved by
        a run without stages (its one stage, in progress at that step); UserError when a stage that has begun differs
        from the saved one. The stage boundaries follow the steps: a rollback's data skip (a position saved after a
        later step of the same stage, `skip_problem`) reads on from that position with the run's own step count."""
        staged = state.get("format") == STATE_FORMAT
        if staged and state.get("version") != STATE_VERSION:
            raise UserError(f"the checkpoint's staged loader state is v{state.get('version')}, not v{STATE_VERSION}")
        step = steps_done if steps_done is not None else int(state["step"]) if staged else None
        if step is None:
            raise ValueError("a loader state saved without stages resumes only with steps_done")
        saved_stage = int(state["stage"]) if staged else 0
        check_saved_stages(state["stages"] if staged else None, self.spans, step)
        current = stage_of_step(self.spans, step + 1)
        self.close()
        self._finished, self._stage = [], current
        self._loader = self._sources.open(current)
        if current == saved_stage:
            self._loader.load_state_dict(state["loader"] if staged else state, steps_done=step)
        self._read = (step - self.spans[current].first_step + 1) * self.spans[current].grad_accum

    def verify_read_shards(self) -> list[str]:
        """Every shard a consumed batch of any stage came from, verified against its manifest."""
        hashed = [shard for loader in self._finished for shard in loader.verify_read_shards()]
        return hashed + self._loader.verify_read_shards()

    def close(self, at_once: bool = False) -> None:
        """Stop the current and the next stage's workers (idempotent)."""
        self._loader.close(at_once)
        if self._next is not None:
            self._next.close(at_once)
            self._next = None

    def __enter__(self) -> StagedLoader:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def skip_problem(loader: object, step: int, position: dict) -> str | None:
    """Why a rollback cannot move `loader`, after optimizer step `step`, to `position` (its state after a later
    step); None when it can. A staged loader's position belongs to one stage: a skip across a boundary would move the
    boundary, so the spiking steps must lie in the stage the run resumes in."""
    if not isinstance(loader, StagedLoader) or position.get("format") != STATE_FORMAT:
        return None
    here, there = stage_of_step(loader.spans, step + 1), int(position["stage"])
    if here == there:
        return None
    return f"they cross the boundary of data.stages[{there}] (step {loader.spans[there].first_step})"


def stage_of_step(spans: list[StageSpan], step: int) -> int:
    """The stage optimizer step `step` belongs to (the last stage for steps after it)."""
    for index, span in enumerate(spans):
        if step <= span.last_step:
            return index
    return len(spans) - 1


def check_saved_stages(saved: list[dict] | None, spans: list[StageSpan], step: int) -> None:
    """A resume after `step` steps may append stages and move the end of the stage the run stands in; a stage that
    has begun must read what it read, and one that ended before `step` must end where it ended. `saved` None: a run
    without stages, whose one stage was in progress at `step`. UserError names the stage and the fix."""
    saved = saved if saved is not None else [{"first_step": 1, "last_step": step, "unstaged": True}]
    for index, before in enumerate(saved):
        if before["first_step"] > step:
            break
        name = f"data.stages[{index}]"
        if index >= len(spans):
            raise UserError(
                f"--resume: the run trained data.stages[{index}] from step {before['first_step']:,} but the recipe "
                f"has {len(spans)} stage(s); keep every stage that has begun and append new ones after them"
            )
        now = spans[index].describe()
        if not before.get("unstaged") and _content(before) != _content(now):
            raise UserError(
                f"--resume: {name} differs from the stage the run trained with from step {before['first_step']:,} "
                f"({_differences(before, now)}); a stage that has begun stays as it was: append new stages after it"
            )
        if before["last_step"] < step and now["last_step"] != before["last_step"]:
            raise UserError(
                f"--resume: {name} ended at step {before['last_step']:,} in the run, but until {now.get('until')!r} "
                f"now ends it at step {now['last_step']:,}; write its end as until: {before['last_step']}"
            )
        if before["last_step"] >= step and now["last_step"] < step:
            raise UserError(
                f"--resume: {name} (until {now.get('until')!r}) now ends at step {now['last_step']:,}, before step "
                f"{step:,} the run has reached in it; give it an until at step {step} or later"
            )


def _content(description: dict) -> dict:
    """What a stage reads, without where it ends."""
    return {k: v for k, v in description.items() if k not in ("last_step", "until")}


def _differences(before: dict, now: dict) -> str:
    keys = sorted(set(_content(before)) | set(_content(now)))
    changed = [key for key in keys if before.get(key) != now.get(key)]
    return "; ".join(f"{key} was {before.get(key)!r}, now {now.get(key)!r}" for key in changed)
