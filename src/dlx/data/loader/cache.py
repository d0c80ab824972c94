"""A bounded local cache of one split's shards in object storage, filled in the order the loader will read them.

The loader's order is a pure function of the seed and the position, so the shards every future batch reads are known
before it is read. `ShardCache` downloads them ahead of the trainer (`downloads` prefetch threads walk the future
batches, each taking the first shard not yet present nor in flight, so the round trips of small requests overlap) and,
when the cache is full, evicts the shard whose next use lies furthest in the future (Belady's rule, optimal for a
known sequence); it prefetches a shard only when it can make room without evicting one needed sooner. `policy="lru"`
evicts the least recently used shard instead (for `benchmarks/bench_object_storage.py` to compare).

Every shard is downloaded into a temporary file, hashed as it streams and renamed into the cache only when its SHA-256
is the manifest's (`dlx.data.storage.download`). At start the folder is checked, not trusted: temporary files of a
killed run are deleted, every shard already there is hashed again and kept only when it matches. A cached shard is
then verified like a local one: its size and modification time are compared before each reuse (a changed file is
hashed again, and downloaded again when it no longer matches) and, for the shards batches were read from, before a
checkpoint is published (`verify_read`: a changed one stops the run, as a changed local shard does).

One cache owns a cache folder (`claim_cache_folder`: an `flock` on it, released by the kernel however the process
ends, and by `ShardCache.close` once the shards its batches read are verified); another loader of the same split in
this process (a stage's, opened while the previous stage still reads) or in another run on the machine gets the next
free folder, so two caches never evict each other's shards. A folder this process claims again keeps the shards it
verified, unchanged since (size and time), without hashing them again. There is no shared memory, and nothing a
SIGKILL leaves behind blocks the next start.

`dlx.data.loader.plan.CachedPlan` puts the caches under a plan: one for a dataset's split (`TokenLoader`), one per
source in object storage for a mixture (`MixtureLoader`; `share_cache` divides the bound between them).

The shards of the batches in flight (sent to a worker, not yet read back) are never evicted; the size bound is
`capacity_bytes` or those shards together, whichever is larger, and a shard being downloaded counts toward it from
the moment its download starts. The threads wait on one condition (never poll in a loop) and download with the
lock released. Workers map a shard for one batch at a time
(`SplitSpec.volatile`), so an evicted shard's space is freed at once.
"""

from __future__ import annotations

import collections
import fcntl
import os
import threading
from collections.abc import Iterator
from pathlib import Path

from dlx.data.shards import ShardInfo, sha256_file
from dlx.errors import UserError

LOOKAHEAD_BATCHES = 4096
"""How many future batches the prefetch looks at; a shard not used within them counts as never used again."""
MAX_CACHE_FOLDERS = 64
"""Runs of one dataset at once on a machine (per split and rank), each with a cache folder of its own."""


