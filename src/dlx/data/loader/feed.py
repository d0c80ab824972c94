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
that names the shard.

This module needs numpy only (the workers import it without torch or pydantic, so they start fast).
"""

from __future__ import annotations

import itertools
import threading
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from dlx.data.loader.order import Cursor, EpochWindows, Order, schedule
from dlx.data.loader.windows import SplitSpec, TokenWindows
from dlx.data.pool import WorkerPool, shared_memory
from dlx.errors import UserError

_verified: set[tuple[str, int, int, str]] = set()
"""Shards this process has verified: (path, size, mtime_ns, sha256). A rebuilt loader (an evaluation's) skips them."""


@dataclass(frozen=True)
class ReaderJob:
    """What a reader needs to build one rank's batches; sent to each worker once."""

    split: SplitSpec
    order: Order
    seq_len: int
    vocab_size: int
    checksums: tuple[tuple[str, str], ...]
    """(shard file name, the manifest's SHA-256) of each shard of `split` (empty: do not verify)."""
    n_slots: int = 0
    worker: int = 0
    num_workers: int = 1


def _shard_key(path: Path, sha256: str) -> tuple[str, int, int, str]:
    stat = path.stat()
    return str(path), stat.st_size, stat.st_mtime_ns, sha256


def verify_shard(folder: str, name: str, sha256: str) -> None:
    """UserError unless the shard's SHA-256 is the manifest's (once per process per unchanged file)."""
    path = Path(folder) / name
    key = _shard_key(path, sha256)
    if key in _verified:
        return
    from dlx.data.shards import sha256_file  # imports pydantic: kept off a worker's start

    if sha256_file(path) != sha256:
        raise UserError(
            f"dataset {folder}: shard {name} does not match the checksum in its manifest (the file changed after "
            f"`dlx prepare` wrote it); run `dlx data verify {folder}` to list every damaged file, then `dlx prepare` "
            "again"
        )
    _verified.add(key)


class _BackgroundVerifier:
    """Verifies some shards in a daemon thread (hashlib releases the GIL); `failure` holds the first mismatch."""

    def __init__(self, folder: str, shards: list[tuple[str, str]]):
        self.failure: str | None = None
        self._thread = threading.Thread(target=self._run, args=(folder, shards), daemon=True)
        self._thread.start()

    def _run(self, folder: str, shards: list[tuple[str, str]]) -> None:
        for name, sha256 in shards:
            try:
                verify_shard(folder, name, sha256)
            except UserError as e:
                self.failure = str(e)
                return

    def join(self) -> None:
        self._thread.join()


class BatchReader:
    """Builds this rank's batches from the shards: (2, B, seq_len) int64, inputs and targets shifted by one."""

    def __init__(self, job: ReaderJob, background: bool):
        """`background`: verify this worker's share of the shards in a thread; else each shard on first touch."""
        self.job = job
        self.windows = TokenWindows(job.split, job.seq_len)
        self.window_ids = EpochWindows(job.order)
        self._verifier: _BackgroundVerifier | None = None
        self._unchecked: dict[str, str] = {}
        if job.checksums and background:
            self._verifier = _BackgroundVerifier(job.split.folder, list(job.checksums[job.worker :: job.num_workers]))
        elif job.checksums:
            self._unchecked = dict(job.checksums)

    def fill(self, cursor: Cursor, out: np.ndarray) -> None:
        ids = self.window_ids(cursor)
        if self._verifier is not None and self._verifier.failure:
            raise UserError(self._verifier.failure)
        if self._unchecked:
            for name in sorted(self.windows.shards_of(ids) & self._unchecked.keys()):
                verify_shard(self.job.split.folder, name, self._unchecked.pop(name))
        self.windows.fill(ids, out)
        if int(out.max()) >= self.job.vocab_size:  # microseconds; a damaged shard must not reach the model
            raise UserError(self._describe_bad_token(ids))

    def _describe_bad_token(self, window_ids: np.ndarray) -> str:
        folder, vocab_size = self.job.split.folder, self.job.vocab_size
        for window_id in window_ids.tolist():
            tokens = self.windows.window(window_id)
            bad = np.flatnonzero(tokens >= vocab_size)
            if len(bad):
                shard, offset = self.windows.locate(window_id * self.job.seq_len + int(bad[0]))
                return (
                    f"dataset {folder}: shard {shard} holds token id {int(tokens[bad[0]])} at token {offset:,}, "
                    f"outside the tokenizer's {vocab_size:,} ids: the shard is damaged or was written by another "
                    f"tokenizer; check with `dlx data verify {folder}` and run `dlx prepare` again"
                )
        return f"dataset {folder}: a batch holds a token id outside the vocabulary; run `dlx data verify {folder}`"


class InProcessFeed:
    """Batches built in the calling thread, into one buffer reused by the next call."""

    def __init__(self, job: ReaderJob, start: Cursor, loop: bool):
        self._reader = BatchReader(job, background=False)
        self._schedule = schedule(job.order, start, loop)
        self._batch = np.empty((2, job.order.micro_batch_size, job.seq_len), dtype=np.int64)

    @property
    def pids(self) -> list[int]:
        return []

    def next_batch(self) -> np.ndarray:
        self._reader.fill(next(self._schedule), self._batch)
        return self._batch

    def close(self) -> None:
        pass


# The worker's side: one reader per worker process, filling slots of the pool's shared memory.

_reader: BatchReader | None = None
_slots: np.ndarray | None = None


def open_reader(job: ReaderJob) -> None:
    global _reader, _slots
    _reader = BatchReader(job, background=True)
    shape = (job.n_slots, 2, job.order.micro_batch_size, job.seq_len)
    _slots = np.ndarray(shape, dtype=np.int64, buffer=shared_memory())


def fill_slot(task: tuple[int, int, int]) -> None:
    slot, epoch, consumed = task
    assert _reader is not None and _slots is not None, "open_reader runs first"
    _reader.fill(Cursor(epoch, consumed), _slots[slot])


class WorkerFeed:
    """Batches built by `num_workers` pool workers, `prefetch` each ahead of the trainer, read back in order."""

    def __init__(self, job: ReaderJob, start: Cursor, loop: bool, num_workers: int, prefetch: int):
        self._n_slots = num_workers * prefetch
        shape = (self._n_slots, 2, job.order.micro_batch_size, job.seq_len)
        self._pool = WorkerPool(num_workers, shared_bytes=int(np.prod(shape)) * 8, name="loader worker")
        self._slots = np.ndarray(shape, dtype=np.int64, buffer=self._pool.shared)
        for worker in range(num_workers):
            share = replace(job, n_slots=self._n_slots, worker=worker, num_workers=num_workers)
            self._pool.submit(worker, open_reader, share)
        self._opening = set(range(num_workers))  # workers whose open_reader reply is still to be received
        self._cursors = schedule(job.order, start, loop)
        self._sent = self._received = 0
        self._send(self._n_slots)

    @property
    def pids(self) -> list[int]:
        return self._pool.pids

    def _send(self, n: int) -> None:
        for cursor in itertools.islice(self._cursors, n):
            task = (self._sent % self._n_slots, cursor.epoch, cursor.consumed)
            self._pool.submit(self._sent % self._pool.n_workers, fill_slot, task)
            self._sent += 1

    def next_batch(self) -> np.ndarray:
        """The next batch as a (2, B, seq_len) view of shared memory, valid until the next call."""
        worker = self._received % self._pool.n_workers
        free = self._n_slots - (self._sent - self._received)  # the previous batch's slot is free again by now
        if free >= max(1, self._n_slots // 2) or (free and not self._pool.ready(worker)):
            self._send(free)
        if worker in self._opening:
            self._pool.receive(worker)
            self._opening.discard(worker)
        self._pool.receive(worker)
        self._received += 1
        return self._slots[(self._received - 1) % self._n_slots]

    def close(self) -> None:
        self._slots = None
        self._pool.close()
