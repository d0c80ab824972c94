"""`checkpoint.async`'s writer process (DCP's `AsyncCheckpointerType.PROCESS`) kept off the training's CPU.

A background thread writing a checkpoint takes its CPU from the steps that follow the save and holds the GIL while
DCP serialises: on 2 cores the step after an async save was 60-90 % slower (BENCHMARKS.md "Checkpoint cost"). DCP's
checkpoint process has a GIL of its own, and here it runs at the lowest priority (nice 19): it takes little more than
the CPU time the training leaves unused. When the training waits for the write (the next save, the end of the run) its
cores are idle and the write goes at full speed.

DCP starts that process with `multiprocessing`'s spawn at the first async save (an empty one before step 1,
`dcp.start_writer_process`): `starting_writer_process` makes that call
from a thread at nice 19, so the process and every thread it starts are born at that priority (an unprivileged thread
cannot raise its priority again, so the training's own thread is never lowered). The only dlx code the process
runs is what the storage writer carries, pickled: a `LowInWriterProcess`, whose unpickling there (once) lowers any
thread not yet lowered, keeps torch at one thread, and starts a thread
that ends the process when the training process is gone (SIGKILL, the out-of-memory killer): no writer outlives the
command that started it. A write it leaves unfinished is a `.step-*.tmp` folder, which the next save or resume
removes. `end_writer_process` ends it with the run's process group.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

import psutil

T = TypeVar("T")
WATCH_S = 0.5
SPAWN_WAIT_S = 10.0
LOWEST_NICE = 19
"""Rather than SCHED_IDLE: as cheap for the step after a save (BENCHMARKS.md "Checkpoint cost"), and a write still
moves, slowly, on a machine whose other processes keep every core busy."""
_ARRIVED: dict[str, int] = {}


class LowInWriterProcess:
    """Pickled with the storage writer; unpickled in DCP's checkpoint process, it settles that process in (once)."""

    def __init__(self, parent_pid: int) -> None:
        self.parent_pid = parent_pid

    def __reduce__(self) -> tuple[Any, tuple[int]]:
        return _arrive, (self.parent_pid,)


def low_in_writer_process() -> LowInWriterProcess:
    return LowInWriterProcess(os.getpid())


def starting_writer_process(start: Callable[[], T]) -> T:
    """`start()` (the first async save, which has DCP's executor thread spawn its checkpoint process) called from a
    thread at nice 19, so that the process is born at that priority; this process's standard error is /dev/null until
    the checkpoint process exists (at most `SPAWN_WAIT_S`), so that the process inherits that: DCP logs every request
    there at INFO on the root logger, before any dlx code runs in it, and a failed write comes back as the save's
    exception."""
    outcome: dict[str, Any] = {}

    def run() -> None:
        lower(threading.get_native_id())
        try:
            outcome["value"] = start()
        except BaseException as e:
            outcome["error"] = e

    before = {child.pid for child in psutil.Process().children()}
    sys.stderr.flush()
    kept, null = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 2)
    try:
        thread = threading.Thread(target=run, name="dlx-writer-start")
        thread.start()
        thread.join()
        deadline = time.monotonic() + SPAWN_WAIT_S
        while "value" in outcome and not _spawned_since(before) and time.monotonic() < deadline:
            time.sleep(0.005)
    finally:
        os.dup2(kept, 2)
        os.close(kept)
        os.close(null)
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


def _spawned_since(before: set[int]) -> bool:
    for child in psutil.Process().children():
        try:
            if child.pid not in before and "spawn_main" in " ".join(child.cmdline()):
                return True
        except psutil.Error:
            continue
    return False


def lower(task: int) -> None:
    """Thread `task` to nice 19, the lowest priority of the normal class (threads it starts inherit it)."""
    with contextlib.suppress(OSError):
        os.setpriority(os.PRIO_PROCESS, task, LOWEST_NICE)


def end_writer_process() -> None:
    """End DCP's checkpoint process of this process (it asks, waits 5 s, then sends SIGTERM), so that the next
    process group starts its own."""
    from torch.distributed.checkpoint import _async_process_executor as executor

    process, executor._CHECKPOINT_PROCESS = executor._CHECKPOINT_PROCESS, None
    if process is not None:
        process.__del__()


def _arrive(parent_pid: int) -> LowInWriterProcess:
    if os.getpid() != parent_pid and "parent" not in _ARRIVED:
        _ARRIVED["parent"] = parent_pid
        import torch

        torch.set_num_threads(1)
        for task in os.listdir("/proc/self/task") if os.path.isdir("/proc/self/task") else [str(os.getpid())]:
            lower(int(task))
        threading.Thread(target=_end_with_parent, args=(parent_pid,), name="dlx-writer-watch", daemon=True).start()
    return LowInWriterProcess(parent_pid)


def _end_with_parent(parent_pid: int) -> None:
    while os.getppid() == parent_pid:
        time.sleep(WATCH_S)
    os._exit(1)
