"""A job stopped by its scheduler under `dlx-torchrun` (2 ranks, gloo, CPU): Kubernetes sends SIGTERM to the
container's first process (the launcher) alone; the ranks get it from the launcher, finish their step, save a
checkpoint, and the launcher exits 143 with one line (torchrun itself exits 1 with its traceback)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

from fault_helpers import NO_PLOTS, cli_env, finish, process_tree, rank_processes, wait_for_file
from train_helpers import TINY, make_dataset

pytestmark = [pytest.mark.faults, pytest.mark.distributed]

RUN = [*TINY, "--data.num_workers", "0", "--train.max_steps", "8", "--checkpoint.every", "4"]
RUN += ["--train.global_batch_size", "4", "--parallel.strategy", "ddp"]
POINT = "train_batch@3"


def test_sigterm_to_the_launcher_ends_the_job_with_143_after_a_checkpoint(tmp_path):
    dataset = make_dataset(tmp_path / "data")
    env = cli_env(DLX_FAULT_PAUSE=POINT, DLX_FAULT_DIR=str(tmp_path))
    launcher = [sys.executable, "-m", "dlx.cli.torchrun", "--standalone", "--nproc_per_node", "2", "--no-python"]
    args = ["pretrain", *RUN, "--data.path", str(dataset), "--run-dir", str(tmp_path / "run")]
    proc = subprocess.Popen(
        [*launcher, sys.executable, "-c", NO_PLOTS, *args],
        cwd=tmp_path,
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    for rank in (0, 1):
        wait_for_file(tmp_path / f"train_batch.rank{rank}", proc)
    ranks = rank_processes(process_tree(proc.pid)[0])
    proc.send_signal(signal.SIGTERM)  # the launcher alone, as Kubernetes does
    time.sleep(1.0)  # the launcher has passed it on: the ranks hold it while they pause
    started = time.monotonic()
    for marker in tmp_path.glob("train_batch.rank*"):
        marker.unlink()
    _, err = finish(proc)
    stopped_after = time.monotonic() - started
    assert proc.returncode == 143, err[-4000:]
    assert "Traceback" not in err, err[-4000:]
    ends = [line for line in err.splitlines() if line.startswith("dlx-torchrun:")]
    assert ends == [
        "dlx-torchrun: SIGTERM received: the ranks were asked to stop after their step and save a checkpoint, with "
        "30 s before SIGKILL (--shutdown-timeout); exit 143"
    ]
    assert (tmp_path / "run" / "checkpoints" / "step-00000003").is_dir(), err[-4000:]  # the step in flight, then saved
    assert stopped_after < 30  # inside torchrun's grace period: no SIGKILL
    assert all(not p.is_running() or p.status() == "zombie" for p in ranks.values())
