"""Trust, round 3: a resume never silently starts over, checkpoint files carry SHA-256s, damaged datasets are named.
(Planted pickles on every checkpoint load path: tests/test_faults_security.py.)"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from pathlib import Path

import pytest

from dlx.errors import UserError
from dlx.train.checkpoint import DamagedCheckpoint, find_resumable, list_checkpoints, read_checkpoint
from dlx.train.init_from import resolve_source
from dlx.train.launch import launch
from train_helpers import TINY, train_quietly

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
        resolve_source(newest)  # model.init_from
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
