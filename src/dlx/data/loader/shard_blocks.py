"""The shard-block order: the shuffled order of a split read through a cache smaller than the split.

A window-level shuffle reads windows from every shard in every batch; through a bounded cache that re-downloads the
dataset many times per epoch. In the shard-block order, each epoch `e` (a pure function of the seed and `e`, like the
window shuffle):

1. cuts the shards, in stream order from a random offset (wrapping around), into blocks of `block_shards` shards;
2. visits the blocks in a random order;
3. visits each block's windows in a random order (a window belongs to the shard its first token is in).

Every window is read once per epoch, as in the window shuffle. The cache holds two blocks (the one being read and the
next one, prefetched), so each shard is downloaded once per epoch, plus at most one neighbouring shard for each
block's last window when it runs on into a shard of another block: downloads per epoch ≤ the split × (1 + 1 /
block_shards). This is mosaicml streaming's block shuffle for a stream of windows that cross shard boundaries.
"""

from __future__ import annotations

import numpy as np


def order_name(shuffle: bool, block_shards: int) -> str:
    """What a loader state records as a split's order: `sequential`, `shuffled` or `shard-blocks-K`."""
    if not shuffle:
        return "sequential"
    return f"shard-blocks-{block_shards}" if block_shards else "shuffled"


def shard_window_bounds(shard_tokens: list[int], seq_len: int, n_windows: int) -> tuple[int, ...]:
    """The first window of each shard, and `n_windows` last: window `i` starts in shard `j` when
    bounds[j] ≤ i < bounds[j + 1] (window i starts at token i × seq_len of the stream)."""
    starts = np.concatenate([[0], np.cumsum(shard_tokens, dtype=np.int64)])
    first = -(-starts // seq_len)  # ceil: the first window starting at or after the shard's first token
    return tuple(int(x) for x in np.minimum(first, n_windows))


def block_size(shard_bytes: list[int], cache_bytes: int) -> int:
    """Shards per block for a cache of `cache_bytes`: two blocks of the largest shards fit; 0 when the whole split
    fits (the window shuffle then costs one download per shard)."""
    if sum(shard_bytes) <= cache_bytes:
        return 0
    return max(1, cache_bytes // (2 * max(shard_bytes)))


def block_permutation(bounds: tuple[int, ...], block_shards: int, rng: np.random.Generator) -> np.ndarray:
    """The epoch's window order (see the module's docstring), drawn from `rng`."""
    n_shards = len(bounds) - 1
    offset = int(rng.integers(block_shards)) if n_shards > block_shards else 0
    shards = np.roll(np.arange(n_shards), -offset)
    blocks = [shards[i : i + block_shards] for i in range(0, n_shards, block_shards)]
    parts = []
    for b in rng.permutation(len(blocks)).tolist():
        windows = np.concatenate([np.arange(bounds[s], bounds[s + 1], dtype=np.int64) for s in blocks[b].tolist()])
        parts.append(rng.permutation(windows))
    return np.concatenate(parts) if parts else np.empty(0, dtype=np.int64)
