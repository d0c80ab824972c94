"""The worker processes of dlx's data work: `dlx prepare` tokenizes units in them, the training loader builds batches.

A worker is a fresh interpreter running `worker_main` of this module: not a fork of the caller (whose threads, CUDA
context or locks a fork would copy) and not a multiprocessing spawn (which re-imports the caller's `__main__`). It
runs the tasks it is sent, `fn(arg)` with `fn` imported by name, so it loads only what its tasks need: numpy for the
loader, a tokenizer for prepare. Each worker has two pipes of its own:

    tasks    caller → worker   pickled (fn, arg), run in the order sent
    results  worker → caller   ("ok", value), ("user", message) for a UserError, or ("error", traceback): the caller
                               raises UserError(message), or WorkerError (one line, the traceback beside it)

An optional block of shared memory, an anonymous memfd (no name in /dev/shm, freed by the kernel with its last holder),
is mapped by the caller (`pool.shared`) and by every worker (`shared_memory()`): the loader's batches travel through
it instead of the pipes.

Nothing is left behind, however either side ends:
- workers ignore SIGINT and SIGTERM: Ctrl-C reaches the whole process group (and SLURM's SIGTERM every process of
  a step), and the caller decides what it means;
- when the caller ends (close, an exception, SIGTERM, SIGKILL) its pipe ends close: an idle worker reads EOF, a replying
  one gets EPIPE, a busy one's watchdog sees its parent change within WATCHDOG_S; each exits;
- a worker that dies closes its result pipe: the caller reads EOF at once and raises WorkerError naming the worker,
  its pid and how it ended;
- `close()` (also run on garbage collection and at interpreter exit) closes the pipes, waits STOP_TIMEOUT_S, then
  kills what lingers.
"""

from __future__ import annotations

import contextlib
import faulthandler
import mmap
import os
import pickle
import select
import signal
import subprocess
import sys
import threading
import time
import traceback
import weakref
from collections.abc import Callable, Iterable, Iterator
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any

from dlx.errors import UserError

WATCHDOG_S = 0.25
"""How often a worker checks that its parent still runs (only matters while a long task keeps it from its pipe)."""
LIVENESS_CHECK_S = 1.0
"""How often a caller waiting for a result checks that the worker still runs (its death normally shows as EOF)."""
STOP_TIMEOUT_S = 5.0
_DONE = object()
_WORKER_COMMAND = "import sys; from dlx.data.pool import worker_main; worker_main(sys.argv[1:])"


class WorkerError(RuntimeError):
    """A worker died or its task raised (not a UserError). The message is one line naming the worker, its pid and what
    happened (the exception's last line, or how the process ended); `worker_traceback` holds the worker's own
    traceback when its task raised (the caller logs it: it is the only place that says where the worker failed)."""

    def __init__(self, message: str, worker_traceback: str = ""):
        super().__init__(message)
        self.worker_traceback = worker_traceback


def anonymous_shared_fd(size: int) -> int:
    """A file descriptor of `size` bytes of shared memory that has no name anywhere (nothing to clean up)."""
    if hasattr(os, "memfd_create"):
        fd = os.memfd_create("dlx-pool", os.MFD_CLOEXEC)
    else:  # other POSIX systems: a temporary file unlinked at once serves the same purpose
        import tempfile

        fd, path = tempfile.mkstemp(prefix="dlx-pool-")
        os.unlink(path)
    os.ftruncate(fd, size)
    return fd


def _child_env() -> dict[str, str]:
    """The caller's environment, with dlx importable even when the caller put it on sys.path by hand; one thread
    for HF tokenizers' internal pool (each worker is one core's worth of work)."""
    env = dict(os.environ)
    package_root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
    env["RAYON_NUM_THREADS"] = "1"
    return env


def _readable(conn: Connection, timeout: float) -> bool:
    """Whether `conn` has data or EOF within `timeout` seconds (select releases the GIL; cheaper than conn.poll)."""
    return bool(select.select([conn.fileno()], [], [], timeout)[0])


_SIGNAL_HINTS = {
    "SIGBUS": ": a file it had memory-mapped, such as a dataset shard, shrank or became unreadable while it read it; "
    "its Python stack is above",
    "SIGSEGV": ": its Python stack is above",
}
"""What a signal that the worker's own code raised says about the cause (faulthandler printed where it was)."""


def _describe_exit(code: int | None) -> str:
    if code is None:
        return "closed its pipe but is still running"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"was killed by {name} (exit code {code}){_SIGNAL_HINTS.get(name, '')}"
    return f"exited with code {code}"


