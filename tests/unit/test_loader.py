"""The loader in-process (num_workers=0): packing, per-epoch order across ranks, the tail, resume, bad input.

The synthetic shards hold consecutive integers, so a window's first token tells which window it is.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from dataset_helpers import counting_dataset
from dlx.data.loader import TokenLoader, document_positions
from dlx.data.source import BatchSource, LoaderSettings
from dlx.data.synthetic import SyntheticLoader
from dlx.errors import UserError

SEQ = 8


@pytest.fixture
def dataset(tmp_path: Path) -> Path:
    # 1000 tokens in uneven shards: (1000 - 1) // 8 = 124 windows, several of them crossing a shard boundary.
    return counting_dataset(tmp_path / "data", {"train": [300, 1, 450, 249], "val": [200]})


def loader(folder: Path, split: str = "train", loop: bool = True, **kwargs) -> TokenLoader:
    options = {"seq_len": SEQ, "micro_batch_size": 4, "num_workers": 0, **kwargs}
    return TokenLoader(folder, LoaderSettings(**options), split, loop)


def window_ids(inputs: torch.Tensor) -> list[int]:
    return (inputs[:, 0] // SEQ).tolist()


def take(it: TokenLoader, n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(x.clone(), y.clone()) for x, y in itertools.islice(it, n)]


def test_batches_are_packed_windows_of_the_stream_with_shifted_targets(dataset: Path):
    with loader(dataset, shuffle=False, loop=False) as it:
        batches = list(it)
    assert len(batches) == it.batches_per_epoch == 124 // 4
    stream = np.arange(1000)
    for b, (inputs, targets) in enumerate(batches):
        assert inputs.dtype == targets.dtype == torch.int64 and inputs.shape == targets.shape == (4, SEQ)
        assert inputs.is_contiguous() and targets.is_contiguous()
        for row in range(4):
            window = stream[(b * 4 + row) * SEQ :][: SEQ + 1]
            assert inputs[row].tolist() == window[:-1].tolist()
            assert targets[row].tolist() == window[1:].tolist()


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_every_window_exactly_once_per_epoch_across_ranks(dataset: Path, world_size: int):
    ranks = [loader(dataset, rank=r, world_size=world_size, seed=7) for r in range(world_size)]
    n_steps = ranks[0].batches_per_epoch
    assert n_steps == 124 // (4 * world_size)
    assert ranks[0].windows_per_epoch == n_steps * 4 * world_size
    epochs = []
    for epoch in range(3):
        seen = [w for it in ranks for x, _ in take(it, n_steps) for w in window_ids(x)]
        assert {it.epoch for it in ranks} == {epoch}
        assert len(seen) == len(set(seen)) == ranks[0].windows_per_epoch  # disjoint shares, nothing twice
        assert set(seen) <= set(range(124))
        epochs.append(seen)
    # Each epoch has its own order, and so its own skipped tail (when there is one).
    assert epochs[0] != epochs[1] != epochs[2]
    if ranks[0].windows_per_epoch < 124:
        assert set(epochs[0]) != set(epochs[1]) or set(epochs[1]) != set(epochs[2])


def test_order_depends_on_seed_only(dataset: Path):
    first = [window_ids(x) for x, _ in take(loader(dataset, seed=1), 40)]
    again = [window_ids(x) for x, _ in take(loader(dataset, seed=1), 40)]
    other = [window_ids(x) for x, _ in take(loader(dataset, seed=2), 40)]
    assert first == again != other


def test_the_window_order_is_pinned(dataset: Path):
    """Old checkpoints resume onto these windows: the order (and the state's format) must never change."""
    it = loader(dataset, seed=7, rank=1, world_size=2)
    ids = [window_ids(x) for x, _ in take(it, 20)]
    assert ids[:3] == [[28, 70, 35, 77], [2, 116, 80, 19], [61, 120, 122, 84]]
    assert ids[-3:] == [[17, 44, 101, 10], [96, 92, 46, 57], [113, 91, 79, 3]]
    assert it.state_dict() == {
        "format": "dlx-loader-state",
        "version": 1,
        "epoch": 1,
        "consumed": 40,
        "split": "train",
        "seq_len": 8,
        "n_windows": 124,
        "seed": 7,
        "order": "shuffled",
        "world_size": 2,
        "micro_batch_size": 4,
    }


def test_every_kind_of_loader_is_a_batch_source(dataset: Path):
    synthetic = SyntheticLoader(64, LoaderSettings(seq_len=SEQ, micro_batch_size=4))
    for it in (loader(dataset), synthetic):
        assert isinstance(it, BatchSource)
        assert it.source_tokens() == {} and it.new_source_epochs() == []  # one stream: no per-source figures
        with it:
            inputs, targets = next(it)
        assert inputs.shape == targets.shape == (4, SEQ) and it.worker_pids == []


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"seq_len": 0}, "seq_len must be an integer ≥ 1, got 0"),
        ({"micro_batch_size": 2.0}, "micro_batch_size must be an integer ≥ 1, got 2.0"),
        ({"num_workers": True}, "num_workers must be an integer ≥ 0, got True"),
        ({"rank": 2, "world_size": 2}, r"rank must be in \[0, world_size=2\), got 2"),
    ],
)
def test_settings_name_the_bad_field(settings: dict, message: str):
    with pytest.raises(ValueError, match=message):
        LoaderSettings(**settings)


