"""The trainer's side of the worker processes: start them, take their batches in order, stop them.

Batch number k (counted from where the pool started) comes from worker k % num_workers, so batches arrive in the
schedule's order whatever the workers' relative speed. Waiting for a batch is a blocking `select` on the worker's ready
pipe that releases the GIL; its one-second timeout only re-checks that the worker is alive. A dead worker is noticed
at once anyway: its pipe reads EOF.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import weakref
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

import dlx
from dlx.data.loader import channel

LIVENESS_CHECK_S = 1.0
STOP_TIMEOUT_S = 5.0


class LoaderWorkerError(RuntimeError):
    """A loader worker process died or failed; the message names it and its exit code."""


@dataclass
class _Worker:
    index: int
    process: subprocess.Popen
    ready_fd: int
    free_fd: int
    slots: channel.SharedSlots
    freed: list[int] = field(default_factory=list)
    """Slots the trainer is done with but has not handed back yet (see `WorkerPool._release`)."""


def _child_env() -> dict[str, str]:
    """The trainer's environment, with dlx importable even when the trainer put it on sys.path by hand."""
    env = dict(os.environ)
    package_root = str(Path(dlx.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
    return env


def _start_worker(index: int, spec: dict, n_slots: int, micro_batch_size: int, seq_len: int) -> _Worker:
    shm_fd = channel.anonymous_shared_fd(channel.SharedSlots.nbytes(n_slots, micro_batch_size, seq_len))
    ready_r, ready_w = os.pipe()
    free_r, free_w = os.pipe()
    try:
        worker_spec = {**spec, "worker_id": index, "shm_fd": shm_fd, "ready_fd": ready_w, "free_fd": free_r}
        process = subprocess.Popen(
            [sys.executable, "-m", "dlx.data.loader.worker", json.dumps(worker_spec)],
            pass_fds=(shm_fd, ready_w, free_r),
            stdin=subprocess.DEVNULL,
            env=_child_env(),
        )
        slots = channel.SharedSlots(shm_fd, n_slots, micro_batch_size, seq_len)
    except BaseException:
        for fd in (ready_r, free_w):
            os.close(fd)
        raise
    finally:
        # The worker holds its own copies now; keeping ours would hide its death (no EOF) from us.
        for fd in (shm_fd, ready_w, free_r):
            os.close(fd)
    return _Worker(index, process, ready_r, free_w, slots)


def _describe_exit(code: int | None) -> str:
    if code is None:
        return "closed its pipe but is still running"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"was killed by {name} (exit code {code})"
    return f"exited with code {code}"


def _stop_workers(workers: list[_Worker]) -> None:
    """Close our pipe ends (each worker then exits on EOF or EPIPE), reap them, kill any that linger."""
    for worker in workers:
        for fd in (worker.free_fd, worker.ready_fd):
            with contextlib.suppress(OSError):
                os.close(fd)
        worker.slots.close()
    for worker in workers:
        try:
            worker.process.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            worker.process.kill()
            worker.process.wait()
    workers.clear()


class WorkerPool:
    """`num_workers` processes producing one rank's batches from a start cursor, read in order with `next_batch`."""

    def __init__(self, spec: dict, num_workers: int, n_slots: int, micro_batch_size: int, seq_len: int):
        self._workers: list[_Worker] = []
        # Runs on close(), on garbage collection and at interpreter exit, whichever comes first.
        self._finalizer = weakref.finalize(self, _stop_workers, self._workers)
        shared = {**spec, "num_workers": num_workers, "n_slots": n_slots}
        try:
            for index in range(num_workers):
                self._workers.append(_start_worker(index, shared, n_slots, micro_batch_size, seq_len))
        except BaseException:
            self.close()
            raise
        self._sequence = 0
        self._held: tuple[_Worker, int] | None = None
        self._return_at = max(1, n_slots // 2)

    @property
    def pids(self) -> list[int]:
        return [w.process.pid for w in self._workers]

    def next_batch(self) -> np.ndarray:
        """The next batch as a (2, B, seq_len) view of shared memory, valid until the next call."""
        self._release()
        worker = self._workers[self._sequence % len(self._workers)]
        message = self._receive(worker)
        kind, slot, sequence, text = message
        if kind == channel.ERROR:
            raise LoaderWorkerError(self._failure(worker, "failed") + f":\n{text.rstrip()}")
        if sequence != self._sequence:
            raise LoaderWorkerError(f"loader worker {worker.index} sent batch {sequence}, expected {self._sequence}")
        self._sequence += 1
        self._held = (worker, slot)
        return worker.slots.views[slot]

    def _receive(self, worker: _Worker) -> tuple[int, int, int, str]:
        if not channel.wait_readable(worker.ready_fd, 0):
            self._return_slots(worker)  # about to block: the worker must have every slot it can fill
            while not channel.wait_readable(worker.ready_fd, LIVENESS_CHECK_S):
                # Its exit closes the pipe (EOF), so this is only reached if something else holds the write end.
                if worker.process.poll() is not None:
                    raise LoaderWorkerError(self._failure(worker, "died"))
        message = channel.receive(worker.ready_fd)
        if message is None:
            raise LoaderWorkerError(self._failure(worker, "died"))
        return message

    def _failure(self, worker: _Worker, what: str) -> str:
        try:
            code = worker.process.wait(timeout=LIVENESS_CHECK_S)
        except subprocess.TimeoutExpired:
            code = None
        return f"loader worker {worker.index} (pid {worker.process.pid}) {what}: it {_describe_exit(code)}"

    def _release(self) -> None:
        """Mark the previous batch's slot free (the caller has copied it out by now).

        Slots go back to the worker half a ring at a time, so that it wakes once to fill several batches instead of
        once per batch: fewer context switches stealing time from the training threads. `_receive` returns them all
        before it would block, so the worker is never kept waiting for slots while the trainer waits for it.
        """
        if self._held is not None:
            worker, slot = self._held
            self._held = None
            worker.freed.append(slot)
            if len(worker.freed) >= self._return_at:
                self._return_slots(worker)

    @staticmethod
    def _return_slots(worker: _Worker) -> None:
        if not worker.freed:
            return
        # BrokenPipeError: the worker is gone; reading its next batch reports how it ended.
        with contextlib.suppress(BrokenPipeError):
            channel.send_free(worker.free_fd, worker.freed)
        worker.freed.clear()

    def close(self) -> None:
        self._finalizer()
