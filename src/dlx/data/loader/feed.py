"""Where the loader's batches are built: in the calling thread (`InProcessFeed`, num_workers=0) or by worker processes
of `dlx.data.pool` into shared memory (`WorkerFeed`). Both give the same batches in the same order and check what they
read: every token id below the vocabulary size, every shard's SHA-256 against the manifest.

With workers, batch number k (counted from where the feed started) is built by worker k % num_workers into slot
k % n_slots of one shared block of n_slots = num_workers × prefetch batches; the trainer reads them back in order.
Each batch is one small task message (the slot and the cursor) and one small reply; the tokens never pass through a
pipe. Tasks go out half a ring at a time, so that a worker wakes once to fill several batches (fewer context switches
stealing time from the training threads), and always before the trainer would block.

Checksums are verified once per process, the first time the reader maps a shard: in a worker by a background thread
(each worker checks every num_workers-th shard of the split, while it builds batches, so the step does not wait), in
the calling thread (num_workers=0) when a batch first touches the shard. A mismatch stops the run with a UserError
that names the shard. A worker's background thread may not have reached a shard when a batch from it is consumed:
`ReadShards` keeps such shards (each reply of a worker names the shards its thread confirmed since the last), and
`ReadShards.verify` hashes what is still unconfirmed, so that a caller (the trainer, before it publishes a checkpoint
or ends a run) knows every shard its batches came from is intact. `verify` also hashes again every confirmed shard
whose size or modification time changed since it was confirmed (one stat per shard): a shard overwritten in place
during the run is caught at the next checkpoint or at the end.

Before each batch, the reader compares the size of every shard the batch reads with the size it had when first read:
a shard truncated during the run stops it with a UserError naming the shard, instead of a SIGBUS when the memory map
reads past the file's new end (a truncation during the copy of one batch can still raise SIGBUS: a worker's death then
names the shards that batch was reading).

This module needs numpy only (the workers import it without torch or pydantic, so they start fast).
"""

from __future__ import annotations

import collections
import itertools
import threading
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from dlx.data.loader.order import Cursor
from dlx.data.loader.plan import BatchPlan
from dlx.data.pool import WorkerError, WorkerPool, shared_memory
from dlx.errors import UserError
from dlx.faults import pause_point

_verified: set[tuple[str, int, int, str]] = set()
"""Shards this process has verified: (path, size, mtime_ns, sha256). A rebuilt loader (an evaluation's) skips them."""


@dataclass(frozen=True)
class ReaderJob:
    """What a reader needs to build one rank's batches; sent to each worker once."""

    plan: BatchPlan
    """Which windows each batch holds (`dlx.data.loader.plan`)."""
    vocab_size: int
    checksums: tuple[tuple[str, str], ...]
    """(shard path, the manifest's SHA-256) of each shard the plan reads (empty: do not verify)."""
    n_slots: int = 0
    worker: int = 0
    num_workers: int = 1


def _shard_key(path: Path, sha256: str) -> tuple[str, int, int, str]:
    stat = path.stat()
    return str(path), stat.st_size, stat.st_mtime_ns, sha256


def verify_shard(shard: str, sha256: str) -> None:
    """UserError unless the shard's SHA-256 is the manifest's (once per process per unchanged file)."""
    path = Path(shard)
    folder, name = path.parent, path.name
    from dlx.data.shards import sha256_file  # imports pydantic: kept off a worker's start

    try:
        key = _shard_key(path, sha256)
        matches = key in _verified or sha256_file(path) == sha256
    except OSError as e:
        raise UserError(
            f"dataset {folder}: cannot read shard {name} ({e.strerror}); run `dlx data verify {folder}` and "
            "`dlx prepare` again if it is missing"
        ) from None
    if not matches:
        raise UserError(
            f"dataset {folder}: shard {name} does not match the checksum in its manifest (the file changed after "
            f"`dlx prepare` wrote it); run `dlx data verify {folder}` to list every damaged file, then `dlx prepare` "
            "again"
        )
    _verified.add(key)


