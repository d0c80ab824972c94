"""dlx.data.pool, the worker processes of prepare and the loader: results in order, errors named, shared memory, and no
worker left behind however the caller ends. Tasks are `eval` of a string: a function every worker can import by name."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from dlx.data.pool import WorkerError, WorkerPool
from dlx.data.shards import read_manifest
from dlx.errors import UserError


def running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def gone(pids: list[int], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while any(running(p) for p in pids):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def test_imap_gives_results_in_order_and_broadcast_reaches_every_worker():
    with WorkerPool(2) as pool:
        assert sorted(pool.broadcast(eval, "__import__('os').getpid()")) == sorted(pool.pids)
        slow_first = [f"__import__('time').sleep({0.3 if i == 0 else 0}) or {i}" for i in range(6)]
        assert list(pool.imap(eval, slow_first, window=3)) == list(range(6))
        pids = pool.pids
    assert gone(pids, timeout=0)  # close() reaps them before it returns


def test_a_user_error_stays_one_line_and_a_failure_carries_its_traceback(tmp_path):
    with WorkerPool(1, name="prepare worker") as pool:
        pool.submit(0, read_manifest, str(tmp_path / "missing"))
        with pytest.raises(UserError, match="does not exist"):
            pool.receive(0)
        pool.submit(0, eval, "1 / 0")
        with pytest.raises(WorkerError) as error:
            pool.receive(0)
        assert str(error.value) == f"prepare worker 0 (pid {pool.pids[0]}) failed: ZeroDivisionError: division by zero"
        assert error.value.worker_traceback.startswith("Traceback (most recent call last):")
        assert error.value.worker_traceback.endswith("ZeroDivisionError: division by zero")
        assert pool.broadcast(eval, "6 * 7") == [42]  # the worker serves on


def test_a_killed_worker_is_named_at_once():
    with WorkerPool(2) as pool:
        pool.submit(1, eval, "__import__('time').sleep(30)")
        victim = pool.pids[1]
        os.kill(victim, signal.SIGKILL)
        start = time.monotonic()
        with pytest.raises(WorkerError, match=rf"worker 1 \(pid {victim}\) died: it was killed by SIGKILL"):
            pool.receive(1)
        assert time.monotonic() - start < 1.0


def test_workers_share_one_block_of_memory_with_no_name():
    with WorkerPool(2, shared_bytes=4096) as pool:
        fill = "__import__('dlx.data.pool', fromlist=['_']).shared_memory().__setitem__(slice({0}, {1}), b'{2}')"
        pool.submit(0, eval, fill.format(0, 3, "abc"))
        pool.submit(1, eval, fill.format(3, 6, "def"))
        pool.receive(0), pool.receive(1)
        assert pool.shared[:6] == b"abcdef"
        assert all(not m.path.startswith("/dev/shm") for p in pool.pids for m in psutil.Process(p).memory_maps())


CALLER = """
import sys, time
from dlx.data.pool import WorkerPool
pool = WorkerPool(2)
pool.submit(0, eval, "__import__('time').sleep(60)")  # busy: only the watchdog sees the caller go
print(*pool.pids, flush=True)
time.sleep(60)
"""


def test_workers_exit_when_the_caller_is_killed():
    caller = subprocess.Popen([sys.executable, "-c", CALLER], stdout=subprocess.PIPE, text=True)
    try:
        pids = [int(p) for p in caller.stdout.readline().split()]
        assert len(pids) == 2
        caller.kill()
        caller.wait()
        assert gone(pids, timeout=2.0), "a worker outlived its caller"
    finally:
        caller.kill()
        caller.wait()
        caller.stdout.close()
