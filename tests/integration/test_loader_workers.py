"""The loader's worker processes: same batches as in-process, errors surface fast, nothing is left behind.

Every way the trainer can end (normal exit, an exception, SIGINT, SIGTERM, SIGKILL) runs a small driver script as a
subprocess and checks with psutil that its workers are gone and that they never used /dev/shm.
"""

from __future__ import annotations

import itertools
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import torch

from dataset_helpers import counting_dataset
from dlx.data.loader import TokenLoader
from dlx.data.pool import WorkerError
from dlx.data.source import LoaderSettings
from dlx.errors import UserError

DRIVER = """
import sys, time
from dlx.data.loader import TokenLoader
from dlx.data.source import LoaderSettings

folder, mode = sys.argv[1], sys.argv[2]
loader = TokenLoader(folder, LoaderSettings(seq_len=16, micro_batch_size=2, num_workers=2, prefetch=2))
if mode == "normal":
    with loader:
        for step, _ in zip(range(50), loader):
            if step == 0:
                print("WORKERS", *loader.worker_pids, flush=True)
    sys.exit(0)
for step, _ in enumerate(loader):  # no `with`: the exception and the signals must clean up on their own
    if step == 0:
        print("WORKERS", *loader.worker_pids, flush=True)
    if mode == "exception" and step == 20:
        raise RuntimeError("the trainer failed")
    time.sleep(0.01)  # a training step
"""


@pytest.fixture
def dataset(tmp_path: Path) -> Path:
    return counting_dataset(tmp_path / "data", {"train": [4000]}, vocab_size=2**16)


def is_resource_tracker(process: psutil.Process) -> bool:
    """multiprocessing's resource tracker: started by the first spawn pool in this pytest process (an in-process
    `dlx prepare`), it lives as long as pytest does and is not the loader's."""
    try:
        return "resource_tracker" in " ".join(process.cmdline())
    except psutil.Error:
        return False


@pytest.fixture(autouse=True)
def no_stray_processes():
    """Fail a test that leaves a child process behind, and kill it so that it cannot outlive the test session."""
    yield
    children = [child for child in psutil.Process().children(recursive=True) if not is_resource_tracker(child)]
    for child in children:
        child.kill()
    psutil.wait_procs(children, timeout=5)
    assert not children, f"processes left behind: {children}"


