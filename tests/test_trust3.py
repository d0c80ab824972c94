"""Trust, round 3: a resume never silently starts over, checkpoint files carry SHA-256s, damaged datasets are named.
(Planted pickles on every checkpoint load path: tests/test_faults_security.py.)"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from dlx.errors import UserError
from dlx.train.checkpoint import list_checkpoints
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
