"""data.mix: the source pattern, each source's epochs, ranks and resume, workers, state checks and bad sources.

Each source's shards hold consecutive integers from its own offset, so a row's first token tells which source and
which window it is.
"""

from __future__ import annotations

import itertools
import json
import shutil
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from dataset_helpers import write_dataset
from dlx.data.mixture import MixtureLoader
from dlx.data.mixture.order import MixOrder, MixWindows, SourcePattern, quotas
from dlx.data.mixture.sources import mix_sources, parse_mix
from dlx.data.source import BatchSource, LoaderSettings
from dlx.errors import UserError

SEQ = 8
OFFSETS = {"big": 0, "small": 100_000}
TOKENIZER = {"model": {"type": "BPE", "vocab": {"a": 0, "b": 1}, "merges": []}, "added_tokens": []}


def write_source(folder: Path, n_tokens: int, offset: int, tokenizer: dict = TOKENIZER) -> Path:
    """A prepared dataset whose train split is offset, offset + 1, ... (one shard) and a val split of 100 tokens."""
    splits = {"train": [np.arange(offset, offset + n_tokens)], "val": [np.arange(offset + 50_000, offset + 50_100)]}
    return write_dataset(folder, splits, vocab_size=1 << 20, tokenizer=json.dumps(tokenizer))


@pytest.fixture
def sources(tmp_path: Path) -> dict[str, float]:
    """`big`: 801 tokens = 100 windows; `small`: 161 tokens = 20 windows; weights 1 : 3."""
    big = write_source(tmp_path / "big", 801, OFFSETS["big"])
    small = write_source(tmp_path / "small", 161, OFFSETS["small"])
    return {str(big): 1.0, str(small): 3.0}


def mixture(mix: dict[str, float], **kwargs) -> MixtureLoader:
    options = {"seq_len": SEQ, "micro_batch_size": 4, "num_workers": 0, **kwargs}
    return MixtureLoader(mix_sources(mix), LoaderSettings(**options))