class _Worker:
    """One worker process and the caller's ends of its pipes."""

    def __init__(self, index: int, shared_fd: int | None):
        task_r, task_w = os.pipe()
        result_r, result_w = os.pipe()
        child_fds = [task_r, result_w] + ([shared_fd] if shared_fd is not None else [])
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-c", _WORKER_COMMAND, str(os.getpid()), *map(str, child_fds)],
                pass_fds=child_fds,
                stdin=subprocess.DEVNULL,
                env=_child_env(),
            )
        except BaseException:
            os.close(task_w)
            os.close(result_r)
            raise
        finally:
            # The worker holds its own copies now; keeping ours would hide its death (no EOF) from us.
            os.close(task_r)
            os.close(result_w)
        self.index = index
        self.tasks = Connection(task_w, readable=False)
        self.results = Connection(result_r, writable=False)

    def close_pipes(self) -> None:
        for conn in (self.tasks, self.results):
            with contextlib.suppress(OSError):
                conn.close()


def _stop(workers: list[_Worker], shared: list[mmap.mmap], grace_s: float) -> None:
    """Close our pipe ends (each worker then exits on EOF or EPIPE), reap the workers, kill any that linger."""
    for worker in workers:
        worker.close_pipes()
    deadline = time.monotonic() + grace_s
    for worker in workers:
        try:
            worker.process.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            worker.process.kill()
            worker.process.wait()
    workers.clear()
    for block in shared:
        with contextlib.suppress(BufferError):  # a view is still referenced somewhere; the mapping goes when it does
            block.close()
    shared.clear()


class WorkerPool:
    """`n_workers` worker processes; tasks go to a chosen worker (`submit`) and results come back in order per worker
    (`receive`), or to all (`broadcast`), or spread over idle workers with results in order (`imap`)."""

    def __init__(self, n_workers: int, shared_bytes: int = 0, name: str = "worker", sigterm_interrupts: bool = False):
        """`shared_bytes`: a block of shared memory every worker maps. `sigterm_interrupts`: while the pool is used
        as a context manager (in the main thread), SIGTERM raises KeyboardInterrupt, so that it stops the work as
        Ctrl-C does (for batch jobs such as prepare; a trainer handles SIGTERM itself)."""
        self.n_workers, self.name = n_workers, name
        self._workers: list[_Worker] = []
        self._shared: list[mmap.mmap] = []
        self._old_sigterm: Any = None
        self._sigterm_interrupts = sigterm_interrupts
        self._finalizer = weakref.finalize(self, _stop, self._workers, self._shared, STOP_TIMEOUT_S)
        shared_fd = anonymous_shared_fd(shared_bytes) if shared_bytes else None
        try:
            if shared_fd is not None:
                self._shared.append(mmap.mmap(shared_fd, shared_bytes))
            for index in range(n_workers):
                self._workers.append(_Worker(index, shared_fd))
        except BaseException:
            self.close(graceful=False)
            raise
        finally:
            if shared_fd is not None:
                os.close(shared_fd)

    @property
    def shared(self) -> mmap.mmap:
        """The shared memory block (the workers see the same bytes through `shared_memory()`)."""
        return self._shared[0]

    @property
    def pids(self) -> list[int]:
        return [w.process.pid for w in self._workers]

    def submit(self, worker: int, fn: Callable[[Any], Any], arg: Any) -> None:
        """Queue fn(arg) on one worker; it runs after the tasks queued before it there. Does not wait."""
        try:  # plain pickle: half the cost of Connection.send's ForkingPickler for these small messages
            self._workers[worker].tasks.send_bytes(pickle.dumps((fn, arg), protocol=pickle.HIGHEST_PROTOCOL))
        except OSError:  # the worker is gone: say how it ended
            raise WorkerError(self._failure(self._workers[worker], "died")) from None

    def ready(self, worker: int) -> bool:
        """Whether the worker's next result (or its death) is there to receive without waiting."""
        return _readable(self._workers[worker].results, 0)

    def receive(self, worker: int) -> Any:
        """The result of the oldest task of `worker` not received yet (waiting for it; the GIL is released);
        its UserError is raised as UserError, any other failure or the worker's death as WorkerError."""
        w = self._workers[worker]
        while not _readable(w.results, LIVENESS_CHECK_S):
            if w.process.poll() is not None:  # its exit closes the pipe; this is only reached if another holds it
                raise WorkerError(self._failure(w, "died"))
        try:
            status, payload = w.results.recv()
        except (EOFError, OSError):
            raise WorkerError(self._failure(w, "died")) from None
        if status == "ok":
            return payload
        if status == "user":
            raise UserError(payload)
        last = payload.rstrip().splitlines()[-1] if payload.strip() else "no traceback"
        raise WorkerError(f"{self.name} {w.index} (pid {w.process.pid}) failed: {last}", payload.rstrip())

    def broadcast(self, fn: Callable[[Any], Any], arg: Any) -> list[Any]:
        """fn(arg) once in every worker (loading a tokenizer, say); waits for all and returns their results."""
        for index in range(self.n_workers):
            self.submit(index, fn, arg)
        return [self.receive(index) for index in range(self.n_workers)]

    def imap(self, fn: Callable[[Any], Any], items: Iterable[Any], window: int) -> Iterator[Any]:
        """fn over items, results in order; an idle worker takes the next item while fewer than `window` results
        wait to be yielded (so memory stays bounded when one slow item holds up the order)."""
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
                self.submit(worker, fn, item)
                busy[worker], submitted = submitted, submitted + 1
            if yielded in done:
                yield done.pop(yielded)
                yielded += 1
                continue
            if not busy:
                return
            for worker in self._wait_any(list(busy)):
                done[busy.pop(worker)] = self.receive(worker)
                idle.append(worker)

    def _wait_any(self, workers: list[int]) -> list[int]:
        """Those of `workers` with a result (or EOF) waiting; blocks until there is one."""
        by_conn = {self._workers[w].results: w for w in workers}
        while True:
            ready = wait(list(by_conn), LIVENESS_CHECK_S)
            if ready:
                return [by_conn[conn] for conn in ready]
            for w in workers:
                if self._workers[w].process.poll() is not None:
                    return [w]  # receive() reports how it ended

    def _failure(self, worker: _Worker, what: str) -> str:
        try:
            code = worker.process.wait(timeout=LIVENESS_CHECK_S)
        except subprocess.TimeoutExpired:
            code = None
        return f"{self.name} {worker.index} (pid {worker.process.pid}) {what}: it {_describe_exit(code)}"

    def close(self, graceful: bool = True) -> None:
        """Stop the workers (idempotent). `graceful`: give them STOP_TIMEOUT_S to exit after their pipes close,
        else kill them at once (a worker may be in the middle of a long task)."""
        if not graceful:
            _stop(self._workers, self._shared, 0.0)
        self._finalizer()
        if self._old_sigterm is not None:
            signal.signal(signal.SIGTERM, self._old_sigterm)
            self._old_sigterm = None

    def __enter__(self) -> WorkerPool:
        if self._sigterm_interrupts and threading.current_thread() is threading.main_thread():
            self._old_sigterm = signal.signal(signal.SIGTERM, _raise_keyboard_interrupt)
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        self.close(graceful=exc_type is None)


