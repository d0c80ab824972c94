"""A checkpoint written by an earlier dlx (tests/fixtures/resume_spike_run, written by make_resume_fixture.py) still
resumes: its first six losses read back, the next six as the run that wrote it recorded them and as the uninterrupted
run here, and the spike test judges from the saved window.

To 1e-6, not bit for bit: the fixture's weights come from the CPU that wrote it (an Intel Xeon), and another CPU's
kernels round last bits differently: on an AMD EPYC the uninterrupted run's losses of steps 1-6 equal the recorded
ones while its step-6 weights differ from the fixture's in every tensor (up to 4e-7), so the resumed and the
uninterrupted runs part by one float32 ulp at some later step. A lost optimizer, RNG or data-position state moves a
loss by far more than 1e-6; tests/integration/test_train_resume.py asserts bit-for-bit resume from a checkpoint this
machine wrote."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from dlx import faults
from dlx.train.launch import launch
from dlx.train.rundir.checkpoint import list_checkpoints
from train_helpers import losses

pytestmark = pytest.mark.usefixtures("in_process_training")

FIXTURES = Path(__file__).parents[1] / "fixtures"
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


def test_an_old_checkpoint_resumes_bit_identically_with_its_spike_window(run_dir, tmp_path):
    assert launch(None, [], run_dir, True) == 0
    whole = tmp_path / "whole"
    assert launch(None, EXPECTED["recipe"], whole, False) == 0  # the uninterrupted run, here
    recorded = {int(step): loss for step, loss in EXPECTED["losses"].items()}
    resumed, uninterrupted = losses(run_dir), losses(whole)
    assert {step: resumed[step] for step in range(1, 7)} == {step: recorded[step] for step in range(1, 7)}  # read back
    assert resumed == pytest.approx(recorded, rel=1e-6, abs=0)
    assert resumed == pytest.approx(uninterrupted, rel=1e-6, abs=0)
    window = saved_spike_window(list_checkpoints(run_dir)[0])
    assert window == pytest.approx(saved_spike_window(list_checkpoints(whole)[0]), rel=1e-6, abs=0)
    assert window == pytest.approx(EXPECTED["spike_window_12"], rel=1e-6, abs=0)


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
