"""Batches built in the calling thread (`num_workers=0`): the same schedule as the workers, without processes."""

from __future__ import annotations

import numpy as np

from dlx.data.loader.plan import open_plan


class SyncFeed:
    def __init__(self, spec: dict):
        self._plan = open_plan(spec)
        self._schedule = self._plan.schedule(spec["start"], spec["loop"])
        self._batch = np.empty((2, self._plan.micro_batch_size, spec["seq_len"]), dtype=np.int64)

    def next_batch(self) -> np.ndarray:
        """The next batch (2, B, seq_len), in a buffer reused by the next call."""
        self._plan.fill(next(self._schedule), self._batch)
        return self._batch

    def close(self) -> None:
        pass
