"""Fault matrix, a full disk during a checkpoint save: one line naming the checkpoint and the cause, exit status 2,
the previous checkpoint intact, no temporary folder left.

Two ways to fill the disk without root: a 1 MiB-headroom tmpfs mounted in a user namespace (`unshare`; the real
ENOSPC, skipped where unprivileged user namespaces are off), and a file-size limit (RLIMIT_FSIZE with SIGXFSZ ignored,
so write() fails with EFBIG; works everywhere on Linux).
"""

from __future__ import annotations

import resource
import shlex
import shutil
import signal
import subprocess
import sys

import pytest

from dlx.train.loop.trainer import pretrain
from dlx.train.recipe import load_recipe
from dlx.train.rundir.checkpoint import list_checkpoints, read_checkpoint
from fault_helpers import NO_PLOTS, cli_env
from train_helpers import TINY

pytestmark = [pytest.mark.faults, pytest.mark.usefixtures("in_process_training")]

FIRST = ["--train.max_steps", "3", "--checkpoint.every", "3", "--eval.every", "0"]
RESUME = ["pretrain", "--resume", "--train.max_steps", "6"]


def user_namespaces_work() -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = ["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", "mount -t tmpfs -o size=1m tmpfs /mnt"]
    return subprocess.run(probe, capture_output=True, timeout=10).returncode == 0


def first_checkpoint(run_dir, *more: str) -> int:
    """A run with its step-3 checkpoint (in-process: fast); returns the bytes the run folder takes."""
    pretrain(load_recipe(None, [*TINY, *FIRST, *more]), "disk", run_dir)
    return sum(p.stat().st_size for p in run_dir.rglob("*") if p.is_file())


def check_refused_save(result: subprocess.CompletedProcess, run_dir, cause: str) -> None:
    err = result.stderr
    assert result.returncode == 2, err
    assert err.startswith("error: cannot save checkpoint step-00000006: ") and cause in err, err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert "step-00000003) is intact" in err and "--resume" in err
    assert [p.name for p in list_checkpoints(run_dir)] == ["step-00000003"]
    assert read_checkpoint(list_checkpoints(run_dir)[0]).state.step == 3
    assert not list((run_dir / "checkpoints").glob(".*")), "the failed save's temporary folder was left"


@pytest.mark.skipif(not user_namespaces_work(), reason="unprivileged user namespaces (unshare -rm) are not available")
def test_a_full_filesystem_during_a_save(tmp_path):
    """Preflight sees room for two checkpoints; the disk fills while the step-6 save has written its weights, so the
    rest of the save meets ENOSPC. (Too little room at start is preflight's refusal:
    tests/integration/test_train_preflight.py.)"""
    first_checkpoint(tmp_path / "run")
    mount, back, faults = tmp_path / "mnt", tmp_path / "after", tmp_path / "faults"
    mount.mkdir()
    faults.mkdir()
    dlx = shlex.join([sys.executable, "-c", NO_PLOTS, *RESUME, "--run-dir", str(mount / "run")])
    marker, filler = faults / "checkpoint_save", mount / "filler"
    script = (
        f"mount -t tmpfs -o size=64m tmpfs {mount} && cp -a {tmp_path / 'run'} {mount / 'run'} && "
        f"{{ DLX_FAULT_PAUSE=checkpoint_save DLX_FAULT_DIR={faults} {dlx} & pid=$!; "
        f"while [ ! -e {marker} ]; do sleep 0.05; done; "
        f"dd if=/dev/zero of={filler} bs=64k 2>/dev/null; rm {marker}; "
        f"wait $pid; rc=$?; cp -a {mount / 'run'} {back}; exit $rc; }}"
    )
    result = subprocess.run(
        ["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", script],
        capture_output=True,
        text=True,
        env=cli_env(),
        timeout=120,
    )
    check_refused_save(result, back, "No space left on device")


def limit_file_size(limit: int):
    def preexec() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # so that write() fails with EFBIG instead of killing us
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return preexec


@pytest.mark.parametrize(
    "layout",
    [(), ("--parallel.strategy", "fsdp"), ("--parallel.strategy", "fsdp", "--checkpoint.async", "true")],
    ids=["whole", "dcp", "dcp-async"],
)
def test_a_file_size_limit_during_a_save(tmp_path, layout):
    """The whole model's files, and DCP's shards written around the page cache (`dlx.parallel.direct_write`), in the
    foreground and in the background: each write past the limit fails with EFBIG."""
    first_checkpoint(tmp_path / "run", *layout)
    largest = max(p.stat().st_size for p in list_checkpoints(tmp_path / "run")[0].rglob("*") if p.is_file())
    result = subprocess.run(
        [sys.executable, "-c", NO_PLOTS, *RESUME, *layout, "--run-dir", str(tmp_path / "run")],
        capture_output=True,
        text=True,
        env=cli_env(),
        timeout=120,
        preexec_fn=limit_file_size(largest // 2),
    )
    check_refused_save(result, tmp_path / "run", "File too large")
