"""The stage plan of `data.stages`, resolved once from the recipe and the number of data-parallel ranks: each stage's
steps, data, window length, batch shape and RoPE (`resolve_stages`; None for a run without stages).

- Ends: `until` is the stage's last step (`dlx.data.stages.Until`); `decay` is the last step before train.schedule
  wsd's decay, as `WSDSchedule` plans it for train.max_steps. Each stage ends after the one before it and before
  train.max_steps; the last runs to train.max_steps.
- Carry-over: a key a stage leaves out is the previous stage's; the first stage's come from data.mix or data.path,
  data.seq_len and model.*. A stage whose data is data.path (no mix so far) reads that dataset in its own order, as a
  run without stages does; a `mix` stage reads as data.mix does.
- Equal tokens per step: every stage reads data.micro_batch_size × grad_accum × ranks × data.seq_len tokens per step.
  A stage with another seq_len keeps the tokens of a micro-batch (micro-batch × seq_len) where it divides, else it
  takes micro-batches of one sequence and fewer or more of them per step; a seq_len that does not divide a rank's
  tokens per step is refused.
- Each source keeps its position across stages: its draws at a window length count on in every stage that reads it at
  that length (`dlx.data.mixture.order.MixOrder.first_draws`), seeded by a number it keeps (`source_ids`: the order of
  first appearance of (dataset, seq_len), so the first stage's numbers are data.mix's). Windows of another length are
  other windows, read in passes of their own.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from typing import Any, Literal

from dlx.data import SYNTHETIC
from dlx.data.mixture.order import SourcePattern
from dlx.data.mixture.sources import dataset_key, mix_sources
from dlx.data.source import Source
from dlx.data.stages import StageSpan, parse_until
from dlx.errors import UserError
from dlx.parallel.traits import STRATEGY_TRAITS
from dlx.train.build.optim import WSDSchedule
from dlx.train.build.step_plan import StageShape, resolve_grad_accum
from dlx.train.config import RunConfig

Kind = Literal["mix", "path", "synthetic"]


@dataclass(frozen=True)
class Stage:
    """One resolved stage."""

    index: int
    first_step: int
    last_step: int
    until: str | None
    """As written (None: the last stage)."""
    seq_len: int
    micro_batch_size: int
    grad_accum: int
    kind: Kind
    sources: tuple[Source, ...]
    """Named, with their weights (data.path: its one source, weight 1; synthetic data: none)."""
    source_ids: tuple[int, ...]
    """The number each source's window order is seeded with (mix stages)."""
    rope: dict[str, Any]
    """{rope_theta, rope_scaling} in force from the stage's first step."""

    @property
    def steps(self) -> int:
        return self.last_step - self.first_step + 1

    @property
    def weights(self) -> dict[str, float]:
        """The requested mixture: each source's share of the stage's windows."""
        total = sum(source.weight for source in self.sources) or 1.0
        return {source.name: source.weight / total for source in self.sources}

    def mixture(self) -> str:
        """`zh 70%, general 30%`, or what a stage without datasets reads."""
        return ", ".join(f"{name} {share:.0%}" for name, share in self.weights.items()) or "synthetic tokens"

    def reads(self, tokens_per_step: int) -> dict[str, Any]:
        """What the stage reads, JSON-ready: the checkpoint's record, compared at a resume."""
        reads: dict[str, Any] = {"until": self.until, "seq_len": self.seq_len, "tokens_per_step": tokens_per_step}
        if self.kind == "mix":
            reads["mix"] = [[s.name, s.weight] for s in self.sources]
        elif self.kind == "path":
            reads["path"] = self.sources[0].name
        else:
            reads["synthetic"] = True
        return {**reads, **self.rope}