def claim_cache_folder(base: Path) -> Path:
    """`base`, or `base.1`, `base.2`, …: the first cache folder no other cache holds, in this process or another,
    locked until `release_cache_folder` (or the end of the process: the kernel releases the lock however it ends)."""
    for index in range(MAX_CACHE_FOLDERS):
        folder = base if index == 0 else base.with_name(f"{base.name}.{index}")
        if str(folder) in _HELD:
            continue
        folder.mkdir(parents=True, exist_ok=True)
        fd = os.open(folder, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        _HELD[str(folder)] = fd
        return folder
    raise UserError(f"{MAX_CACHE_FOLDERS} runs already read {base.parent} on this machine; wait for one to end")


def release_cache_folder(folder: Path) -> None:
    """Unlock a folder `claim_cache_folder` returned (nothing for one it did not)."""
    fd = _HELD.pop(str(folder), None)
    if fd is not None:
        os.close(fd)  # the flock goes with the last descriptor


_HELD: dict[str, int] = {}
"""Cache folder → the descriptor holding its lock, in this process."""
_VERIFIED: dict[str, tuple[int, int, str]] = {}
"""Cached shard path → (size, mtime_ns, SHA-256) when this process last found it matching: a folder claimed again
keeps such a shard without hashing it."""


def share_cache(sizes: list[int], capacity: int) -> list[int]:
    """`capacity` bytes divided between caches of splits of `sizes` bytes: each split smaller than an equal share of
    what is left keeps all of it (read in the window shuffle, as from local folders), the others share the rest
    equally (smallest first). A capacity of 0 (no bound) stays 0 for each."""
    shares = [0] * len(sizes)
    left, remaining = capacity, len(sizes)
    for index in sorted(range(len(sizes)), key=lambda i: sizes[i]):
        shares[index] = max(1, min(sizes[index], left // remaining)) if capacity > 0 else 0
        left, remaining = left - shares[index], remaining - 1
    return shares


class ShardCache:
    """The shards of one split, downloaded from `url` into `folder` with at most `capacity_bytes` kept."""

    def __init__(
        self,
        url: str,
        folder: Path,
        shards: list[ShardInfo],
        itemsize: int,
        capacity_bytes: int,
        policy: str = "belady",
        downloads: int = 4,
    ):
        if policy not in ("belady", "lru"):
            raise ValueError(f"policy must be belady or lru, got {policy!r}")
        if downloads < 1:
            raise ValueError(f"downloads must be at least 1, got {downloads}")
        self.downloads = downloads
        self.url, self.folder, self.policy, self.capacity = url, Path(folder), policy, int(capacity_bytes)
        self.sizes = {s.name: s.tokens * itemsize for s in shards}
        self.sha256 = {s.name: s.sha256 for s in shards}
        self.bytes_downloaded = 0
        self.peak_bytes = 0
        """The most bytes the folder held at once."""
        self.present: dict[str, int] = {}  # shard → last batch position that used it (LRU)
        self._in_flight: set[str] = set()  # being downloaded by a prefetch thread
        self._cond = threading.Condition()
        self._complete_until = 0
        self._threads: list[threading.Thread] = []
        self._generation = 0
        self._failure: BaseException | None = None
        self.verified: dict[str, tuple[int, int]] = {}
        """Shard → (size, mtime_ns) of the file whose SHA-256 was last found to be the manifest's."""
        self._read: set[str] = set()
        """Shards batches were read from since the last `verify_read`."""
        self._closed = False
        self._closing_check: tuple[list[str], UserError | None] = ([], None)
        """What `close` found: the shards it checked, or the UserError for the next `verify_read`."""
        self._check_folder()

    def _check_folder(self) -> None:
        """Delete what a killed run left half-done, keep only shards whose SHA-256 matches."""
        self.folder.mkdir(parents=True, exist_ok=True)
        for path in sorted(self.folder.iterdir()):
            keep = path.name in self.sha256 and path.is_file() and path.stat().st_size == self.sizes[path.name]
            if keep and (_VERIFIED.get(str(path)) == (*_stat(path), self.sha256[path.name]) or self._hashes(path)):
                self.present[path.name] = -1
                self._mark_verified(path.name)
            else:
                path.unlink()
        while self._used() > self.capacity and self.present:
            self._evict(next(iter(self.present)))

    def _used(self) -> int:
        return sum(self.sizes[name] for name in self.present) + sum(self.sizes[name] for name in self._in_flight)

    def _hashes(self, path: Path) -> bool:
        return sha256_file(path) == self.sha256[path.name]

    def _mark_verified(self, name: str) -> None:
        """The file `name` in the folder now is the one whose SHA-256 was found to be the manifest's."""
        stat = self.verified[name] = _stat(self.folder / name)
        _VERIFIED[str(self.folder / name)] = (*stat, self.sha256[name])

    def _evict(self, name: str) -> None:
        (self.folder / name).unlink(missing_ok=True)
        del self.present[name]
        self.verified.pop(name, None)
        self._complete_until = 0

    def _still_verified(self, name: str) -> bool:
        """The cached file is the one verified, or, changed since, still hashes to the manifest's SHA-256."""
        path = self.folder / name
        stat = _stat(path)
        if stat == self.verified.get(name):
            return True
        if stat[0] == self.sizes[name] and self._hashes(path):
            self._mark_verified(name)
            return True
        return False

    def verify_read(self) -> list[str]:
        """Before a checkpoint: every cached shard batches were read from since the last call is still the verified
        file (hashed again where its size or time changed); UserError naming the first that is not. Returns the
        shards checked."""
        if self._closed:  # checked as it closed
            (read, failure), self._closing_check = self._closing_check, ([], None)
            if failure is not None:
                raise failure
            return read
        with self._cond:
            read, self._read = sorted(self._read), set()
        for name in read:
            if name in self.verified and not self._still_verified(name):
                raise UserError(
                    f"dataset {self.url}: shard {name} in the cache folder {self.folder} changed after it was "
                    "verified (something wrote into it); the batches read from it are not trusted. Delete that "
                    "folder and resume: the shard is downloaded again"
                )
        return read

    def close(self) -> None:
        """Stop prefetching for good; check what batches read since the last `verify_read` (its result, or its
        UserError, is the next `verify_read`'s: a stage's finished source is verified at the next checkpoint), then
        release the folder to the next cache (which may evict those shards)."""
        self.stop()
        if self._closed:
            return
        try:
            self._closing_check = (self.verify_read(), None)
        except UserError as e:
            self._closing_check = ([], e)
        self._closed = True
        release_cache_folder(self.folder)

    def start(self, future: Iterator[set[str]], pinned: int) -> None:
        """Prefetch for a new pass: `future` yields the shards of each batch from position 0 of the pass; the shards of
        the last `pinned` acquired batches stay."""
        if self._closed:
            raise RuntimeError(f"the shard cache of {self.url} in {self.folder} is closed")
        self.stop()
        with self._cond:
            self._generation += 1
            self._failure = None
            self._future: list[set[str]] = []
            self._next_uses: dict[str, collections.deque[int]] = collections.defaultdict(collections.deque)
            self._position, self._pinned, self._complete_until = -1, pinned, 0
            self._source, self._exhausted = future, False
        generation = self._generation
        self._threads = [
            threading.Thread(target=self._prefetch, args=(generation,), daemon=True) for _ in range(self.downloads)
        ]
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        with self._cond:
            self._generation += 1
            self._cond.notify_all()
        for thread in self._threads:
            thread.join()
        self._threads = []

    def acquire(self, position: int) -> None:
        """Block until every shard of batch `position` of the pass is in the folder; from now on the batches before
        `position - pinned` may be evicted."""
        with self._cond:
            self._position = position
            self._extend(position)
            self._cond.notify_all()
            for name in self._future[position] & self.present.keys():
                if not self._still_verified(name):  # changed in place since: download it again
                    self._evict(name)
                    self._cond.notify_all()
            while not self._future[position] <= self.present.keys():
                if self._failure is not None:
                    raise self._failure
                self._cond.wait(0.5)
            for name in self._future[position]:
                self.present[name] = position
            self._read |= self._future[position]

    # the prefetch thread, under self._cond unless downloading

    def _extend(self, position: int) -> None:
        while len(self._future) <= position + 1 and not self._exhausted:
            batch = next(self._source, None)
            if batch is None:
                self._exhausted = True
                return
            for name in batch:
                self._next_uses[name].append(len(self._future))
            self._future.append(batch)

    def _next_use(self, name: str, after: int) -> float:
        uses = self._next_uses[name]
        while uses and uses[0] < after:
            uses.popleft()
        return uses[0] if uses else float("inf")

    def _prefetch(self, generation: int) -> None:
        try:
            while True:
                with self._cond:
                    name = self._next_job(generation)
                    if name is None:
                        return
                    self._in_flight.add(name)  # its bytes count toward the bound from now on
                    self.peak_bytes = max(self.peak_bytes, self._used())
                try:
                    downloaded = self._download(name)
                except BaseException:
                    with self._cond:
                        self._in_flight.discard(name)
                    raise
                with self._cond:  # in flight → present in one step: no other thread takes it up again
                    self._in_flight.discard(name)
                    self.bytes_downloaded += downloaded
                    self.present[name] = self._position
                    self._mark_verified(name)  # its SHA-256 was checked as it streamed
                    self._cond.notify_all()
        except BaseException as e:  # handed to the trainer's thread by acquire
            with self._cond:
                self._failure = e
                self._cond.notify_all()

    def _next_job(self, generation: int) -> str | None:
        """The next shard to download, after making room for it; None when this pass is over or stopped."""
        while generation == self._generation:
            base = max(self._position, 0)
            for j in range(max(base, self._complete_until), base + LOOKAHEAD_BATCHES):
                self._extend(j)
                if j >= len(self._future):
                    break
                missing = sorted(self._future[j] - self.present.keys() - self._in_flight)
                if not missing:
                    if self._future[j] <= self.present.keys():  # the next scan starts after it, unless one is evicted
                        self._complete_until = j + 1
                    continue
                if self._make_room(missing[0], j):
                    return missing[0]
                break  # no room until the trainer moves on
            self._cond.wait(0.5)
        return None

    def _make_room(self, name: str, needed_at: int) -> bool:
        """Evict until `name` fits: the furthest next use (belady) or the least recent use (lru), never a pinned
        shard nor, under belady, one needed sooner than `needed_at`. True when it fits (or the trainer waits for it)."""
        self._extend(max(self._position, 0) + LOOKAHEAD_BATCHES)  # every next use within the horizon is known
        pinned = set().union(*self._future[max(0, self._position + 1 - self._pinned) : self._position + 1])
        while self._used() + self.sizes[name] > self.capacity:
            candidates = [n for n in self.present if n not in pinned]
            if not candidates:
                return needed_at <= self._position  # over the bound only for what the trainer is waiting for
            if self.policy == "lru":
                victim = min(candidates, key=lambda n: self.present[n])
            else:
                victim = max(candidates, key=lambda n: self._next_use(n, self._position + 1))
                if self._next_use(victim, self._position + 1) <= needed_at and needed_at > self._position:
                    return False
            self._evict(victim)
        return True

    def _download(self, name: str) -> int:
        from dlx.data import storage

        try:
            n = storage.download(
                f"{self.url.rstrip('/')}/{name}", self.folder / name, self.sha256[name], self.sizes[name]
            )
        except FileNotFoundError:
            raise UserError(
                f"dataset {self.url}: shard {name} is missing from the bucket; run `dlx prepare` again"
            ) from None
        return n


def _stat(path: Path) -> tuple[int, int]:
    try:
        stat = path.stat()
    except OSError:
        return (-1, -1)
    return stat.st_size, stat.st_mtime_ns