class ReadShards:
    """The shards that consumed batches were read from and that no verification has confirmed yet (a worker's
    background thread, or `verify`); one per loader, kept across its feeds (epochs, resumes)."""

    def __init__(self) -> None:
        self.confirmed: set[str] = set()
        self.unconfirmed: dict[str, str] = {}
        """shard path → the manifest's SHA-256."""
        self.checksums: dict[str, str] = {}
        """shard path → the manifest's SHA-256, for every shard a feed of this loader may read."""
        self._stats: dict[str, tuple[int, int]] = {}
        """confirmed shard path → (size, mtime_ns) when it was confirmed."""

    def note_read(self, shards: set[str], checksums: dict[str, str]) -> None:
        """`shards` were read by a consumed batch; those with a checksum here (a cache verifies its own) are to be
        confirmed."""
        for shard in shards - self.confirmed:
            if shard in checksums:
                self.unconfirmed[shard] = checksums[shard]

    def confirm(self, shards: list[str]) -> None:
        self.confirmed.update(shards)
        for shard in shards:
            self.unconfirmed.pop(shard, None)
            self._stats[shard] = _stat(shard)

    def _changed_since_confirmed(self) -> list[str]:
        return [shard for shard, stat in self._stats.items() if _stat(shard) != stat and shard in self.checksums]

    def verify(self) -> list[str]:
        """Hash here every read shard not confirmed yet, and every confirmed one whose size or modification time
        changed since (UserError naming the first that does not match); returns the shards hashed."""
        for shard in self._changed_since_confirmed():
            self.confirmed.discard(shard)
            self.unconfirmed[shard] = self.checksums[shard]
        hashed = sorted(self.unconfirmed)
        for shard in hashed:
            verify_shard(shard, self.unconfirmed[shard])
            self.confirm([shard])
        return hashed


def _stat(shard: str) -> tuple[int, int]:
    try:
        stat = Path(shard).stat()
    except OSError:
        return (-1, -1)  # missing now: differs from any stat taken before, so `verify` names it
    return stat.st_size, stat.st_mtime_ns


class _BackgroundVerifier:
    """Verifies some shards in a daemon thread (hashlib releases the GIL); `failure` holds the first mismatch or
    unreadable shard, `done` the shards verified so far, in order."""

    def __init__(self, shards: list[tuple[str, str]]):
        self.failure: str | None = None
        self.done: list[str] = []
        self._thread = threading.Thread(target=self._run, args=(shards,), daemon=True)
        self._thread.start()

    def _run(self, shards: list[tuple[str, str]]) -> None:
        pause_point("shard_verify")  # test-only, off by default: see dlx.faults
        for shard, sha256 in shards:
            try:
                verify_shard(shard, sha256)
            except UserError as e:
                self.failure = str(e)
                return
            self.done.append(shard)

    def join(self) -> None:
        self._thread.join()


class BatchReader:
    """Builds this rank's batches from the shards: (2, B, seq_len) int64, inputs and targets shifted by one."""

    def __init__(self, job: ReaderJob, background: bool):
        """`background`: verify this worker's share of the shards in a thread; else each shard on first touch."""
        self.job = job
        self._verifier: _BackgroundVerifier | None = None
        self._reported = 0  # how many of the verifier's done shards a reply has named
        self._unchecked: dict[str, str] = {}
        self._verified_here: list[str] = []  # verified in this thread (num_workers=0), not reported yet
        self._sizes: dict[str, int] = {}  # each shard's size when first read
        if job.checksums and background:
            self._verifier = _BackgroundVerifier(list(job.checksums[job.worker :: job.num_workers]))
        elif job.checksums:
            self._unchecked = dict(job.checksums)

    def fill(self, cursor: Cursor | int, out: np.ndarray) -> None:
        plan = self.job.plan
        if self._verifier is not None and self._verifier.failure:
            raise UserError(self._verifier.failure)
        shards = plan.shards_of(cursor)
        self._check_sizes(shards)
        if self._unchecked:
            for shard in sorted(shards & self._unchecked.keys()):
                verify_shard(shard, self._unchecked.pop(shard))
                self._verified_here.append(shard)
        plan.fill(cursor, out)
        if int(out.max()) >= self.job.vocab_size:  # microseconds; a damaged shard must not reach the model
            raise UserError(plan.describe_bad_token(cursor, self.job.vocab_size))

    def _check_sizes(self, shards: set[str]) -> None:
        """UserError naming a shard that is shorter than when this reader first read it (a read through its memory
        map past the file's new end would end the process by SIGBUS)."""
        for shard in shards:
            size = _stat(shard)[0]
            first = self._sizes.setdefault(shard, size)
            if size < first:
                path = Path(shard)
                raise UserError(
                    f"dataset {path.parent}: shard {path.name} shrank from {first:,} to {max(size, 0):,} bytes while "
                    f"the run read it (truncated or replaced); run `dlx data verify {path.parent}`, then `dlx prepare` "
                    "again, and resume"
                )

    def newly_verified(self) -> list[str]:
        """The shards verified since the last call: by the background thread (for the reply to the trainer's process)
        or in this thread."""
        here, self._verified_here = self._verified_here, []
        if self._verifier is None:
            return here
        done = self._verifier.done[self._reported : len(self._verifier.done)]
        self._reported += len(done)
        return here + done


