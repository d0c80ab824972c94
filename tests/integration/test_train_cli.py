"""`dlx pretrain` and `dlx generate` as a user runs them: child processes, exit codes, signals, leftovers."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from train_helpers import make_dataset, run_cli

RECIPES = Path(__file__).parents[2] / "recipes"
SMALL = ["--data.seq_len", "16", "--data.micro_batch_size", "2", "--log.every", "1", "--eval.every", "0"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--train.lr", "-1"], "error: recipe: train.lr: input should be greater than 0"),
        (
            ["--train.max_steps", "2", "--data.path", "no/such/dataset"],
            "error: data.path no/such/dataset: dataset folder no/such/dataset does not",
        ),
        ([str(RECIPES / "debug.yaml"), "--train.bogus", "1"], "error: recipe: unknown key 'train.bogus'"),
    ],
)
def test_bad_input_is_one_line_exit_2_and_writes_nothing(tmp_path, args, message):
    result = run_cli(["pretrain", *args], cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines() == [result.stderr.strip()] and result.stderr.startswith(message)
    assert list(tmp_path.iterdir()) == []


def test_train_resume_with_the_run_folder_alone_then_generate(tmp_path):
    data = make_dataset(tmp_path / "data")
    run = tmp_path / "run"
    first = run_cli(
        [
            "pretrain",
            str(RECIPES / "debug.yaml"),
            "--data.path",
            str(data),
            *SMALL,
            "--train.max_steps",
            "4",
            "--run-dir",
            str(run),
        ],
        cwd=tmp_path,
    )
    assert first.returncode == 0, first.stderr
    assert "Total optimization steps = 4" in first.stdout
    again = run_cli(["pretrain", "--run-dir", str(run), "--resume", "--train.max_steps", "6"], cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert "resuming from" in again.stdout and "step-00000004" in again.stdout
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2, 3, 4, 5, 6]
    assert [r["step"] for r in records if r.get("first_of_process")] == [1, 5]  # each start's warm-up, marked
    sample = run_cli(["generate", str(run), "--prompt", "def ", "--max-new-tokens", "8"], cwd=tmp_path)
    assert sample.returncode == 0, sample.stderr
    assert sample.stdout.startswith("def ")


@pytest.mark.timeout(180)
def test_sigterm_saves_a_checkpoint_and_leaves_no_process(tmp_path):
    data = make_dataset(tmp_path / "data")
    run = tmp_path / "run"
    args = [
        "pretrain",
        str(RECIPES / "debug.yaml"),
        "--data.path",
        str(data),
        *SMALL,
        "--data.num_workers",
        "1",
        "--train.max_steps",
        "100000",
        "--checkpoint.every",
        "0",
        "--run-dir",
        str(run),
    ]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "dlx", *args],
        cwd=tmp_path,
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if line.startswith("step 3 |") or not line:
                break
        children = psutil.Process(proc.pid).children(recursive=True)
        assert children, "the loader should run a worker process"
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert "SIGTERM received" in err and "--resume" in err
    state = json.loads(next(run.glob("checkpoints/step-*/trainer_state.json")).read_text())
    assert state["step"] >= 3
    time.sleep(0.5)
    assert not [c for c in children if c.is_running() and c.status() != psutil.STATUS_ZOMBIE]
