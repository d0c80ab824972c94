"""The shard-block order (`dlx.data.loader.shard_blocks`): every window once per epoch, a pure function of the seed
and the epoch, in blocks of whole shards."""

from __future__ import annotations

import numpy as np
import pytest

from dlx.data.loader.order import Cursor, Order, make_state, read_state
from dlx.data.loader.shard_blocks import block_permutation, block_size, shard_window_bounds
from dlx.errors import UserError

SHARD_TOKENS = [1000, 700, 1300, 1000, 50, 900, 1000, 1100, 1000, 1000]
SEQ_LEN = 32


def order(block_shards: int, seed: int = 0) -> Order:
    n_windows = (sum(SHARD_TOKENS) - 1) // SEQ_LEN
    bounds = shard_window_bounds(SHARD_TOKENS, SEQ_LEN, n_windows)
    return Order(n_windows, 4, 1, 0, seed, True, block_shards, bounds)


def test_bounds_put_each_window_in_the_shard_of_its_first_token():
    o = order(3)
    starts = np.concatenate([[0], np.cumsum(SHARD_TOKENS)])
    for window in range(o.n_windows):
        shard = int(np.searchsorted(starts, window * SEQ_LEN, side="right")) - 1
        assert o.shard_bounds[shard] <= window < o.shard_bounds[shard + 1]
    assert o.shard_bounds[-1] == o.n_windows


def whole_shard_segments(o: Order, permutation: np.ndarray) -> int:
    """The most shards in one segment when the order is cut wherever the windows read so far are exactly those of
    whole shards; fails when the order never closes a segment."""
    bounds = np.asarray(o.shard_bounds)
    sizes = np.diff(bounds)
    shards, count, most = set(), 0, 0
    for shard in (np.searchsorted(bounds, permutation, side="right") - 1).tolist():
        shards.add(shard)
        count += 1
        if count == sum(int(sizes[s]) for s in shards):
            most, shards, count = max(most, len(shards)), set(), 0
    assert count == 0
    return most


@pytest.mark.parametrize("block_shards", [1, 3, 4, 10])
def test_each_epoch_is_a_permutation_of_all_windows_in_blocks_of_shards(block_shards):
    o = order(block_shards)
    for epoch in range(3):
        p = o.permutation(epoch)
        assert sorted(p.tolist()) == list(range(o.n_windows))
        assert np.array_equal(p, order(block_shards).permutation(epoch))  # a pure function of seed and epoch
        assert whole_shard_segments(o, p) <= block_shards  # each segment: whole shards, read together
    assert not np.array_equal(o.permutation(0), o.permutation(1))
    assert not np.array_equal(o.permutation(0), order(block_shards, seed=1).permutation(0))


def test_block_size_fits_two_blocks_in_the_cache_and_none_when_the_split_fits():
    assert block_size([100] * 16, 800) == 4
    assert block_size([100] * 16, 1600) == 0
    assert block_size([100] * 16, 150) == 1


def test_a_resume_with_another_order_is_refused():
    state = make_state(order(4), Cursor(0, 8), "train", SEQ_LEN)
    assert state["order"] == "shard-blocks-4"
    assert read_state(state, order(4), "train", SEQ_LEN) == Cursor(0, 8)
    with pytest.raises(UserError, match=r"order='shard-blocks-4', this run has order='shard-blocks-2'.*shard blocks"):
        read_state(state, order(2), "train", SEQ_LEN)


def test_empty_shards_and_a_single_block_are_permutations():
    rng = np.random.default_rng(0)
    p = block_permutation((0, 0, 5, 5, 9), 8, rng)
    assert sorted(p.tolist()) == list(range(9))
