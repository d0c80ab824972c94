"""Batches built in the calling thread (`num_workers=0`): the same schedule as the workers, without processes."""

from __future__ import annotations

import numpy as np

from dlx.data.loader.order import Cursor, EpochWindows, Order, schedule
from dlx.data.loader.windows import SplitSpec, TokenWindows


class SyncFeed:
    def __init__(self, spec: SplitSpec, order: Order, seq_len: int, start: Cursor, loop: bool):
        self._windows = TokenWindows(spec, seq_len)
        self._window_ids = EpochWindows(order)
        self._schedule = schedule(order, start, loop)
        self._batch = np.empty((2, order.micro_batch_size, seq_len), dtype=np.int64)

    def next_batch(self) -> np.ndarray:
        """The next batch (2, B, seq_len), in a buffer reused by the next call."""
        self._windows.fill(self._window_ids(next(self._schedule)), self._batch)
        return self._batch

    def close(self) -> None:
        pass
