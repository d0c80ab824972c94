"""What a feed builds, batch by batch: the seam (`BatchPlan`) between the feeds (`dlx.data.loader.feed`) and what
decides which windows each batch holds.

A plan is built in the trainer's process and sent to each worker once (pickled without its memory maps, which it
opens on first use). `SplitPlan` reads one split of one dataset (`order` + `windows`);
`dlx.data.mixture.plan.MixturePlan` draws from several datasets by weight; `CachedPlan` makes either wait for its
shards in the caches of data in object storage (`dlx.data.loader.cache`). numpy only, like everything a worker
imports.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from dlx.data.loader.order import Cursor, EpochWindows, Order, schedule
from dlx.data.loader.windows import SplitSpec, TokenWindows

if TYPE_CHECKING:
    from dlx.data.loader.cache import ShardCache


class BatchPlan(Protocol):
    """Which windows each of one rank's batches holds; a cursor is whatever the plan's schedule yields."""

    micro_batch_size: int
    seq_len: int

    def schedule(self, start: Any, loop: bool) -> Iterator[Any]:
        """The cursor of each batch this rank reads, from `start`; `loop=False` ends with the epoch."""
        ...

    def fill(self, cursor: Any, out: np.ndarray) -> None:
        """Write that batch into `out`, (2, micro_batch_size, seq_len) int64: inputs, then targets."""
        ...

    def shards_of(self, cursor: Any) -> set[str]:
        """The shard files that batch reads."""
        ...

    def describe_bad_token(self, cursor: Any, vocab_size: int) -> str:
        """The line naming the shard of an id outside the vocabulary in that batch."""
        ...


class SplitPlan:
    """The batches of one split in the order `order` gives this rank."""

    def __init__(self, split: SplitSpec, order: Order, seq_len: int):
        self.split, self.order, self.seq_len = split, order, seq_len
        self.micro_batch_size = order.micro_batch_size
        self._windows: TokenWindows | None = None
        self._window_ids = EpochWindows(order)

    def __getstate__(self) -> dict:
        return {"split": self.split, "order": self.order, "seq_len": self.seq_len}

    def __setstate__(self, state: dict) -> None:
        self.__init__(**state)

    @property
    def windows(self) -> TokenWindows:
        if self._windows is None:
            self._windows = TokenWindows(self.split, self.seq_len)
        return self._windows

    def schedule(self, start: Cursor, loop: bool) -> Iterator[Cursor]:
        return schedule(self.order, start, loop)

    def fill(self, cursor: Cursor, out: np.ndarray) -> None:
        self.windows.fill(self._window_ids(cursor), out)

    def shards_of(self, cursor: Cursor) -> set[str]:
        folder = Path(self.split.folder)
        return {str(folder / name) for name in self.windows.shards_of(self._window_ids(cursor))}

    def describe_bad_token(self, cursor: Cursor, vocab_size: int) -> str:
        folder = self.split.folder
        for window_id in self._window_ids(cursor).tolist():
            tokens = self.windows.window(window_id)
            bad = np.flatnonzero(tokens >= vocab_size)
            if len(bad):
                shard, offset = self.windows.locate(window_id * self.seq_len + int(bad[0]))
                return (
                    f"dataset {folder}: shard {shard} holds token id {int(tokens[bad[0]])} at token {offset:,}, "
                    f"outside the tokenizer's {vocab_size:,} ids: the shard is damaged or was written by another "
                    f"tokenizer; check with `dlx data verify {folder}` and run `dlx prepare` again"
                )
        return f"dataset {folder}: a batch holds a token id outside the vocabulary; run `dlx data verify {folder}`"


class CachedPlan:
    """A plan (`BatchPlan`) whose schedule waits for each batch's shards in the caches that hold
    them: a batch is handed on once every cache holds its shards of it. Each cache's prefetch threads walk the future
    batches on a copy of the plan of their own. Pickled as the plain plan (the workers read the cache folders, and
    never download)."""

    def __init__(self, plan: BatchPlan, caches: list[ShardCache], pinned: int):
        self.plan, self.caches, self.pinned = plan, caches, pinned
        self.micro_batch_size, self.seq_len = plan.micro_batch_size, plan.seq_len

    def __reduce__(self) -> tuple:
        return copy.copy, (self.plan,)  # the plain plan (a reference to the stdlib's copy: nothing more to import)

    def _future(self, cache: ShardCache, start: Any, loop: bool) -> Iterator[set[str]]:
        """The names of `cache`'s shards each batch from `start` reads (from the manifest's sizes: no file opened)."""
        plan, prefix = copy.copy(self.plan), os.path.join(cache.folder, "")
        for cursor in plan.schedule(start, loop):
            yield {path[len(prefix) :] for path in plan.shards_of(cursor) if path.startswith(prefix)}

    def schedule(self, start: Any, loop: bool) -> Iterator[Any]:
        for cache in self.caches:
            cache.start(self._future(cache, start, loop), self.pinned)
        try:
            for position, cursor in enumerate(self.plan.schedule(start, loop)):
                for cache in self.caches:
                    cache.acquire(position)
                yield cursor
        finally:
            for cache in self.caches:
                cache.stop()

    def fill(self, cursor: Any, out: Any) -> None:
        self.plan.fill(cursor, out)

    def shards_of(self, cursor: Any) -> set[str]:
        return self.plan.shards_of(cursor)

    def describe_bad_token(self, cursor: Any, vocab_size: int) -> str:
        return self.plan.describe_bad_token(cursor, vocab_size)
