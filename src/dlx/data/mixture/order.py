"""Which window of which source fills each slot of a mixture's stream: a pure function of (seed, position).

The stream is cut into slots, one window each, numbered 0, 1, 2, ... over the whole run (all ranks together). As in the
single-dataset loader, a micro-batch step takes the next `world_size × micro_batch_size` slots and rank `r` the `r`-th
block of `micro_batch_size`; the position (slots consumed) does not depend on the rank or the world size, so a run
resumes exactly, also on another number of ranks.

Source of a slot: a fixed pattern of `PATTERN_SLOTS` slots repeats for ever. Source `i` holds `q_i` slots of it,
its weight's share of `PATTERN_SLOTS` (largest remainders, at least one each), spread evenly: its `m`-th slot sits at
rank `(m + ½) / q_i` among all sources' slots. So after any `n` slots each source has had its share within a slot or
two per source, and the number of draws source `i` has had before position `p` is
`(p // PATTERN_SLOTS) · q_i + (draws in the pattern's first p % PATTERN_SLOTS slots)`: O(1), no history.

Window of a draw: draw `n` of source `i` is window `permutation_i(e)[n mod N_i]` with `e = n // N_i`, `N_i` the source's
windows and `permutation_i(e)` a permutation seeded by (seed, i, e). So no window of a source repeats before every
window of it has been read once (its epoch); then its next epoch starts, in a new order. A small source with a large
weight goes through more epochs than a large one; `source_epochs` says how many. A source in object storage larger
than its share of the cache is permuted in shard blocks (`dlx.data.loader.shard_blocks`) from the same seed.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dlx.data.loader.shard_blocks import block_permutation, order_name

PATTERN_SLOTS = 1 << 16
"""Slots in the repeating source pattern: the weights are realised to 1 / 65,536."""
BLOCK_STEPS = 256
"""Steps whose rows `MixWindows` works out at once."""
_STREAM = 0x6D6978
"""Mixed into the permutation seeds so that a source's order differs from the one `TokenLoader` would draw."""


def quotas(weights: tuple[float, ...], slots: int = PATTERN_SLOTS) -> np.ndarray:
    """Integer slots per source out of `slots`, proportional to `weights` (largest remainders), at least 1 each."""
    share = np.asarray(weights, dtype=np.float64)
    share = share / share.sum() * slots
    counts = np.floor(share).astype(np.int64)
    for i in np.argsort(-(share - counts), kind="stable")[: slots - int(counts.sum())]:
        counts[i] += 1
    while (counts == 0).any():  # a weight below 1 / slots of the total: give it one slot, from the largest
        counts[int(np.argmax(counts))] -= 1
        counts[int(np.argmin(counts))] += 1
    return counts


