"""Self-healing under torchrun (2 ranks, gloo, CPU): a rank SIGKILLed by pid in a `--max-restarts 1` job with
`--resume auto` is restarted and the job finishes with the uninterrupted run's losses bit for bit; a SIGSTOPped rank
is named in one line when the collective times out; two launchers joined by a c10d rendezvous on 127.0.0.1 (two
nodes on one machine) reproduce a one-node run's losses; records carry the per-rank step times."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from fault_helpers import cli_env, finish, process_tree, rank_processes, start_torchrun, wait_for_file
from train_helpers import TINY, losses, make_dataset

pytestmark = [pytest.mark.faults, pytest.mark.distributed]

RUN = [*TINY, "--data.num_workers", "0", "--train.max_steps", "8", "--checkpoint.every", "3"]
RUN += ["--train.global_batch_size", "4", "--parallel.strategy", "ddp"]
POINT = "train_batch@5"


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    return make_dataset(tmp_path_factory.mktemp("heal-ranks") / "data")


@pytest.fixture(scope="module")
def reference(dataset, tmp_path_factory) -> Path:
    """An uninterrupted 2-rank run on one node."""
    folder = tmp_path_factory.mktemp("reference")
    proc = start_torchrun(
        ["pretrain", *RUN, "--data.path", str(dataset), "--run-dir", str(folder / "run")], folder, cli_env()
    )
    _, err = finish(proc)
    assert proc.returncode == 0, err[-4000:]
    return folder / "run"


def test_records_carry_per_rank_step_times(reference):
    records = [json.loads(line) for line in (reference / "metrics.jsonl").read_text().splitlines()]
    for record in records:
        assert 0 < record["rank_step_s_min"] <= record["rank_step_s_median"] <= record["rank_step_s_max"]
        assert record["slowest_rank"] in (0, 1)


def paused_ranks(proc: subprocess.Popen, folder: Path) -> dict[int, int]:
    """Wait until both ranks pause at POINT; their pids by rank."""
    for rank in (0, 1):
        wait_for_file(folder / f"train_batch.rank{rank}", proc)
    return {rank: p.pid for rank, p in rank_processes(process_tree(proc.pid)[0]).items()}


def release_until_done(proc: subprocess.Popen, folder: Path, timeout: float = 120) -> tuple[str, str]:
    """Let paused ranks go (the restarted attempt pauses at POINT again) until the job ends."""
    deadline = time.monotonic() + timeout
    while proc.poll() is None and time.monotonic() < deadline:
        for marker in folder.glob("train_batch.rank*"):
            marker.unlink(missing_ok=True)
        time.sleep(0.05)
    return finish(proc, 5)


def test_max_restarts_with_resume_auto_heals_a_killed_rank(dataset, reference, tmp_path):
    run_dir = tmp_path / "run"
    env = cli_env(DLX_FAULT_PAUSE=POINT, DLX_FAULT_DIR=str(tmp_path))
    launch = ["--standalone", "--nproc_per_node", "2", "--max-restarts", "1"]
    args = ["pretrain", *RUN, "--data.path", str(dataset), "--run-dir", str(run_dir), "--resume", "auto"]
    proc = start_torchrun(args, tmp_path, env, launch=launch)
    pids = paused_ranks(proc, tmp_path)
    os.kill(pids[1], signal.SIGKILL)  # from outside, by pid, as a failing node would
    out, err = release_until_done(proc, tmp_path)
    assert proc.returncode == 0, err[-4000:]
    assert "resuming from" in out and "step-00000003" in out
    assert losses(run_dir) == losses(reference)  # exact float equality at every step 1..8
    kinds = [e["event"] for e in map(json.loads, (run_dir / "events.jsonl").read_text().splitlines())]
    assert [kind for kind in kinds if kind not in ("start", "checkpoint")] == ["resume"]


def test_a_stopped_rank_is_named(dataset, tmp_path):
    env = cli_env(DLX_FAULT_PAUSE=POINT, DLX_FAULT_DIR=str(tmp_path))
    args = ["pretrain", *RUN, "--data.path", str(dataset), "--run-dir", str(tmp_path / "run")]
    proc = start_torchrun([*args, "--parallel.timeout_s", "4"], tmp_path, env)
    pids = paused_ranks(proc, tmp_path)
    os.kill(pids[1], signal.SIGSTOP)
    started = time.monotonic()
    for marker in tmp_path.glob("train_batch.rank*"):
        marker.unlink()
    seen = []
    try:
        for line in proc.stderr:  # until rank 0 names the rank it waited for
            seen.append(line)
            if "did not arrive" in line:
                break
        named_after = time.monotonic() - started
    finally:
        os.kill(pids[1], signal.SIGKILL)  # instead of torchrun's 30 s wait for a stopped rank to take SIGTERM
    _, rest = finish(proc)
    named = [line for line in [*seen, *rest.splitlines()] if "did not arrive" in line]
    assert len(named) == 1, "".join(seen)[-4000:] + rest[-4000:]
    assert named[0].startswith("error: a collective failed") and "rank 1 did not arrive" in named[0]
    assert "at step 5, forward and backward" in named[0] and f"pid {pids[1]}" in named[0]
    assert 4 <= named_after < 4 + 60


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_nodes_on_one_machine_equal_one_node(dataset, reference, tmp_path):
    port = free_port()
    args = ["pretrain", *RUN, "--data.path", str(dataset), "--run-dir", str(tmp_path / "run")]
    launch = ["--nnodes", "2", "--nproc_per_node", "1", "--rdzv-backend", "c10d"]
    launch += ["--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "two-nodes"]
    nodes = [start_torchrun(args, tmp_path, cli_env(), launch=launch) for _ in range(2)]
    for node in nodes:
        _, err = finish(node)
        assert node.returncode == 0, err[-4000:]
    assert losses(tmp_path / "run") == losses(reference)


@pytest.mark.usefixtures("in_process_training")
def test_a_two_rank_run_resumes_on_one_rank_keeping_the_global_batch(reference, tmp_path):
    import shutil

    from dlx.errors import UserError
    from dlx.train.launch import launch

    run_dir = tmp_path / "run"
    shutil.copytree(reference, run_dir)
    with pytest.raises(UserError, match=r"global_batch_size 4 is not a multiple of data\.micro_batch_size × world"):
        launch(None, ["--train.max_steps", "10", "--data.micro_batch_size", "3"], run_dir, "auto")
    assert launch(None, ["--train.max_steps", "10"], run_dir, "auto") == 0  # 1 rank × 2 sequences × 2 micro-steps
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records][-2:] == [9, 10] and losses(run_dir)[8] == losses(reference)[8]