class InProcessFeed:
    """Batches built in the calling thread, into one buffer reused by the next call."""

    def __init__(self, job: ReaderJob, start: Cursor | int, loop: bool, read: ReadShards):
        self._reader = BatchReader(job, background=False)
        self._schedule = job.plan.schedule(start, loop)
        self._batch = np.empty((2, job.plan.micro_batch_size, job.plan.seq_len), dtype=np.int64)
        self._read = read
        read.checksums.update(job.checksums)

    @property
    def pids(self) -> list[int]:
        return []

    def next_batch(self) -> np.ndarray:
        self._reader.fill(next(self._schedule), self._batch)
        verified = self._reader.newly_verified()
        if verified:
            self._read.confirm(verified)
        return self._batch

    def close(self, at_once: bool = False) -> None:
        self._schedule.close()  # a generator: a cached plan's prefetch stops with it


# The worker's side: one reader per worker process, filling slots of the pool's shared memory.

_reader: BatchReader | None = None
_slots: np.ndarray | None = None


def open_reader(job: ReaderJob) -> None:
    global _reader, _slots
    _reader = BatchReader(job, background=True)
    shape = (job.n_slots, 2, job.plan.micro_batch_size, job.plan.seq_len)
    _slots = np.ndarray(shape, dtype=np.int64, buffer=shared_memory())


def fill_slot(task: tuple[int, Cursor | int]) -> list[str]:
    """Fill a slot; the reply names the shards this worker confirmed since its last reply."""
    slot, cursor = task
    assert _reader is not None and _slots is not None, "open_reader runs first"
    _reader.fill(cursor, _slots[slot])
    return _reader.newly_verified()


class WorkerFeed:
    """Batches built by `num_workers` pool workers, `prefetch` each ahead of the trainer, read back in order."""

    def __init__(
        self, job: ReaderJob, start: Cursor | int, loop: bool, num_workers: int, prefetch: int, read: ReadShards
    ):
        self._plan, self._checksums, self._read = job.plan, dict(job.checksums), read
        read.checksums.update(job.checksums)
        self._in_flight: collections.deque[Cursor | int] = collections.deque()  # cursors sent, not received yet
        self._n_slots = num_workers * prefetch
        shape = (self._n_slots, 2, job.plan.micro_batch_size, job.plan.seq_len)
        self._pool = WorkerPool(num_workers, shared_bytes=int(np.prod(shape)) * 8, name="loader worker")
        self._slots = np.ndarray(shape, dtype=np.int64, buffer=self._pool.shared)
        for worker in range(num_workers):
            share = replace(job, n_slots=self._n_slots, worker=worker, num_workers=num_workers)
            self._pool.submit(worker, open_reader, share)
        self._opening = set(range(num_workers))  # workers whose open_reader reply is still to be received
        self._cursors = job.plan.schedule(start, loop)
        self._sent = self._received = 0
        self._send(self._n_slots)

    @property
    def pids(self) -> list[int]:
        return self._pool.pids

    def _send(self, n: int) -> None:
        for cursor in itertools.islice(self._cursors, n):
            task = (self._sent % self._n_slots, cursor)
            self._pool.submit(self._sent % self._pool.n_workers, fill_slot, task)
            self._in_flight.append(cursor)
            self._sent += 1

    def next_batch(self) -> np.ndarray:
        """The next batch as a (2, B, seq_len) view of shared memory, valid until the next call."""
        worker = self._received % self._pool.n_workers
        free = self._n_slots - (self._sent - self._received)  # the previous batch's slot is free again by now
        if free >= max(1, self._n_slots // 2) or (free and not self._pool.ready(worker)):
            self._send(free)
        try:
            if worker in self._opening:
                self._pool.receive(worker)
                self._opening.discard(worker)
            self._read.confirm(self._pool.receive(worker))
        except WorkerError as e:
            shards = ", ".join(sorted(Path(s).name for s in self._plan.shards_of(self._in_flight[0])))
            raise WorkerError(f"{e} (its batch reads shard {shards})", e.worker_traceback) from None
        cursor = self._in_flight.popleft()
        if self._checksums and len(self._read.confirmed) < len(self._checksums):  # microseconds; none once all are
            self._read.note_read(self._plan.shards_of(cursor), self._checksums)
        self._received += 1
        return self._slots[(self._received - 1) % self._n_slots]

    def close(self, at_once: bool = False) -> None:
        """`at_once`: kill the workers (their batches are not wanted) instead of letting them exit after their pipes
        close: no interpreter's teardown competes with the step for the CPU."""
        self._slots = None
        self._cursors.close()  # a generator: a cached plan's prefetch stops with it
        self._pool.close(graceful=not at_once)


def open_feed(
    job: ReaderJob, start: Cursor | int, loop: bool, num_workers: int, prefetch: int, read: ReadShards | None = None
):
    """Batches of `job` from `start`: built in this thread (`num_workers=0`, which verifies a shard before its first
    batch) or by worker processes (which tell `read` what the consumed batches read and what is verified)."""
    if num_workers == 0:
        return InProcessFeed(job, start, loop, read or ReadShards())
    return WorkerFeed(job, start, loop, num_workers, prefetch, read or ReadShards())
