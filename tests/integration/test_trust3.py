"""Trust, round 3: a resume never silently starts over, checkpoint files carry SHA-256s, damaged datasets are named.
(Planted pickles on every checkpoint load path: tests/integration/test_faults_security.py.)"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import time
from pathlib import Path

import numpy as np
import pytest

from dlx.data.loader import TokenLoader
from dlx.data.prepare import prepare_dataset
from dlx.data.shards import read_manifest, verify_shards
from dlx.data.source import LoaderSettings
from dlx.errors import UserError
from dlx.train.launch import launch
from dlx.train.rundir.checkpoint import DamagedCheckpoint, find_resumable, list_checkpoints, read_checkpoint
from dlx.train.rundir.trained import resolve_trained
from train_helpers import TINY, make_dataset, train_quietly

pytestmark = pytest.mark.usefixtures("in_process_training")

RUN = [*TINY, "--train.max_steps", "2", "--checkpoint.every", "1", "--eval.every", "0"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    return train_quietly(RUN, tmp_path_factory.mktemp("trust3") / "run")


@pytest.fixture
def run_dir(trained, tmp_path) -> Path:
    return Path(shutil.copytree(trained, tmp_path / "run"))


def folder_listing(run_dir: Path) -> dict[str, bytes]:
    return {str(p.relative_to(run_dir)): p.read_bytes() for p in sorted(run_dir.rglob("*")) if p.is_file()}


def truncate(file: Path) -> None:
    file.write_bytes(file.read_bytes()[:100])


@pytest.mark.parametrize("resume", [True, "auto"])
def test_a_resume_whose_checkpoints_are_all_damaged_is_refused_and_changes_nothing(run_dir, resume):
    for checkpoint in list_checkpoints(run_dir):
        truncate(checkpoint / "model.safetensors")
    before = folder_listing(run_dir)
    with pytest.raises(UserError) as refused:
        launch(None, [], run_dir, resume=resume)
    message = str(refused.value)
    assert "\n" not in message and "no checkpoint in" in message and "nothing was changed" in message
    assert "step-00000002 (model.safetensors has 100 bytes" in message and "step-00000001 (" in message
    assert folder_listing(run_dir) == before  # metrics.jsonl untouched, nothing set aside


def test_checkpoints_set_aside_earlier_count_as_damaged(run_dir):
    for checkpoint in list_checkpoints(run_dir):
        checkpoint.rename(checkpoint.with_name(checkpoint.name + ".damaged"))
    before = folder_listing(run_dir)
    with pytest.raises(UserError, match=r"step-00000001\.damaged \(set aside\); step-00000002\.damaged \(set aside\)"):
        launch(None, [], run_dir, resume=True)
    assert folder_listing(run_dir) == before


def test_a_folder_that_never_saved_still_starts(run_dir, capsys):
    shutil.rmtree(run_dir / "checkpoints")
    assert launch(None, [], run_dir, resume=True) == 0
    assert "has no checkpoint yet" in capsys.readouterr().err
    assert [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()] == [1, 2]


def state_of(checkpoint: Path) -> dict:
    return json.loads((checkpoint / "trainer_state.json").read_text())


def test_each_file_dlx_writes_carries_the_sha256_of_its_bytes(trained):
    for checkpoint in list_checkpoints(trained):
        files = state_of(checkpoint)["files"]
        for name in ("model.safetensors", "train_state.pt", "model_args.json"):
            expected = hashlib.sha256((checkpoint / name).read_bytes()).hexdigest()
            assert files[name] == {"size": (checkpoint / name).stat().st_size, "sha256": expected}, name


@pytest.mark.parametrize("name", ["model.safetensors", "train_state.pt"])
def test_same_size_garbage_is_damaged_and_the_resume_falls_back(run_dir, name, capsys):
    newest, previous = list_checkpoints(run_dir)[:2]
    data = bytearray((newest / name).read_bytes())
    middle = len(data) // 2
    data[middle : middle + 64] = bytes(64)  # tensor bytes: the file still parses, at its recorded size
    (newest / name).write_bytes(bytes(data))
    with pytest.raises(DamagedCheckpoint, match=f"{name} has the recorded size but not the recorded SHA-256"):
        read_checkpoint(newest)
    with pytest.raises(UserError, match=r"the checkpoint is damaged .*SHA-256"):
        resolve_trained(newest, "model.init_from")  # model.init_from
    assert find_resumable(run_dir, say=lambda line: None).path == previous


def test_checkpoints_recorded_without_sha256s_still_resume(run_dir, capsys):
    for checkpoint in list_checkpoints(run_dir):  # as dlx wrote them before the SHA-256s: sizes only
        state = state_of(checkpoint)
        state["files"] = {name: record["size"] for name, record in state["files"].items()}
        (checkpoint / "trainer_state.json").write_text(json.dumps(state))
    assert read_checkpoint(list_checkpoints(run_dir)[0]).state.step == 2
    assert launch(None, ["--train.max_steps", "3"], run_dir, resume=True) == 0
    assert "resuming from" in capsys.readouterr().out and "step-00000003" in str(list_checkpoints(run_dir)[0])


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        ({"step": "2"}, "has step '2', not a count"),
        ({"step": -5}, "has step -5, not a count"),
        ({"step": 10**20}, "has step 100000000000000000000, not a count between 0 and 1,000,000,000,000"),
        ({"step": 1}, "trainer_state.json says step 1, its folder step-00000002"),
        ({"step": None}, "has no 'step'"),
        ({"files": ["model.safetensors"]}, "'files' that is not a mapping"),
        ({"files": {"model.safetensors": "big"}}, "'files' that is not a mapping"),
        ({"files": {"../../config.yaml": 10}}, "lists ../../config.yaml, outside the checkpoint"),
    ],
)
def test_a_trainer_state_with_a_wrong_schema_is_damaged(run_dir, change, problem):
    newest, previous = list_checkpoints(run_dir)[:2]
    state = {**state_of(newest), **change}
    state = {key: value for key, value in state.items() if value is not None}
    (newest / "trainer_state.json").write_text(json.dumps(state))
    with pytest.raises(DamagedCheckpoint, match=re.escape(problem)):
        read_checkpoint(newest)
    notes = []
    assert find_resumable(run_dir, say=notes.append).path == previous and "is damaged" in notes[0]


def test_a_damaged_loader_position_falls_back_to_the_previous_checkpoint(run_dir, capsys):
    newest, previous = list_checkpoints(run_dir)[:2]
    state = state_of(newest)
    state["loader"] = {**state["loader"], "sequences": "many"}
    (newest / "trainer_state.json").write_text(json.dumps(state))
    assert launch(None, ["--train.max_steps", "3"], run_dir, resume=True) == 0
    said = "".join(capsys.readouterr())
    assert f"checkpoint {newest} is damaged: the synthetic loader state is damaged: sequences='many'" in said
    assert f"resuming from {previous}" in said


# datasets


def loader_of(folder: Path, num_workers: int) -> TokenLoader:
    return TokenLoader(folder, LoaderSettings(seq_len=16, micro_batch_size=2, num_workers=num_workers, prefetch=2))


def train_shard(folder: Path) -> Path:
    return folder / read_manifest(folder).split_shards("train")[0].name


@pytest.mark.parametrize("num_workers", [0, 1])
def test_a_shard_overwritten_in_place_after_it_was_verified_is_caught_at_the_next_checkpoint(tmp_path, num_workers):
    folder = make_dataset(tmp_path / "data")
    shard = train_shard(folder)
    with loader_of(folder, num_workers) as loader:
        for _ in range(3):
            next(loader)
        loader.verify_read_shards()  # every shard read so far is confirmed
        loader.verify_read_shards()
        tokens = np.fromfile(shard, dtype=read_manifest(folder).dtype)
        tokens[5] = (tokens[5] + 1) % 300  # another valid id, same size
        tokens.tofile(shard)
        os.utime(shard, ns=(time.time_ns(), time.time_ns() + 1_000_000))  # a write always moves mtime on
        with pytest.raises(UserError, match=f"shard {shard.name} does not match the checksum"):
            loader.verify_read_shards()


@pytest.mark.parametrize("num_workers", [0, 1])
def test_a_shard_truncated_during_the_run_is_named_not_a_sigbus(tmp_path, num_workers):
    folder = make_dataset(tmp_path / "data")
    shard = train_shard(folder)
    with loader_of(folder, num_workers) as loader:
        next(loader)
        os.truncate(shard, 64)
        shrank = rf"shard {shard.name} shrank from [\d,]+ to 64 bytes while the run read it"
        with pytest.raises(UserError, match=shrank):
            for _ in range(50):
                next(loader)


def test_token_bytes_is_checksummed_by_prepare_and_checked_by_verify_and_preflight(tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n\n".join(f"document {i}: the quick brown fox jumps over the lazy dog" for i in range(40)))
    manifest = prepare_dataset([str(corpus)], tmp_path / "ds", train_tokenizer=300, workers=1, progress=False)
    table = tmp_path / "ds" / "token_bytes.npy"
    assert manifest.token_bytes_sha256 == hashlib.sha256(table.read_bytes()).hexdigest()
    assert verify_shards(tmp_path / "ds") == []
    data = bytearray(table.read_bytes())
    data[-1] ^= 1
    table.write_bytes(bytes(data))
    changed = "token_bytes.npy: checksum mismatch (the file changed after `dlx prepare` wrote it)"
    assert verify_shards(tmp_path / "ds") == [changed]
    overrides = [*TINY, "--data.path", str(tmp_path / "ds"), "--train.max_steps", "1"]
    with pytest.raises(UserError, match=r"token_bytes\.npy: checksum mismatch"):
        launch(None, overrides, tmp_path / "run", resume=False)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        ({"eos_id": 300}, "eos_id 300 is outside the vocabulary (0 to 299)"),
        ({"bos_id": -1}, "bos_id -1 is outside the vocabulary"),
        ({"version": 2}, "version: 2 is not 1"),
        ({"shard": "../outside.bin"}, "shard name '../outside.bin' is not a file name inside the dataset folder"),
        ({"shard": "/etc/passwd"}, "shard name '/etc/passwd' is not a file name inside the dataset folder"),
    ],
)
def test_manifest_fields_are_validated(tmp_path, change, problem):
    folder = make_dataset(tmp_path / "data")
    manifest = json.loads((folder / "manifest.json").read_text())
    if "shard" in change:
        manifest["shards"][0]["name"] = change.pop("shard")
    manifest.update(change)
    (folder / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(UserError, match=re.escape(problem)):
        read_manifest(folder)
