"""Order: which windows each rank reads, batch by batch, epoch after epoch.

Epoch `e` visits the windows in the order `permutation(seed, e)` (or 0, 1, 2, ... without shuffling; or, for a split
read through a cache smaller than itself, the shard-block order of `dlx.data.loader.shard_blocks`). That order is cut
into global steps of `world_size * micro_batch_size` windows; in each step rank `r` takes the `r`-th block of
`micro_batch_size`. So the ranks' shares are disjoint and together cover each window at most once per epoch.

The tail: the last `n_windows % (world_size * micro_batch_size)` windows of the epoch's order are skipped for that epoch
(a step is all ranks or none, and every micro-batch is full). With shuffling these are different windows every epoch;
without, always the last ones.

Progress is a `Cursor`: the epoch and how many windows of its order all ranks together have consumed. It does not depend
on the rank or the world size, which is what lets a run resume on a different number of ranks: the new ranks split what
is left of the epoch from the same position.

The state a checkpoint keeps (`make_state`) is the cursor plus what identifies the order it refers to; resuming
against a different order is refused instead of silently reading other data.

The permutation is materialised once per epoch in each worker: 8 bytes per window (40 MB for 5M windows, i.e. 10B
tokens at seq_len 2048). Beyond that size a bijective hash of the index would serve instead.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from dlx.data.loader.shard_blocks import block_permutation, order_name
from dlx.data.source import DamagedState
from dlx.errors import UserError


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
    block_shards: int = 0
    """With shuffle: > 0 shuffles in blocks of this many shards (`shard_blocks`), 0 shuffles windows."""
    shard_bounds: tuple[int, ...] = ()
    """For block_shards > 0: the first window of each shard, then n_windows (`shard_blocks.shard_window_bounds`)."""

    @property
    def name(self) -> str:
        """What the loader state records as the order: `shuffled`, `sequential` or `shard-blocks-K`."""
        return order_name(self.shuffle, self.block_shards)

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
        rng = np.random.default_rng([self.seed, epoch])
        if self.block_shards:
            return block_permutation(self.shard_bounds, self.block_shards, rng)
        return rng.permutation(self.n_windows)

    def rank_share(self, permutation: np.ndarray, consumed: int) -> np.ndarray:
        """Window ids of this rank's micro-batch in the step that starts at position `consumed` of the order."""
        start = consumed + self.rank * self.micro_batch_size
        return permutation[start : start + self.micro_batch_size]


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


ORDER_HINT = (
    "; a dataset in object storage read through a cache smaller than it is shuffled in shard blocks sized by the "
    "cache (data.cache_gb)"
)
STATE_FORMAT = "dlx-loader-state"
STATE_VERSION = 1


def make_state(order: Order, cursor: Cursor, split: str, seq_len: int) -> dict:
    return {
        "format": STATE_FORMAT,
        "version": STATE_VERSION,
        "epoch": cursor.epoch,
        "consumed": cursor.consumed,
        "split": split,
        "seq_len": seq_len,
        "n_windows": order.n_windows,
        "seed": order.seed,
        "order": order.name,
        # For the record only: a resume may use another world size or micro-batch size.
        "world_size": order.world_size,
        "micro_batch_size": order.micro_batch_size,
    }


def read_state(state: dict, order: Order, split: str, seq_len: int) -> Cursor:
    """The cursor a saved state resumes at; UserError when it was saved for other data or another order."""
    if not isinstance(state, dict) or state.get("format") != STATE_FORMAT or state.get("version") != STATE_VERSION:
        found = state.get("format") if isinstance(state, dict) else type(state).__name__
        raise DamagedState(f"loader state has format {found!r}, expected {STATE_FORMAT!r} v{STATE_VERSION}")
    expected = make_state(order, Cursor(0, 0), split, seq_len)
    for key in ("split", "seq_len", "n_windows", "seed", "order"):
        if state.get(key) != expected[key]:
            raise UserError(
                f"cannot resume the data loader: it was saved with {key}={state.get(key)!r}, this run has "
                f"{key}={expected[key]!r} (same dataset, seq_len, seed and shuffle are needed to continue exactly"
                f"{ORDER_HINT if key == 'order' else ''})"
            )
    epoch, consumed = state.get("epoch"), state.get("consumed")
    if type(epoch) is not int or type(consumed) is not int or epoch < 0 or not 0 <= consumed <= order.n_windows:
        raise DamagedState(
            f"loader state is damaged: epoch={epoch!r}, consumed={consumed!r} of {order.n_windows} windows"
        )
    return Cursor(epoch, consumed)