def test_loop_false_runs_one_epoch_per_iteration(dataset: Path):
    it = loader(dataset, split="val", shuffle=False, loop=False, micro_batch_size=2)
    first, second = [window_ids(x) for x, _ in it], [window_ids(x) for x, _ in it]
    assert first == second == [[2 * b, 2 * b + 1] for b in range((199 // SEQ) // 2)]
    assert it.epoch == 1


def test_resume_gives_exactly_the_next_batches(dataset: Path):
    reference = take(loader(dataset, seed=3), 70)  # crosses two epoch boundaries (31 batches per epoch)
    for stop in (0, 5, 31, 45):
        first = loader(dataset, seed=3)
        take(first, stop)
        state = json.loads(json.dumps(first.state_dict()))
        assert all(isinstance(v, (int, str)) for v in state.values())
        resumed = loader(dataset, seed=3)
        resumed.load_state_dict(state)
        for (x, y), (ref_x, ref_y) in zip(take(resumed, 70 - stop), reference[stop:], strict=True):
            assert torch.equal(x, ref_x) and torch.equal(y, ref_y)
        assert resumed.epoch == 2


@pytest.mark.parametrize(("old", "new"), [(2, 3), (3, 1), (1, 2)])
def test_resume_on_another_world_size_splits_the_rest_of_the_epoch(dataset: Path, old: int, new: int):
    before = [loader(dataset, rank=r, world_size=old, micro_batch_size=2) for r in range(old)]
    steps = before[0].batches_per_epoch // 2
    seen = [w for it in before for x, _ in take(it, steps) for w in window_ids(x)]
    states = [it.state_dict() for it in before]
    assert all(s == states[0] for s in states)  # one state for all ranks
    after = [loader(dataset, rank=r, world_size=new, micro_batch_size=2) for r in range(new)]
    for it in after:
        it.load_state_dict(states[0])
    left = (124 - steps * old * 2) // (new * 2)
    seen += [w for it in after for x, _ in take(it, left) for w in window_ids(x)]
    assert len(seen) == len(set(seen)) > 124 - new * 2  # every window once, bar a tail shorter than one step
    assert {it.epoch for it in after} == {0}
    # The next epoch is exactly what a run on `new` ranks from the start reads in its second epoch.
    fresh = [loader(dataset, rank=r, world_size=new, micro_batch_size=2) for r in range(new)]
    for it_after, it_fresh in zip(after, fresh, strict=True):
        take(it_fresh, it_fresh.batches_per_epoch)
        for (x, _), (ref, _) in zip(take(it_after, 5), take(it_fresh, 5), strict=True):
            assert torch.equal(x, ref)
        assert it_after.epoch == it_fresh.epoch == 1


def test_state_from_another_order_is_refused(dataset: Path):
    state = loader(dataset, seed=1).state_dict()
    with pytest.raises(UserError, match="seed=1"):
        loader(dataset, seed=2).load_state_dict(state)
    with pytest.raises(UserError, match="seq_len=8"):
        loader(dataset, seed=1, seq_len=16).load_state_dict(state)


def test_manifest_fields_and_document_positions(dataset: Path):
    it = loader(dataset)
    assert (it.vocab_size, it.eos_id) == (2**20, 0)
    inputs = torch.tensor([[5, 0, 7, 8, 0, 0, 9], [0, 1, 2, 3, 4, 5, 6]])
    assert document_positions(inputs, eos_id=0).tolist() == [[0, 1, 0, 1, 2, 0, 0], [0, 0, 1, 2, 3, 4, 5]]


def _truncate_first_shard(folder: Path) -> None:
    path = folder / "train-00000.bin"
    path.write_bytes(path.read_bytes()[:-4])


def _corrupt_first_shard(folder: Path) -> None:
    path = folder / "train-00000.bin"
    data = bytearray(path.read_bytes())
    data[0] ^= 1
    path.write_bytes(bytes(data))


@pytest.mark.parametrize(
    ("damage", "options", "message"),
    [
        (lambda f: None, {"folder": "missing"}, "does not exist"),
        (lambda f: (f / "manifest.json").unlink(), {}, "manifest.json missing"),
        (lambda f: (f / "train-00001.bin").unlink(), {}, "missing"),
        (_truncate_first_shard, {}, "corrupt"),
        (lambda f: None, {"split": "val", "micro_batch_size": 25}, "fewer than one batch"),
        (lambda f: None, {"world_size": 16, "micro_batch_size": 8}, "fewer than one batch"),
    ],
)
def test_bad_input_is_one_clear_line(dataset: Path, damage, options: dict, message: str):
    damage(dataset)
    folder = dataset / options.pop("folder") if "folder" in options else dataset
    with pytest.raises(UserError, match=message) as error:
        loader(folder, **options)
    assert "\n" not in str(error.value)


def test_split_without_tokens_is_refused(tmp_path: Path):
    folder = counting_dataset(tmp_path / "data", {"train": [100]})
    with pytest.raises(UserError, match="no 'val' tokens"):
        loader(folder, split="val")


def _flip_low_bit(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[0] ^= 1  # token 751 becomes 750: still inside the vocabulary, visible to the checksum only
    path.write_bytes(bytes(data))


def test_a_changed_shard_stops_the_first_batch_that_reads_it(dataset: Path):
    _flip_low_bit(dataset / "train-00003.bin")  # tokens 751..999: windows 93 on (93 * 8 + 8 >= 751)
    it = loader(dataset, shuffle=False)
    assert len(take(it, 23)) == 23  # batches 0..22: windows 0..91, shards 0-2
    with pytest.raises(UserError, match=r"shard train-00003\.bin does not match the checksum") as error:
        next(it)  # batch 23: windows 92..95
    assert f"dlx data verify {dataset}" in str(error.value) and "\n" not in str(error.value)
    assert len(take(loader(dataset, shuffle=False, verify=False), 31)) == 31  # verify=False reads it as it is


def test_a_shard_removed_after_the_loader_opened_it_is_named(dataset: Path):
    it = loader(dataset, shuffle=False)
    (dataset / "train-00000.bin").unlink()
    with pytest.raises(UserError, match=r"cannot read shard train-00000\.bin \(No such file or directory\)") as error:
        next(it)
    assert f"dlx data verify {dataset.resolve()}" in str(error.value) and "\n" not in str(error.value)


def test_each_shard_is_hashed_once_per_process_and_only_when_read(dataset: Path, monkeypatch):
    from dlx.data import shards

    hashed, sha256_file = [], shards.sha256_file
    monkeypatch.setattr(shards, "sha256_file", lambda path: hashed.append(path.name) or sha256_file(path))
    take(loader(dataset, shuffle=False), 9)  # windows 0..35: the first shard only
    assert hashed == ["train-00000.bin"]
    take(loader(dataset, shuffle=False), 31)  # a new loader (an evaluation's, say) reads the whole epoch
    assert hashed == ["train-00000.bin", "train-00001.bin", "train-00002.bin", "train-00003.bin"]