def is_gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def wait_gone(pids: list[int], timeout: float) -> list[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not all(is_gone(p) for p in pids):
        time.sleep(0.05)
    return [p for p in pids if not is_gone(p)]


def shm_mappings(pid: int) -> list[str]:
    return [m.path for m in psutil.Process(pid).memory_maps() if m.path.startswith("/dev/shm")]


def test_workers_give_the_same_batches_as_in_process(dataset: Path):
    options = {"seq_len": 16, "micro_batch_size": 3, "seed": 5}
    in_process = TokenLoader(dataset, LoaderSettings(num_workers=0, **options))
    reference = [x.clone() for x, _ in itertools.islice(in_process, 200)]
    with TokenLoader(dataset, LoaderSettings(num_workers=3, prefetch=4, **options)) as loader:
        assert loader.worker_pids == []  # started lazily, on the first batch
        batches = [x.clone() for x, _ in itertools.islice(loader, 200)]
        pids = loader.worker_pids
        assert len(pids) == 3
    assert all(torch.equal(a, b) for a, b in zip(batches, reference, strict=True))
    assert wait_gone(pids, timeout=0) == []  # close() reaps them before it returns


def test_a_killed_worker_raises_within_a_second(dataset: Path):
    with TokenLoader(dataset, LoaderSettings(seq_len=16, micro_batch_size=2, num_workers=2)) as loader:
        next(loader)
        victim = loader.worker_pids[1]
        os.kill(victim, signal.SIGKILL)
        start = time.monotonic()
        with pytest.raises(WorkerError, match=rf"loader worker 1 \(pid {victim}\).*SIGKILL \(exit code -9\)"):
            for _ in loader:  # batches it had ready come first, then the error
                assert time.monotonic() - start < 1.0
        assert time.monotonic() - start < 1.0
        assert loader.worker_pids == []  # the other worker was stopped with it
        next(loader)  # and the loader starts afresh from the same position when asked again


def test_a_shard_a_worker_cannot_open_is_named_in_one_line(dataset: Path):
    """A worker's failure with a known cause is a UserError (a failure's traceback: tests/integration/test_pool.py)."""
    loader = TokenLoader(dataset, LoaderSettings(seq_len=16, micro_batch_size=2, num_workers=1, verify=False))
    (dataset / "train-00000.bin").unlink()  # after validation: the worker cannot open its shard
    with pytest.raises(UserError, match=r"cannot read shard train-00000\.bin \(No such file or directory\)") as error:
        next(loader)
    assert "\n" not in str(error.value)
    assert loader.worker_pids == []  # the worker was stopped with the error
    loader.close()


def test_a_changed_shard_is_found_by_the_workers_while_they_build_batches(tmp_path: Path):
    dataset = counting_dataset(tmp_path / "data", {"train": [2000, 2000, 2000]}, vocab_size=2**16)
    shard = dataset / "train-00002.bin"
    data = bytearray(shard.read_bytes())
    data[0] ^= 1  # a token id still inside the vocabulary: only the checksum sees it
    shard.write_bytes(bytes(data))
    with TokenLoader(dataset, LoaderSettings(seq_len=16, micro_batch_size=2, num_workers=2, prefetch=2)) as loader:
        start = time.monotonic()
        with pytest.raises(UserError, match=rf"shard train-00002\.bin does not match the checksum.*{dataset}"):
            while time.monotonic() - start < 10:
                next(loader)
        assert loader.worker_pids == []  # the workers were stopped with the run


@pytest.mark.parametrize("ending", ["normal", "exception", "sigint", "sigterm", "sigkill"])
def test_no_process_or_shared_memory_left_after_the_trainer_ends(dataset: Path, tmp_path: Path, ending: str):
    shm_before = set(os.listdir("/dev/shm"))
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    mode = "normal" if ending == "normal" else "exception" if ending == "exception" else "train"
    # A session of its own, so that the SIGINT below can go to its whole process group, as Ctrl-C does.
    driver = subprocess.Popen(
        [sys.executable, str(script), str(dataset), mode], stdout=subprocess.PIPE, start_new_session=True
    )
    try:
        workers = read_worker_pids(driver)
        if mode == "train":
            assert all(shm_mappings(pid) == [] for pid in workers)  # their shared memory has no name to leak
            {
                "sigint": lambda: os.killpg(driver.pid, signal.SIGINT),
                "sigterm": lambda: driver.send_signal(signal.SIGTERM),
                "sigkill": lambda: driver.kill(),
            }[ending]()
        code = driver.wait(timeout=30)
    finally:
        driver.kill()
        driver.wait()
        driver.stdout.close()
    expected = {"normal": 0, "exception": 1, "sigint": -signal.SIGINT, "sigterm": -signal.SIGTERM, "sigkill": -9}
    left = wait_gone(workers, timeout=5)
    for pid in left:  # orphans are not our children: the autouse fixture cannot see them
        os.kill(pid, signal.SIGKILL)
    assert left == [], f"workers left running after {ending}"
    assert code == expected[ending]
    new_shm = {n for n in set(os.listdir("/dev/shm")) - shm_before if n.startswith(("dlx", "psm_", "torch_"))}
    assert not new_shm


def read_worker_pids(driver: subprocess.Popen, timeout: float = 60) -> list[int]:
    ready, _, _ = select.select([driver.stdout], [], [], timeout)
    assert ready, "the driver did not start its workers"
    line = driver.stdout.readline().decode().split()
    assert line[0] == "WORKERS" and len(line) == 3, line
    return [int(p) for p in line[1:]]