def _raise_keyboard_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


class InlinePool:
    """The same interface run in this process (one worker: no start-up cost, plain tracebacks)."""

    n_workers = 1

    def broadcast(self, fn: Callable[[Any], Any], arg: Any) -> list[Any]:
        return [fn(arg)]

    def imap(self, fn: Callable[[Any], Any], items: Iterable[Any], window: int = 0) -> Iterator[Any]:
        return map(fn, items)

    def __enter__(self) -> InlinePool:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


def make_pool(n_workers: int) -> InlinePool | WorkerPool:
    """For batch jobs (prepare): in this process when one worker is asked for, else worker processes that SIGTERM
    stops as Ctrl-C does."""
    return InlinePool() if n_workers <= 1 else WorkerPool(n_workers, name="prepare worker", sigterm_interrupts=True)


# The worker's side.

_shared_block: mmap.mmap | None = None


def shared_memory() -> mmap.mmap:
    """In a worker: the pool's shared memory block (what the caller sees as `pool.shared`)."""
    if _shared_block is None:
        raise RuntimeError("this process is not a pool worker with shared memory")
    return _shared_block


def _watch_parent(parent_pid: int) -> None:
    while os.getppid() == parent_pid:
        time.sleep(WATCHDOG_S)
    os._exit(1)  # the caller is gone (maybe before we started): nobody will read our results


def _serve(tasks: Connection, results: Connection) -> None:
    while True:
        try:
            fn, arg = tasks.recv()
        except (EOFError, OSError):
            return  # the caller closed the pool, or died
        try:
            reply = ("ok", fn(arg))
        except UserError as e:
            reply = ("user", str(e))
        except BaseException:
            reply = ("error", traceback.format_exc())
        try:
            results.send_bytes(pickle.dumps(reply, protocol=pickle.HIGHEST_PROTOCOL))
        except OSError:
            return


def worker_main(argv: list[str]) -> None:
    """A worker's life: serve tasks from the pipe named in `argv` until the caller closes it or goes away."""
    global _shared_block
    faulthandler.enable()  # a SIGBUS/SIGSEGV (a shard truncated under its map) prints the worker's stack to stderr
    # Ctrl-C, and SIGTERM sent to the whole group (SLURM signals every process of a step), are the caller's to handle;
    # it then stops us (pipes closed, SIGKILL after a grace period)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    parent_pid, task_fd, result_fd, *shared_fd = map(int, argv)
    threading.Thread(target=_watch_parent, args=(parent_pid,), daemon=True).start()
    if shared_fd:
        _shared_block = mmap.mmap(shared_fd[0], 0)
    _serve(Connection(task_fd, writable=False), Connection(result_fd, readable=False))