def rows(inputs: torch.Tensor) -> list[tuple[str, int]]:
    """(source, window id) of each row."""
    out = []
    for first in inputs[:, 0].tolist():
        name = "small" if first >= OFFSETS["small"] else "big"
        out.append((name, (first - OFFSETS[name]) // SEQ))
    return out


def take(it, n: int) -> list[torch.Tensor]:
    return [x.clone() for x, _ in itertools.islice(it, n)]


def test_quotas_are_the_weights_share_of_the_pattern():
    assert quotas((1.0, 3.0), 8).tolist() == [2, 6]
    assert quotas((1.0, 1.0, 1.0), 10).tolist() == [4, 3, 3]  # largest remainders, ties to the first
    assert quotas((1.0, 1e-9), 16).tolist() == [15, 1]  # every source gets a slot
    assert int(quotas((0.3, 0.7)).sum()) == 1 << 16


def test_draws_before_a_position_are_counted_without_history():
    pattern = SourcePattern((2.0, 3.0, 5.0), slots=97)
    stream = np.tile(pattern.sources, 4)
    for position in (0, 1, 50, 96, 97, 98, 200, 388):
        expected = [int((stream[:position] == i).sum()) for i in range(3)]
        assert pattern.draws_before(position).tolist() == expected
    source, draw = pattern.locate(np.arange(300))
    for p in range(300):
        assert draw[p] == pattern.draws_before(p)[source[p]]
    # Spread evenly: after any n slots each source is within 2 slots of its share of the pattern.
    assert pattern.quotas.tolist() == [19, 29, 49]
    counts = np.cumsum(stream[None, :] == np.arange(3)[:, None], axis=1)
    share = np.arange(1, len(stream) + 1) * pattern.quotas[:, None] / 97
    assert np.abs(counts - share).max() < 2


def test_each_source_is_read_whole_before_any_window_repeats():
    order = MixOrder((10, 3), (1.0, 1.0), micro_batch_size=2, world_size=1, rank=0, seed=5, shuffle=True)
    windows = MixWindows(order)
    drawn = {0: [], 1: []}
    for position in range(0, 60, 2):
        for source, window in zip(*(a.tolist() for a in windows(position)), strict=True):
            drawn[source].append(window)
    for source, n in ((0, 10), (1, 3)):
        passes = [drawn[source][i : i + n] for i in range(0, len(drawn[source]) - n + 1, n)]
        assert all(sorted(p) == list(range(n)) for p in passes)
        assert len({tuple(p) for p in passes}) > 1  # a new order each epoch
    # A pure function of the position: a fresh reader at any position agrees.
    assert all(np.array_equal(MixWindows(order)(40)[i], windows(40)[i]) for i in range(2))


@pytest.mark.parametrize("rank", [0, 1])
def test_windows_of_a_batch_equal_the_slot_by_slot_definition(rank):
    """The fast path (consecutive draws per source) and the pattern's wrap-around against the definition."""
    order = MixOrder((7, 5, 11), (2.0, 1.0, 3.0), micro_batch_size=5, world_size=2, rank=rank, seed=9, shuffle=True)
    windows = MixWindows(order)
    for position in (0, 10, 4_000, 65_520, 65_530, 65_536 - 3, 65_536, 131_070, 10**9):
        source, draw = windows.pattern.locate(order.rank_slots(position))
        sizes = [order.n_windows[s] for s in source]
        expected = [order.permutation(s, d // n)[d % n] for s, d, n in zip(source, draw, sizes, strict=True)]
        got_source, got_window = windows(position)
        assert got_source.tolist() == source.tolist() and got_window.tolist() == expected


def test_batches_follow_the_weights_and_source_tokens_count_them(sources):
    it = mixture(sources, seed=1)
    seen = [row for x in take(it, 50) for row in rows(x)]
    counts = {name: sum(1 for s, _ in seen if s == name) for name in OFFSETS}
    assert counts == {"big": 50, "small": 150}  # 1 : 3 exactly over 200 slots
    assert it.source_tokens() == {"big": 50 * SEQ, "small": 150 * SEQ}
    assert it.names == ["big", "small"]


def test_the_mixture_order_is_pinned(sources):
    """Old checkpoints resume onto these rows: the order must never change."""
    it = mixture(sources, seed=7, rank=1, world_size=2)
    batches = [rows(x) for x in take(it, 40)]
    assert batches[0] == [("small", 11), ("big", 93), ("small", 1), ("small", 8)]
    assert batches[-1] == [("small", 8), ("big", 77), ("small", 11), ("small", 19)]
    assert it.state_dict()["position"] == 320 and it.source_tokens() == {"big": 640, "small": 1920}
    assert isinstance(it, BatchSource)


def test_a_used_up_source_starts_its_next_epoch_and_says_so(sources):
    it = mixture(sources, seed=2)
    small = []
    for x in take(it, 20):  # 80 slots: 60 from `small`, 3 epochs of its 20 windows
        small += [w for s, w in rows(x) if s == "small"]
    assert [sorted(small[i : i + 20]) for i in (0, 20, 40)] == [list(range(20))] * 3
    assert it.source_epochs() == {"big": 0, "small": 3}
    assert it.new_source_epochs() == [("small", 3)]
    assert it.new_source_epochs() == []


@pytest.mark.parametrize("world_size", [2, 3])
def test_n_ranks_read_what_one_process_reads_with_n_times_the_batch(sources, world_size):
    one = take(mixture(sources, seed=3, micro_batch_size=2 * world_size), 12)
    ranks = [mixture(sources, seed=3, micro_batch_size=2, rank=r, world_size=world_size) for r in range(world_size)]
    split = [take(it, 12) for it in ranks]
    for step in range(12):
        assert torch.equal(torch.cat([split[r][step] for r in range(world_size)]), one[step])


@pytest.mark.parametrize(("old", "new"), [(1, 2), (2, 1), (3, 2)])
def test_resume_continues_exactly_also_on_another_world_size(sources, old, new):
    reference = take(mixture(sources, seed=4, micro_batch_size=6), 30)  # one process, 6 rows per step
    before = [mixture(sources, seed=4, micro_batch_size=6 // old, rank=r, world_size=old) for r in range(old)]
    for it in before:
        take(it, 11)
    states = [json.loads(json.dumps(it.state_dict())) for it in before]
    assert all(s == states[0] for s in states)
    after = [mixture(sources, seed=4, micro_batch_size=6 // new, rank=r, world_size=new) for r in range(new)]
    for it in after:
        it.load_state_dict(states[0])
    resumed = [take(it, 19) for it in after]
    for step in range(19):
        assert torch.equal(torch.cat([resumed[r][step] for r in range(new)]), reference[11 + step])


def test_worker_processes_give_the_same_batches(sources):
    in_process = take(mixture(sources, seed=5), 25)
    with mixture(sources, seed=5, num_workers=2, prefetch=2) as it:
        assert all(torch.equal(a, b) for a, b in zip(take(it, 25), in_process, strict=True))
        assert len(it.worker_pids) == 2
    assert it.worker_pids == []


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_changed_shard_of_a_source_stops_the_run_naming_it(sources, num_workers):
    small = Path(next(path for path in sources if path.endswith("small")))
    shard = small / "train-00000.bin"
    data = bytearray(shard.read_bytes())
    data[4] ^= 1  # token 100,001 becomes 100,000: inside the vocabulary, visible to the checksum only
    shard.write_bytes(bytes(data))
    with mixture(sources, num_workers=num_workers, prefetch=2) as it:
        start = time.monotonic()  # workers verify in the background: a few batches may come before the verdict
        with pytest.raises(UserError, match=r"shard train-00000\.bin does not match the checksum") as error:
            while time.monotonic() - start < 10:
                next(it)
        assert it.worker_pids == []  # the workers were stopped with the run
    assert f"dlx data verify {small.resolve()}" in str(error.value) and "\n" not in str(error.value)
    assert len(take(mixture(sources, verify=False), 25)) == 25  # verify=False reads it as it is


def test_a_token_past_the_vocabulary_names_its_source_and_shard(sources):
    big = Path(next(path for path in sources if path.endswith("big")))
    np.full(801, 1 << 20, dtype="<u4").tofile(big / "train-00000.bin")  # one past the last id
    with pytest.raises(UserError, match=r"data\.mix source .*big: shard .*train-00000\.bin holds token id 1048576"):
        take(mixture(sources, verify=False), 25)


def test_a_state_from_another_mixture_is_refused(sources, tmp_path):
    state = mixture(sources, seed=1).state_dict()
    with pytest.raises(UserError, match="sources="):
        mixture({path: 1.0 for path in sources}, seed=1).load_state_dict(state)
    with pytest.raises(UserError, match="seed=1"):
        mixture(sources, seed=2).load_state_dict(state)
    with pytest.raises(UserError, match=r"not a data\.mix state"):
        mixture(sources).load_state_dict({"format": "dlx-loader-state", "version": 1})


def test_names_collide_then_paths_name_the_sources(tmp_path):
    a = write_source(tmp_path / "a" / "web", 100, 0)
    b = write_source(tmp_path / "b" / "web", 100, 0)
    names = [s.name for s in mix_sources({str(b): 1.0, str(a): 2.0})]
    assert names == [str(a), str(b)]  # resolved-path order, whatever order they were written in
    assert [s.name for s in mix_sources(parse_mix(f"{b}=1,{tmp_path / 'a'}=1"))] == ["a", "web"]


def test_source_that_is_not_a_prepared_dataset_is_named(sources, tmp_path):
    (tmp_path / "empty").mkdir()
    for bad, message in ((tmp_path / "missing", "does not exist"), (tmp_path / "empty", "manifest.json missing")):
        with pytest.raises(UserError, match=f"data.mix source {bad}: .*{message}") as error:
            mixture({**sources, str(bad): 1.0})
        assert "\n" not in str(error.value)


def test_sources_with_other_tokenizers_are_refused_naming_both(sources, tmp_path):
    other = {**TOKENIZER, "model": {**TOKENIZER["model"], "vocab": {"a": 0, "c": 1}}}
    odd = write_source(tmp_path / "odd", 100, 0, tokenizer=other)
    with pytest.raises(UserError) as error:
        mixture({**sources, str(odd): 1.0})
    message = str(error.value)
    assert "different tokenizers (vocabulary of 2 vs 2 ids, same size, other ids)" in message
    assert str(odd) in message and "big" in message and "\n" not in message
    resaved = tmp_path / "resaved"
    shutil.copytree(tmp_path / "small", resaved)
    (resaved / "tokenizer.json").write_text(json.dumps(TOKENIZER, indent=4, sort_keys=True))  # same content
    assert mixture({**sources, str(resaved): 1.0}).names == ["big", "resaved", "small"]
