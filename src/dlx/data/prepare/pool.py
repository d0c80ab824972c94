"""A small process pool that never leaves a worker behind.

Why not multiprocessing.Pool or ProcessPoolExecutor: a Pool hangs forever when a worker dies mid-task, neither can
be terminated with public API on Python < 3.14, and their workers outlive a SIGKILLed parent. Here each worker has its
own pipe: a parent that dies closes it (an idle worker sees EOF and exits), a busy worker's watchdog thread sees its
parent change and exits, a worker that dies is noticed at once (its sentinel), SIGINT goes to the parent only, and
SIGTERM in the parent runs the same clean shutdown as Ctrl-C. Workers are spawned, not forked: the parent may hold
threads (a progress bar, torch, tokenizers' rayon pool) that a fork would copy in a locked state.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import signal
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Iterator
from multiprocessing.connection import wait
from typing import Any

from dlx.errors import UserError

WATCHDOG_SECONDS = 0.25
JOIN_SECONDS = 5.0
_DONE = object()


def _watch_parent(parent_pid: int) -> None:
    while True:
        time.sleep(WATCHDOG_SECONDS)
        if os.getppid() != parent_pid:
            os._exit(1)  # the parent is gone: nobody will read our results


def _worker_main(conn, parent_pid: int) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle; it then shuts us down
    os.environ["RAYON_NUM_THREADS"] = "1"  # one core per worker, also for HF tokenizers' internal thread pool
    threading.Thread(target=_watch_parent, args=(parent_pid,), daemon=True).start()
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            return
        if message is None:
            return
        fn, arg = message
        try:
            reply = ("ok", fn(arg))
        except UserError as e:
            reply = ("user", str(e))
        except BaseException:
            reply = ("error", traceback.format_exc())
        try:
            conn.send(reply)
        except OSError:  # the parent died (SIGKILL) while we worked: nobody to tell, and no traceback to print
            return


def _unwrap(reply: tuple[str, Any]) -> Any:
    status, payload = reply
    if status == "ok":
        return payload
    if status == "user":
        raise UserError(payload)
    raise RuntimeError(f"a prepare worker failed:\n{payload}")


class InlinePool:
    """The same interface, run in this process (one worker: no start-up cost, simple tracebacks)."""

    n_workers = 1

    def broadcast(self, fn: Callable[[Any], Any], arg: Any) -> None:
        fn(arg)

    def imap(self, fn: Callable[[Any], Any], items: Iterable[Any], window: int = 0) -> Iterator[Any]:
        return map(fn, items)

    def __enter__(self) -> InlinePool:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


class WorkerPool:
    """N spawned workers; `imap` returns results in submission order with at most `window` tasks ahead."""

    def __init__(self, n_workers: int):
        self.n_workers = n_workers
        self._procs: list[mp.process.BaseProcess] = []
        self._conns: list[Any] = []
        self._old_sigterm: Any = None

    def __enter__(self) -> WorkerPool:
        if threading.current_thread() is threading.main_thread():
            self._old_sigterm = signal.signal(signal.SIGTERM, _raise_keyboard_interrupt)
        ctx = mp.get_context("spawn")
        try:
            for _ in range(self.n_workers):
                parent_end, child_end = ctx.Pipe()
                proc = ctx.Process(target=_worker_main, args=(child_end, os.getpid()), daemon=True)
                proc.start()
                child_end.close()
                self._procs.append(proc)
                self._conns.append(parent_end)
        except BaseException:
            self._stop(graceful=False)
            raise
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        self._stop(graceful=exc_type is None)

    def broadcast(self, fn: Callable[[Any], Any], arg: Any) -> None:
        """Run fn(arg) once in every worker (loading the tokenizer, say), and wait for all."""
        for conn in self._conns:
            conn.send((fn, arg))
        for i, conn in enumerate(self._conns):
            _unwrap(self._receive(i, conn))

    def imap(self, fn: Callable[[Any], Any], items: Iterable[Any], window: int) -> Iterator[Any]:
        """fn over items, in order; idle workers take the next item while fewer than `window` results wait."""
        items = iter(items)
        idle = list(range(self.n_workers))
        busy: dict[int, int] = {}  # worker → sequence number of its task
        done: dict[int, Any] = {}
        submitted = yielded = 0
        exhausted = False
        while True:
            while idle and not exhausted and submitted - yielded < window:
                item = next(items, _DONE)
                if item is _DONE:
                    exhausted = True
                    break
                worker = idle.pop()
                self._conns[worker].send((fn, item))
                busy[worker] = submitted
                submitted += 1
            if yielded in done:
                yield _unwrap(done.pop(yielded))
                yielded += 1
                continue
            if not busy:
                return
            for worker in self._ready(list(busy)):
                done[busy.pop(worker)] = self._receive(worker, self._conns[worker])
                idle.append(worker)

    def _ready(self, workers: list[int]) -> list[int]:
        """Workers with a reply waiting (blocks until at least one; raises if one died)."""
        conns = {self._conns[w]: w for w in workers}
        sentinels = {self._procs[w].sentinel: w for w in workers}
        ready = wait([*conns, *sentinels])
        replies = [conns[r] for r in ready if r in conns]
        if not replies:
            dead = sentinels[ready[0]]
            self._procs[dead].join(1)
            raise RuntimeError(f"prepare worker {dead} died (exit code {self._procs[dead].exitcode})")
        return replies

    def _receive(self, worker: int, conn: Any) -> Any:
        try:
            return conn.recv()
        except (EOFError, OSError):
            self._procs[worker].join(1)
            raise RuntimeError(f"prepare worker {worker} died (exit code {self._procs[worker].exitcode})") from None

    def _stop(self, graceful: bool) -> None:
        for conn in self._conns:
            with contextlib.suppress(OSError):
                if graceful:
                    conn.send(None)
                conn.close()  # an idle worker sees EOF and exits
        deadline = time.monotonic() + (JOIN_SECONDS if graceful else 0)
        for proc in self._procs:
            proc.join(max(0.0, deadline - time.monotonic()))
            if proc.is_alive():
                proc.terminate()
                proc.join(JOIN_SECONDS)
            if proc.is_alive():
                proc.kill()
                proc.join()
        self._procs, self._conns = [], []
        if self._old_sigterm is not None:
            signal.signal(signal.SIGTERM, self._old_sigterm)
            self._old_sigterm = None


def _raise_keyboard_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def make_pool(n_workers: int) -> InlinePool | WorkerPool:
    return InlinePool() if n_workers <= 1 else WorkerPool(n_workers)
