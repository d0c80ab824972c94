"""A command started with SIGINT ignored (`dlx pretrain &` in a shell script, `nohup`) keeps ignoring Ctrl-C, as
every Unix program does, and still stops in order on SIGTERM. Each signal is sent while the command waits at a fault
pause point, so it cannot finish before the signal lands."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from journey_helpers import stdlib_documents, write_jsonl
from train_helpers import TINY, make_dataset


def start_with_sigint_ignored(args: list[str], cwd: Path, pause: str, faults: Path) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "DLX_FAULT_PAUSE": pause, "DLX_FAULT_DIR": str(faults)}
    return subprocess.Popen(
        [sys.executable, "-m", "dlx", *args],
        cwd=cwd,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )


def signal_at(proc: subprocess.Popen, marker: Path, signum: int) -> tuple[int, str]:
    """Once `proc` waits at its pause point: `signum` to its whole group (as Ctrl-C sends it), then let it go on."""
    deadline = time.monotonic() + 180
    while not marker.exists():
        assert proc.poll() is None, proc.stderr.read()
        assert time.monotonic() < deadline, "the command never reached its pause point"
        time.sleep(0.05)
    os.killpg(proc.pid, signum)
    time.sleep(0.5)  # the signal is handled (or ignored) while the process still waits
    marker.unlink()
    _, err = proc.communicate(timeout=180)
    return proc.returncode, err


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGINT, 0), (signal.SIGTERM, 128 + signal.SIGTERM)])
def test_the_trainer_started_with_sigint_ignored_ignores_it_and_stops_on_sigterm(tmp_path, signum, code):
    data = make_dataset(tmp_path / "data")
    faults = tmp_path / "faults"
    faults.mkdir()
    args = ["pretrain", *TINY, "--data.path", str(data), "--train.max_steps", "6", "--run-dir", str(tmp_path / "run")]
    proc = start_with_sigint_ignored(args, tmp_path, "train_batch@3", faults)
    returncode, err = signal_at(proc, faults / "train_batch", signum)
    assert returncode == code, err
    steps = [json.loads(line)["step"] for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert steps == ([1, 2, 3, 4, 5, 6] if signum == signal.SIGINT else [1, 2, 3])


def test_prepare_started_with_sigint_ignored_finishes_through_ctrl_c(tmp_path):
    corpus = write_jsonl(tmp_path / "corpus.jsonl", stdlib_documents(40))
    faults = tmp_path / "faults"
    faults.mkdir()
    args = ["prepare", str(corpus), "--train-tokenizer", "300", "--out", str(tmp_path / "out"), "--workers", "2"]
    proc = start_with_sigint_ignored([*args, "--no-progress"], tmp_path, "prepare_final", faults)
    returncode, err = signal_at(proc, faults / "prepare_final", signal.SIGINT)
    assert returncode == 0, err
    assert json.loads((tmp_path / "out" / "manifest.json").read_text())["complete"]
