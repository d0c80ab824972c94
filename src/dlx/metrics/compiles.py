"""What torch.compile compiled, read from dynamo's own record of each compilation
(`torch._dynamo.utils.get_compilation_metrics`, one entry per frame compiled, kept by torch whether or not its logs are
on): the function, its seconds, whether inductor's and AOTAutograd's caches served it, and for a recompile (a function
compiled again because a guard failed: a new shape, grad mode, a changed attribute) the first guard that failed.

`CompileLog.take()` returns what was compiled since the previous call; the run's compile observer
(`dlx.train.observers.compiles`) calls it after step 1, after each evaluation and after each task evaluation, and
names every recompile in the console and events.jsonl.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Compiled:
    """One frame dynamo compiled."""

    function: str
    """`name (file:line)`, the file relative to the package it is in."""
    seconds: float
    """Dynamo, AOTAutograd and inductor together; a backward graph (compiled lazily, at the first backward through
    its forward) is an entry of its own."""
    recompile: str | None
    """The first guard that failed, for a function compiled before; None for a first compile."""
    cache_hits: int
    """Graphs inductor's FX cache or AOTAutograd's cache served from disk."""
    cache_misses: int

    @classmethod
    def of(cls, metrics: Any) -> Compiled | None:
        """None for an entry that compiled nothing (neither a frame nor a backward graph)."""
        backward_us = getattr(metrics, "backward_cumulative_compile_time_us", None)
        if not metrics.co_name:  # AOTAutograd's backward graph, compiled at the first backward through it
            return cls("backward graph", backward_us / 1e6, None, 0, 0) if backward_us else None
        where = short_path(metrics.co_filename or "?")
        hits = (metrics.inductor_fx_local_cache_hit_count or 0) + (metrics.aotautograd_local_cache_hit_count or 0)
        misses = (metrics.inductor_fx_local_cache_miss_count or 0) + (metrics.aotautograd_local_cache_miss_count or 0)
        return cls(
            f"{metrics.co_name} ({where}:{metrics.co_firstlineno})",
            float(metrics.entire_frame_compile_time_s or 0.0),
            metrics.recompile_reason,
            hits,
            misses,
        )


def short_path(filename: str) -> str:
    """`dlx/model/llama.py` for a file inside a package (its path from the `site-packages` or `src` folder above)."""
    parts = filename.split(os.sep)
    for anchor in ("site-packages", "src"):
        if anchor in parts:
            return "/".join(parts[len(parts) - parts[::-1].index(anchor) :])
    return os.path.basename(filename)


class CompileLog:
    """Compilations since the previous `take()` (the first call: since the log was made)."""

    def __init__(self) -> None:
        self._last = self._newest()

    @staticmethod
    def _entries() -> list[Any]:
        from torch._dynamo.utils import get_compilation_metrics

        return get_compilation_metrics()

    def _newest(self) -> Any:
        entries = self._entries()
        return entries[-1] if entries else None

    def take(self) -> list[Compiled]:
        entries = self._entries()
        start = 0
        for index in range(len(entries) - 1, -1, -1):  # torch keeps the last 64: the one seen last may be gone
            if entries[index] is self._last:
                start = index + 1
                break
        new = entries[start:]
        if new:
            self._last = new[-1]
        return [compiled for compiled in map(Compiled.of, new) if compiled is not None]


def describe(compiled: list[Compiled], where: str) -> list[str]:
    """Console lines: one for the graphs compiled `where`, then one per recompile with its reason."""
    if not compiled:
        return []
    seconds = sum(c.seconds for c in compiled)
    hits, misses = sum(c.cache_hits for c in compiled), sum(c.cache_misses for c in compiled)
    recompiles = [c for c in compiled if c.recompile]
    lines = [
        f"compile {where}: {len(compiled)} graph(s) in {seconds:.1f} s (inductor/AOTAutograd cache: {hits} hit(s), "
        f"{misses} miss(es)), {len(recompiles)} recompile(s)"
    ]
    for c in recompiles:
        lines.append(f"recompiled {where}: {c.function} in {c.seconds:.1f} s, because {first_line(c.recompile)}")
    return lines


def first_line(reason: str | None) -> str:
    return (reason or "").strip().splitlines()[0] if reason and reason.strip() else "(no reason given by torch)"
