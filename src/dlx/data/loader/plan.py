"""What a feed builds, batch by batch: the seam between the feeds (`SyncFeed` in-process, `WorkerPool` in worker
processes) and what decides which windows each batch holds.

A feed receives a JSON-ready spec (it crosses to the worker processes as JSON) holding `seq_len`, `start` and `loop`,
and opens a plan from it with `open_plan`. A plan has `micro_batch_size` and two methods:

    schedule(start, loop) -> iterator of cursors   the cursor of each batch this rank reads, from `start`
    fill(cursor, out)                              write that batch into out, (2, micro_batch_size, seq_len) int64

`SplitPlan` reads one split of one dataset (`order` + `windows`); a spec with a `mixture` key opens
`dlx.data.mixture.plan.MixturePlan`, which draws from several datasets by weight.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from dlx.data.loader.order import Cursor, EpochWindows, Order, schedule
from dlx.data.loader.windows import SplitSpec, TokenWindows


class SplitPlan:
    def __init__(self, spec: dict):
        self.order = Order(**spec["order"])
        self.micro_batch_size = self.order.micro_batch_size
        self._windows = TokenWindows(SplitSpec.from_json(spec["split"]), spec["seq_len"])
        self._window_ids = EpochWindows(self.order)

    def schedule(self, start: dict, loop: bool) -> Iterator[Cursor]:
        return schedule(self.order, Cursor(**start), loop)

    def fill(self, cursor: Cursor, out: np.ndarray) -> None:
        self._windows.fill(self._window_ids(cursor), out)


def open_plan(spec: dict):
    """The plan a feed's spec describes: one split, or a mixture of datasets."""
    if "mixture" in spec:
        from dlx.data.mixture.plan import MixturePlan

        return MixturePlan(spec)
    return SplitPlan(spec)


def open_feed(spec: dict, num_workers: int, prefetch: int):
    """Batches of `spec` from its start: built in this thread (`num_workers=0`) or by worker processes."""
    if num_workers == 0:
        from dlx.data.loader.sync import SyncFeed

        return SyncFeed(spec)
    from dlx.data.loader.pool import WorkerPool

    return WorkerPool(spec, num_workers, prefetch, spec["micro_batch_size"], spec["seq_len"])
