"""Order: which windows each rank reads, batch by batch, epoch after epoch.

Epoch `e` visits the windows in the order `permutation(seed, e)` (or 0, 1, 2, ... without shuffling). That order is cut
into global steps of `world_size * micro_batch_size` windows; in each step rank `r` takes the `r`-th block of
`micro_batch_size`. So the ranks' shares are disjoint and together cover each window at most once per epoch.

The tail: the last `n_windows % (world_size * micro_batch_size)` windows of the epoch's order are skipped for that epoch
(a step is all ranks or none, and every micro-batch is full). With shuffling these are different windows every epoch;
without, always the last ones.

Progress is a `Cursor`: the epoch and how many windows of its order all ranks together have consumed. It does not depend
on the rank or the world size, which is what lets a run resume on a different number of ranks: the new ranks split what
is left of the epoch from the same position.

The permutation is materialised once per epoch in each worker: 8 bytes per window (40 MB for 5M windows, i.e. 10B
tokens at seq_len 2048). Beyond that size a bijective hash of the index would serve instead.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import asdict, dataclass

import numpy as np


@dataclass(frozen=True)
class Order:
    n_windows: int
    """Windows in the split."""
    micro_batch_size: int
    """Windows per micro-batch of one rank."""
    world_size: int
    """Data-parallel ranks reading the split together."""
    rank: int
    """This rank, 0 ≤ rank < world_size."""
    seed: int
    """Seeds the per-epoch permutation together with the epoch number."""
    shuffle: bool
    """False: every epoch reads windows 0, 1, 2, ... (evaluation)."""

    @property
    def step_windows(self) -> int:
        """Windows all ranks consume per micro-batch step."""
        return self.world_size * self.micro_batch_size

    @property
    def batches_per_epoch(self) -> int:
        return self.n_windows // self.step_windows

    def batches_left(self, consumed: int) -> int:
        return (self.n_windows - consumed) // self.step_windows

    def permutation(self, epoch: int) -> np.ndarray:
        """The epoch's window order; identical on every rank and in every worker."""
        if not self.shuffle:
            return np.arange(self.n_windows, dtype=np.int64)
        return np.random.default_rng([self.seed, epoch]).permutation(self.n_windows)

    def rank_share(self, permutation: np.ndarray, consumed: int) -> np.ndarray:
        """Window ids of this rank's micro-batch in the step that starts at position `consumed` of the order."""
        start = consumed + self.rank * self.micro_batch_size
        return permutation[start : start + self.micro_batch_size]

    def to_json(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Cursor:
    epoch: int
    consumed: int
    """Windows of this epoch's order consumed by all ranks together."""


def settle(order: Order, cursor: Cursor) -> Cursor:
    """The same position, moved to the start of the next epoch when no full step is left in this one."""
    if order.batches_left(cursor.consumed) > 0:
        return cursor
    return Cursor(cursor.epoch + 1, 0)


def advance(order: Order, cursor: Cursor) -> Cursor:
    """The position after one micro-batch step of all ranks."""
    return settle(order, Cursor(cursor.epoch, cursor.consumed + order.step_windows))


def schedule(order: Order, start: Cursor, loop: bool) -> Iterator[Cursor]:
    """The cursor of each batch this rank reads from `start`: forever if `loop`, else to the end of start's epoch."""
    cursor = settle(order, start)
    first_epoch = cursor.epoch
    while loop or cursor.epoch == first_epoch:
        yield cursor
        cursor = advance(order, cursor)


class EpochWindows:
    """This rank's window ids for any cursor, caching the current epoch's permutation (computed once per epoch)."""

    def __init__(self, order: Order):
        self.order = order
        self._epoch = -1
        self._permutation = np.empty(0, dtype=np.int64)

    def __call__(self, cursor: Cursor) -> np.ndarray:
        if cursor.epoch != self._epoch:
            self._permutation = self.order.permutation(cursor.epoch)
            self._epoch = cursor.epoch
        return self.order.rank_share(self._permutation, cursor.consumed)