@dataclass(frozen=True)
class StagePlan:
    stages: tuple[Stage, ...]
    tokens_per_step: int
    """Tokens all ranks read per optimizer step, the same in every stage."""

    def at(self, step: int) -> Stage:
        """The stage optimizer step `step` belongs to (the last one after the run's end)."""
        return next((stage for stage in self.stages if step <= stage.last_step), self.stages[-1])

    def spans(self) -> list[StageSpan]:
        return [StageSpan(s.first_step, s.last_step, s.grad_accum, s.reads(self.tokens_per_step)) for s in self.stages]

    def shapes(self) -> tuple[StageShape, ...]:
        """Each stage's batch shape, for the step plan."""
        return tuple(StageShape(s.last_step, s.seq_len, s.micro_batch_size, s.grad_accum) for s in self.stages)

    def longest(self) -> Stage:
        """The stage with the longest sequences (the memory estimate's)."""
        return max(self.stages, key=lambda stage: (stage.seq_len, stage.micro_batch_size))

    def stage_tokens(self, index: int, steps: int | None = None) -> dict[str, int]:
        """Training tokens each source supplies in the first `steps` steps of stage `index` (None: all of them)."""
        stage = self.stages[index]
        steps = stage.steps if steps is None else steps
        if stage.kind == "synthetic":
            return {}
        if stage.kind == "path":
            return {stage.sources[0].name: steps * self.tokens_per_step}
        draws = self._draws(index, steps)
        return {s.name: int(d) * stage.seq_len for s, d in zip(stage.sources, draws, strict=True)}

    def first_draws(self, index: int) -> tuple[int, ...]:
        """Draws each source of mix stage `index` had in the earlier mix stages at its seq_len."""
        stage = self.stages[index]
        counts = dict.fromkeys(stage.source_ids, 0)
        for earlier in self.stages[:index]:
            if earlier.kind != "mix" or earlier.seq_len != stage.seq_len:
                continue
            for number, draws in zip(earlier.source_ids, self._draws(earlier.index, earlier.steps), strict=True):
                if number in counts:
                    counts[number] += int(draws)
        return tuple(counts[number] for number in stage.source_ids)

    def _draws(self, index: int, steps: int) -> list[int]:
        stage = self.stages[index]
        slots = steps * (self.tokens_per_step // stage.seq_len)
        return _pattern(tuple(s.weight for s in stage.sources)).draws_before(slots).tolist()

    def header_lines(self) -> list[str]:
        """The plan in the start-up header: each stage's steps, tokens, batch shape, mixture and RoPE."""
        lines = [f"  Stages = {len(self.stages)} (data.stages); tokens per step = {self.tokens_per_step:,} in each"]
        for s in self.stages:
            rope = f"rope_theta {s.rope['rope_theta']:g}" + (", rope_scaling" if s.rope.get("rope_scaling") else "")
            lines.append(
                f"    stage {s.index}: steps {s.first_step:,}-{s.last_step:,} ({s.steps * self.tokens_per_step:,} "
                f"tokens{f', until {s.until}' if s.until else ''}); seq_len {s.seq_len:,}, micro-batch "
                f"{s.micro_batch_size} × {s.grad_accum} accumulated; {s.mixture()}; {rope}"
            )
        return lines


@functools.lru_cache(maxsize=64)
def _pattern(weights: tuple[float, ...]) -> SourcePattern:
    return SourcePattern(weights)


def resolve_stages(config: RunConfig, dp_size: int) -> StagePlan | None:
    """The stage plan for `dp_size` data-parallel ranks; None without data.stages. UserError names the stage."""
    written = config.data.stages
    if not written:
        return None
    data, total = config.data, config.train.max_steps
    assert total is not None  # RunConfig requires train.max_steps with data.stages
    grad_accum = resolve_grad_accum(config, dp_size)
    tokens_per_step = data.micro_batch_size * grad_accum * dp_size * data.seq_len
    names = source_names(config)
    ends = stage_ends(config, tokens_per_step)
    kind, mix = _first_data(config)
    stages, ids = [], {}
    settings = zip(written, data.stage_seq_lens(), config.stage_ropes(), strict=True)
    for index, (section, seq_len, rope) in enumerate(settings):
        if section.mix is not None:
            kind, mix = "mix", section.mix
        sources = _stage_sources(config, kind, mix, names)
        keys = [(s.key, seq_len) for s in sources] if kind == "mix" else []
        numbers = tuple(ids.setdefault(key, len(ids)) for key in keys)
        micro, accum = stage_batch(config, index, seq_len, grad_accum, dp_size)
        first = 1 if index == 0 else ends[index - 1] + 1
        until = None if section.until is None else str(section.until)
        stages.append(Stage(index, first, ends[index], until, seq_len, micro, accum, kind, sources, numbers, rope))
    return StagePlan(tuple(stages), tokens_per_step)


def stage_ends(config: RunConfig, tokens_per_step: int) -> list[int]:
    """Each stage's last step; UserError when one does not end after the one before it and before the run's end."""
    total = config.train.max_steps or 0
    decay_begins = None
    if config.train.schedule == "wsd":
        decay_begins = WSDSchedule(config.train, total).decay[0] + 2  # the first step whose lr is below the peak
    ends, previous = [], 0
    for index, stage in enumerate(config.data.stages or []):
        if stage.until is None:
            ends.append(total)
            break
        try:
            end = parse_until(stage.until).last_step(total, tokens_per_step, decay_begins)
        except ValueError as e:
            raise UserError(f"data.stages[{index}].until: {e}") from None
        if not previous < end < total:
            where = f"after step {previous:,}" if end <= previous else f"before train.max_steps {total:,}"
            raise UserError(
                f"data.stages[{index}].until {stage.until} ends the stage at step {end:,}, but it must end {where} "
                "(every stage takes at least one step and the last one runs to train.max_steps)"
            )
        ends.append(end)
        previous = end
    return ends


def stage_batch(config: RunConfig, index: int, seq_len: int, grad_accum: int, dp_size: int) -> tuple[int, int]:
    """(micro-batch, accumulation) at `seq_len` for the run's tokens per step."""
    micro, base = config.data.micro_batch_size, config.data.seq_len
    if seq_len == base:
        return micro, grad_accum
    per_rank = micro * grad_accum * base  # tokens of one rank per step
    if (micro * base) % seq_len == 0:
        return micro * base // seq_len, grad_accum
    if per_rank % seq_len:
        raise UserError(
            f"data.stages[{index}].seq_len {seq_len}: a rank's {per_rank:,} tokens per step (data.micro_batch_size "
            f"{micro} × accumulation {grad_accum} × data.seq_len {base}) are not a whole number of {seq_len}-token "
            f"sequences; pick a seq_len that divides {per_rank:,}"
        )
    windows = per_rank // seq_len
    fits = [d for d in range(1, windows + 1) if windows % d == 0 and d * seq_len <= max(micro * base, seq_len)]
    stage_micro = max(fits)
    if STRATEGY_TRAITS[config.parallel.strategy].fixed_grad_accum and windows // stage_micro != grad_accum:
        raise UserError(
            f"data.stages[{index}].seq_len {seq_len} needs {windows // stage_micro} accumulated micro-batches per "
            f"step, and parallel.strategy {config.parallel.strategy} keeps train.grad_accum ({grad_accum}); pick a "
            "seq_len that divides data.micro_batch_size × data.seq_len"
        )
    return stage_micro, windows // stage_micro


class SourceNames:
    """Every dataset a staged run reads (local folders and URLs), named once over all stages
    (`dlx.data.mixture.sources.mix_sources`) and identified by its key (`Source.key`)."""

    def __init__(self, paths: list[str], cache_dir: str = ""):
        """`paths` as written; one dataset written in two ways (`a`, `./a`; a URL with a trailing slash) is one."""
        unique = {dataset_key(path): path for path in reversed(paths)}  # its first spelling names it
        self._by_key = {s.key: s for s in mix_sources(dict.fromkeys(unique.values(), 1.0), cache_dir)}

    def source(self, path: str, weight: float) -> Source:
        """The dataset written as `path`, with its run-wide name and this weight."""
        return replace(self._by_key[dataset_key(path)], weight=weight)

    def sources(self) -> list[Source]:
        return list(self._by_key.values())


def source_names(config: RunConfig) -> SourceNames:
    data = config.data
    paths = list(data.mix or ([] if data.path == SYNTHETIC else [data.path]))
    for stage in data.stages or []:
        paths += [path for path in stage.mix or {} if path not in paths]
    return SourceNames(paths, data.cache_dir)


def _first_data(config: RunConfig) -> tuple[Kind, dict[str, float] | None]:
    if config.data.mix is not None:
        return "mix", config.data.mix
    return ("synthetic" if config.data.path == SYNTHETIC else "path"), None


def _stage_sources(config: RunConfig, kind: Kind, mix: dict[str, float] | None, names: SourceNames) -> tuple:
    if kind == "synthetic":
        return ()
    if kind == "path":
        return (names.source(config.data.path, 1.0),)
    return tuple(names.source(path, float(weight)) for path, weight in sorted((mix or {}).items(), key=_by_key))


def _by_key(entry: tuple[str, float]) -> str:
    return dataset_key(entry[0])
