"""A checkpoint written by an earlier dlx (tests/fixtures/resume_spike_run, written by make_resume_fixture.py) still
resumes: the same losses as the uninterrupted run, bit for bit, and the spike test judges from the saved window."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from dlx import faults
from dlx.train.checkpoint import list_checkpoints
from dlx.train.launch import launch
from train_helpers import losses

pytestmark = pytest.mark.usefixtures("in_process_training")

FIXTURES = Path(__file__).parent / "fixtures"
EXPECTED = json.loads((FIXTURES / "resume_spike_expected.json").read_text())


def saved_spike_window(checkpoint: Path) -> list[float]:
    """The spike guard's window as a checkpoint's trainer_state.json holds it (its observer state, "spikes")."""
    raw = json.loads((checkpoint / "trainer_state.json").read_text())
    return raw["observers"]["spikes"]["window"]


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "run"
    shutil.copytree(FIXTURES / "resume_spike_run", folder)
    return folder


def test_an_old_checkpoint_resumes_bit_identically_with_its_spike_window(run_dir):
    assert launch(None, [], run_dir, True) == 0
    expected = {int(step): loss for step, loss in EXPECTED["losses"].items()}
    assert losses(run_dir) == expected  # steps 1-6 read back, 7-12 trained again: equal floats
    assert saved_spike_window(list_checkpoints(run_dir)[0]) == EXPECTED["spike_window_12"]


def test_the_resumed_window_judges_the_first_step(run_dir, monkeypatch):
    monkeypatch.setenv(faults.SPIKE_ENV, "7x20")
    monkeypatch.setattr(faults, "_arrivals", {})
    assert launch(None, ["--train.max_steps", "8"], run_dir, True) == 0
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    spikes = [e for e in events if e["event"] == "loss_spike"]
    assert [e["step"] for e in spikes] == [7]
    window = json.loads((FIXTURES / "resume_spike_run/checkpoints/step-00000006/trainer_state.json").read_text())
    window = window["spike_window"]  # as the earlier dlx wrote it
    assert spikes[0]["window_mean"] == pytest.approx(sum(window) / len(window), rel=1e-12)