class SourcePattern:
    """The repeating pattern: `sources[j]` is the source of slot j (mod PATTERN_SLOTS); `draws_before` counts."""

    def __init__(self, weights: tuple[float, ...], slots: int = PATTERN_SLOTS):
        self.quotas = quotas(weights, slots)
        self.slots = slots
        owners = np.repeat(np.arange(len(self.quotas)), self.quotas)
        ranks = np.concatenate([(np.arange(q) + 0.5) / q for q in self.quotas])
        self.sources = owners[np.argsort(ranks, kind="stable")]  # (slots,), ties go to the lower source index
        # prefix[i, j]: slots of source i among the pattern's first j slots.
        onehot = self.sources[None, :] == np.arange(len(self.quotas))[:, None]  # (n_sources, slots)
        self.prefix = np.zeros((len(self.quotas), slots + 1), dtype=np.int64)
        np.cumsum(onehot, axis=1, out=self.prefix[:, 1:])

    def draws_before(self, position: int) -> np.ndarray:
        """Draws each source has had in slots [0, position): (n_sources,) int64."""
        cycles, offset = divmod(int(position), self.slots)
        return cycles * self.quotas + self.prefix[:, offset]

    def locate(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(source, draw number within that source) of each slot in `positions`."""
        cycles, offset = np.divmod(np.asarray(positions, dtype=np.int64), self.slots)
        source = self.sources[offset]
        return source, cycles * self.quotas[source] + self.prefix[source, offset]


@dataclass(frozen=True)
class MixOrder:
    """Which (source, window) pairs this rank reads in the micro-batch step that starts at a position."""

    n_windows: tuple[int, ...]
    """Windows in each source's training split."""
    weights: tuple[float, ...]
    micro_batch_size: int
    world_size: int
    rank: int
    seed: int
    shuffle: bool
    """False: each source's epochs read its windows 0, 1, 2, ... in order."""
    source_ids: tuple[int, ...] = ()
    """The number that seeds each source's permutations (empty: its index). A source keeps its number in every stage
    of a run (`dlx.data.stages`), so its passes go on across stages."""
    first_draws: tuple[int, ...] = ()
    """Draws each source had before position 0 of this order, in earlier stages (empty: none)."""
    block_shards: tuple[int, ...] = ()
    """With shuffle, per source: > 0 permutes it in blocks of this many shards (a source in object storage larger than
    its cache), 0 window by window (empty: every source window by window)."""
    shard_bounds: tuple[tuple[int, ...], ...] = ()
    """Per source with block_shards > 0: the first window of each shard, then its windows
    (`dlx.data.loader.shard_blocks.shard_window_bounds`); () for the others."""

    @property
    def step_windows(self) -> int:
        """Slots all ranks consume per micro-batch step."""
        return self.world_size * self.micro_batch_size

    def permutation(self, source: int, epoch: int) -> np.ndarray:
        """Source `source`'s window order in its epoch `epoch`; the same on every rank and in every worker."""
        if not self.shuffle:
            return np.arange(self.n_windows[source], dtype=np.int64)
        number = self.source_ids[source] if self.source_ids else source
        rng = np.random.default_rng([self.seed, _STREAM, number, epoch])
        if self.block_shards and self.block_shards[source]:
            return block_permutation(self.shard_bounds[source], self.block_shards[source], rng)
        return rng.permutation(self.n_windows[source])

    def source_order(self, source: int) -> str:
        """Source `source`'s order as a loader state records it: `sequential`, `shuffled` or `shard-blocks-K`."""
        return order_name(self.shuffle, self.block_shards[source] if self.block_shards else 0)

    def draw_offsets(self) -> np.ndarray:
        """`first_draws` as (n_sources,) int64: added to a source's draw number in this order to count its passes."""
        return np.asarray(self.first_draws or (0,) * len(self.n_windows), dtype=np.int64)

    def rank_slots(self, position: int) -> np.ndarray:
        """Slot numbers of this rank's micro-batch in the step that starts at `position`."""
        start = position + self.rank * self.micro_batch_size
        return np.arange(start, start + self.micro_batch_size, dtype=np.int64)


class MixWindows:
    """(source, window id) of each row of this rank's micro-batch at a position.

    Worked out for `BLOCK_STEPS` steps at a time in a few vectorised numpy calls (per step, a handful of numpy calls
    on eight rows would cost as much as reading the rows), then handed out step by step. Each source's permutation of
    its current epoch is cached (computed once per epoch of that source)."""

    def __init__(self, order: MixOrder):
        self.order = order
        self.pattern = SourcePattern(order.weights)
        self._sizes = np.asarray(order.n_windows, dtype=np.int64)
        self._offsets = order.draw_offsets()
        self._block: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self._cached: dict[tuple[int, int], np.ndarray] = {}

    def __call__(self, position: int) -> tuple[np.ndarray, np.ndarray]:
        if position not in self._block:
            positions, source, window = self.block(position)
            self._block = {p: (source[j], window[j]) for j, p in enumerate(positions)}
        return self._block[position]

    def block(self, position: int) -> tuple[list[int], np.ndarray, np.ndarray]:
        """The BLOCK_STEPS step positions from `position`, and this rank's rows for each: source and window id,
        both (BLOCK_STEPS, micro_batch_size)."""
        order = self.order
        positions = position + order.step_windows * np.arange(BLOCK_STEPS, dtype=np.int64)
        slots = (positions + order.rank * order.micro_batch_size)[:, None] + np.arange(order.micro_batch_size)
        source, draw = self.pattern.locate(slots.ravel())
        draw = draw + self._offsets[source]
        epoch, offset = np.divmod(draw, self._sizes[source])
        window = np.empty_like(draw)
        for index in range(len(order.n_windows)):
            rows = np.flatnonzero(source == index)
            if len(rows) == 0:
                continue
            # A source's draws rise with the slot, so its rows' epochs are sorted: usually one, rarely many.
            bounds = np.flatnonzero(np.diff(epoch[rows])) + 1
            for part in np.split(rows, bounds):
                window[part] = self._permutation(index, int(epoch[part[0]]))[offset[part]]
        shape = (BLOCK_STEPS, order.micro_batch_size)
        return positions.tolist(), source.reshape(shape), window.reshape(shape)

    def _permutation(self, source: int, epoch: int) -> np.ndarray:
        key = (source, epoch)
        if key not in self._cached:
            # Keep at most two epochs per source: the one being read and the next (a block may straddle them).
            for stale in [k for k in self._cached if k[0] == source and k[1] < epoch - 1]:
                del self._cached[stale]
            self._cached[key] = self.order.permutation(source, epoch)
        return self._cached[key]


def source_epochs(pattern: SourcePattern, order: MixOrder, position: int) -> list[int]:
    """The epoch each source's next draw comes from (0 until its windows have all been read once)."""
    draws = pattern.draws_before(position) + order.draw_offsets()
    return [int(d) // n for d, n in zip(draws.tolist(), order.n_windows, strict=True)]
