"""The fault matrix, 2-rank DDP with one rank signalled: SIGINT, SIGTERM and SIGKILL to rank 1 alone (the rank
that neither prints nor writes checkpoints, so rank 0 learns of it only through the collectives), torchrun on gloo.

Both ranks pause at the same point (dlx.faults: each on its own marker) before step 5 asks for its batch; the test
signals rank 1's process, then releases both. Observed and checked:
- SIGINT or SIGTERM: an orderly stop. Rank 1 asks, the step's all-reduce tells rank 0, both stop after step 5 and
  rank 0 saves step 5's checkpoint; rank 1 exits 128 + the signal, so torchrun exits 1 (ChildFailedError).
- SIGKILL: torchrun sees rank 1 die, sends SIGTERM to rank 0 and exits 1; the newest checkpoint is step 3's.
Then, every time: no process of the job is left (torchrun, both ranks, their loader workers), nothing new in
/dev/shm, no unfinished save's temporary folder, the newest checkpoint reads back, and `dlx pretrain --resume` on
2 ranks reproduces an uninterrupted 2-rank run's losses bit for bit at every step (CPU, fp32). After the SIGKILL, a
copy also resumes in one process (DDP checkpoints hold full weights and a world-size-free loader position; the global
batch stays 4 by gradient accumulation) and reaches the same losses within float rounding.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
from pathlib import Path

import pytest

from dlx.model.io import load_model
from dlx.train.launch import launch
from dlx.train.rundir.checkpoint import list_checkpoints, read_checkpoint
from fault_helpers import (
    SIGNALS,
    cli_env,
    finish,
    leaked_shm,
    left_running,
    process_tree,
    rank_processes,
    shm_entries,
    start_torchrun,
    wait_for_file,
)
from train_helpers import TINY, losses, make_dataset

pytestmark = [pytest.mark.faults, pytest.mark.distributed, pytest.mark.usefixtures("in_process_training")]

RUN = [
    *TINY,
    "--data.num_workers",
    "1",
    "--train.max_steps",
    "8",
    "--checkpoint.every",
    "3",
    "--train.global_batch_size",
    "4",
    "--parallel.strategy",
    "ddp",
]
"""Checkpoints at steps 3, 6, 8; one loader worker per rank; global batch 4 = 2 ranks × 2, or 1 process × 2 × 2."""
POINT = "train_batch@5"
ORDERLY_STEP, LAST_BEFORE_KILL = 5, 3
VICTIM = 1
TORCHRUN_FAILED = 1
"""torchrun's exit status when a worker exited non-zero or was killed."""


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    return make_dataset(tmp_path_factory.mktemp("faults-ddp") / "data")


@pytest.fixture(scope="module")
def reference(dataset, tmp_path_factory) -> dict[int, float]:
    """Losses of an uninterrupted 2-rank run, step by step."""
    folder = tmp_path_factory.mktemp("ddp-reference")
    proc = start_torchrun(
        ["pretrain", *RUN, "--data.path", str(dataset), "--run-dir", str(folder / "run")], folder, cli_env()
    )
    _, err = finish(proc)
    assert proc.returncode == 0, err[-4000:]
    return losses(folder / "run")


@pytest.fixture(scope="module")
def signalled(dataset, tmp_path_factory):
    """signal name → the job it ended: (run folder, torchrun's exit status, its stderr, events.jsonl before any
    resume, whether any process was left, /dev/shm entries left). Each job runs once, for the tests that read it."""
    results = {}

    def run(name: str):
        if name in results:
            return results[name]
        folder = tmp_path_factory.mktemp(f"ddp-{name}")
        run_dir = folder / "run"
        markers = [folder / f"{POINT.partition('@')[0]}.rank{rank}" for rank in (0, 1)]
        shm_before = shm_entries()
        env = cli_env(DLX_FAULT_PAUSE=POINT, DLX_FAULT_DIR=str(folder))
        proc = start_torchrun(["pretrain", *RUN, "--data.path", str(dataset), "--run-dir", str(run_dir)], folder, env)
        for marker in markers:
            wait_for_file(marker, proc)
        tree = process_tree(proc.pid)
        ranks = rank_processes(tree[0])
        assert sorted(ranks) == [0, 1] and len(tree) == 5, "torchrun, 2 ranks and a loader worker each"
        assert int(markers[VICTIM].read_text()) == ranks[VICTIM].pid
        os.kill(ranks[VICTIM].pid, signal.Signals[name])
        for marker in markers:
            marker.unlink()  # both ranks go on: rank 1 to its orderly stop, or nowhere after SIGKILL
        _, err = finish(proc)
        events = (run_dir / "events.jsonl").read_text() if (run_dir / "events.jsonl").exists() else ""
        results[name] = (run_dir, proc.returncode, err, events, left_running(tree), leaked_shm(shm_before))
        return results[name]

    return run


@pytest.mark.parametrize("name", SIGNALS)
def test_ddp_rank_signalled(name, signalled, reference, tmp_path):
    run_dir, returncode, err, _, left, shm = signalled(name)
    assert returncode == TORCHRUN_FAILED, err[-4000:]
    assert not left, f"processes of the job outlived it: {left}"
    assert not shm
    if name == "SIGKILL":
        assert "exitcode: -9" in err.replace("  ", " ") or "(SIGKILL)" in err, err[-4000:]
    else:
        assert f"{name} received" in err and "--resume" in err, err[-4000:]
    newest = list_checkpoints(run_dir)[0]
    assert read_checkpoint(newest).state.step == (LAST_BEFORE_KILL if name == "SIGKILL" else ORDERLY_STEP)
    assert load_model(newest).args.dim == 64
    assert not list((run_dir / "checkpoints").glob(".*")), "an unfinished save's temporary folder was left"

    if name == "SIGKILL":  # the same checkpoint resumed in one process: world-size independent
        single = tmp_path / "single"
        shutil.copytree(run_dir, single)
        assert launch(None, [], single, resume=True) == 0
        assert losses(single) == pytest.approx(reference, rel=1e-5)

    resumed = start_torchrun(["pretrain", "--resume", "--run-dir", str(run_dir)], run_dir.parent, cli_env())
    out, err = finish(resumed)
    assert resumed.returncode == 0, err[-4000:]
    assert f"resuming from {newest}" in out
    assert losses(run_dir) == reference  # exact float equality at every step 1..8


@pytest.mark.parametrize("name", ["SIGINT", "SIGTERM"])
def test_ddp_stop_names_the_signal(name, signalled):
    """The stop that rank 1's signal caused is reported, by rank 0 (the one that prints and writes events), with that
    signal's name."""
    _, _, err, events, _, _ = signalled(name)
    stops = [{k: v for k, v in e.items() if k != "time"} for e in map(json.loads, events.splitlines())]
    stops = [e for e in stops if e["event"] == "stopped"]  # the wall-clock time left out
    assert stops == [{"event": "stopped", "step": ORDERLY_STEP, "signal": name}], events
    assert f"stopped by {name} after step {ORDERLY_STEP}" in err, err[-4000:]
