"""A run folder in a bucket while it trains: `bucket_run` takes the run (the staging folder's lock, then the bucket's
lease), pulls it (`remote.pull_run`) and keeps `RunSync` uploading it until the run ends.

`RunSync` sends the staging folder's top-level files (whole, when changed) and each new checkpoint (its files, then
`COMPLETE`), the newest first: when a checkpoint is published locally while an older one still waits, the console
says uploads fall behind, with the bandwidth measured. A checkpoint being
uploaded is never pruned (`rundir.checkpoint.pinned`); one pruned locally is removed from the bucket, marker first; a
prefix left without its marker by an interrupted upload is removed once a newer checkpoint is complete. Each sync renews
the lease; a run whose lease another launch took over stops uploading and stops. When the bucket cannot be reached
at the end, the error names the newest checkpoint kept on this machine and the command that uploads it.

Only the process of rank 0 (RANK unset or 0) uploads; the staging folder is on that machine, so a run in a bucket is
single-node (every rank writes its DCP shards into the same staging folder).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from dlx.data import storage
from dlx.errors import UserError
from dlx.train.rundir.checkpoint import CHECKPOINTS_DIR, PUBLISHED, list_checkpoints, pinned
from dlx.train.rundir.lease import BucketLease, LeaseLost, StagingLock
from dlx.train.rundir.remote import MARKER, complete_checkpoints, newest_verified, pull_run, staging_dir

SYNC_EVERY_S = float(os.environ.get("DLX_SYNC_EVERY_S", "5"))
"""Seconds between two syncs while the run trains (DLX_SYNC_EVERY_S: the tests' shorter period)."""


@contextlib.contextmanager
def bucket_run(url: str) -> Iterator[Path]:
    """The staging folder of the run at `url`, locked on this machine and leased in the bucket before anything in it
    is touched, pulled, and uploaded while the caller trains in it; the lease is given back at the end."""
    staging = staging_dir(url)
    if os.environ.get("RANK", "0") != "0":  # the other ranks of the job on this machine train in rank 0's copy
        wait_for_pull(staging)
        yield staging
        return
    with StagingLock(staging, url):
        storage.check_access(url, "--run-dir")
        lease = BucketLease(url)
        lease.acquire()
        try:
            staging = pull_run(url)
            PULLED.write(staging)
            with RunSync(url, staging, lease):
                yield staging
        finally:
            with contextlib.suppress(Exception):  # an unreachable bucket: the lease lapses on its own
                lease.release()


class _Pulled:
    """`STAGING.pulled`: which launch attempt's pull is done (torchrun's run id and restart count), for the ranks
    that wait for rank 0's."""

    def token(self) -> str:
        return f"{os.environ.get('TORCHELASTIC_RUN_ID', '')}/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"

    def write(self, staging: Path) -> None:
        staging.with_name(staging.name + ".pulled").write_text(self.token())

    def done(self, staging: Path) -> bool:
        path = staging.with_name(staging.name + ".pulled")
        return path.is_file() and path.read_text() == self.token()


PULLED = _Pulled()
PULL_WAIT_S = 600.0


def wait_for_pull(staging: Path) -> None:
    deadline = time.monotonic() + PULL_WAIT_S
    while not PULLED.done(staging):
        if time.monotonic() > deadline:
            raise UserError(f"rank 0 did not pull the run into {staging} within {PULL_WAIT_S:.0f} s; see its error")
        time.sleep(0.2)


class RunSync:
    """Uploads a staging run folder to its URL every few seconds from a background thread and once more on exit.

    The top-level files go first and again after each checkpoint (a checkpoint's upload can take minutes), each one
    only when its size or mtime changed since it was last sent, and only as a whole file: one read between two equal
    `stat`s, and an appended `.jsonl` up to its last complete line. A published checkpoint starts a sync at once."""

    def __init__(self, url: str, staging: Path, lease: BucketLease | None = None, every_s: float = SYNC_EVERY_S):
        self.url, self.staging, self.lease, self.every_s = url, staging, lease, every_s
        self.uploaded = set(complete_checkpoints(url)) if storage.exists(url) else set()
        self.sent: dict[str, tuple[int, int]] = {}
        """Top-level file name -> (size, mtime in ns) of the copy in the bucket."""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self.failure: BaseException | None = None
        self.lost: str | None = None
        """Why the lease was lost to another launch; nothing is uploaded after that."""
        self.warned_behind = False
        self.rate_mb_s = 0.0
        """The bandwidth of the latest checkpoint upload."""

    def __enter__(self) -> RunSync:
        if os.environ.get("RANK", "0") == "0":
            self._first_sync()
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if not self._thread.is_alive():
            return
        self._stop.set()
        PUBLISHED.set()  # wakes the loop
        self._thread.join()
        if self.lost is not None:
            raise UserError(f"{self.lost}. This run stopped uploading when it lost the lease{self._kept()}")
        try:
            self.sync()  # the last checkpoint and the final files
        except LeaseLost as e:
            raise UserError(f"{e}. This run stopped uploading when it lost the lease{self._kept()}") from None
        except Exception as e:
            raise UserError(self._unreachable(e)) from None

    def _first_sync(self) -> None:
        """Before training: a newer checkpoint this machine kept goes up first, or the command stops naming it."""
        try:
            if self.lease is not None:
                self.lease.renew()
            self.sync()
        except (UserError, LeaseLost):
            raise
        except Exception as e:
            raise UserError(self._unreachable(e)) from None

    def _loop(self) -> None:
        """A sync every `every_s` seconds, and at once when a checkpoint is published."""
        while not self._stop.is_set():
            PUBLISHED.wait(self.every_s)
            PUBLISHED.clear()
            if self._stop.is_set():
                return
            try:
                if self.lease is not None:
                    self.lease.renew()
                self.sync(while_training=True)
                self.failure = None
            except LeaseLost as e:
                self.lost = str(e)
                os.kill(os.getpid(), signal.SIGTERM)  # the trainer stops after its step, in order
                return
            except Exception as e:  # retried at the next sync; the final one raises
                if self.failure is None:
                    print(
                        f"uploads to {self.url} failing ({first_line(e)}); training goes on and checkpoints stay in "
                        f"the staging folder {self.staging} until the bucket answers again",
                        file=sys.stderr,
                        flush=True,
                    )
                self.failure = e

    def sync(self, while_training: bool = False) -> None:
        """The changed top-level files, then each checkpoint not uploaded yet, newest first (marker last), with the
        files again after each, then the removal of pruned checkpoints and of prefixes an interrupted upload left.
        `while_training`: more than one checkpoint waiting means uploads fall behind (said once)."""
        self.sync_files()
        local = {p.name: p for p in list_checkpoints(self.staging)}
        pending = sorted(set(local) - self.uploaded, reverse=True)
        for name in pending:
            self._upload(local[name])
            newer = [p.name for p in list_checkpoints(self.staging) if p.name > name]
            if while_training and newer:
                self._behind(name, newer)
        for name in sorted(self.uploaded - set(local)):
            storage.remove(storage.join(self.url, CHECKPOINTS_DIR, name, MARKER))
            storage.remove(storage.join(self.url, CHECKPOINTS_DIR, name), recursive=True)
            self.uploaded.discard(name)
        if pending and self.uploaded:
            self._remove_incomplete(max(self.uploaded))

    def _upload(self, path: Path) -> None:
        with pinned(path) as exists:
            if not exists:
                return
            started = time.monotonic()
            names = storage.upload_tree(path, storage.join(self.url, CHECKPOINTS_DIR, path.name))
            storage.write_bytes(storage.join(self.url, CHECKPOINTS_DIR, path.name, MARKER), b"")
            size = sum((path / name).stat().st_size for name in names)
        self.uploaded.add(path.name)
        self.rate_mb_s = size / 1e6 / max(time.monotonic() - started, 1e-6)
        self.sync_files()

    def _behind(self, uploaded: str, newer: list[str]) -> None:
        """One line, once: a checkpoint was published while the previous one uploaded (the newest always goes next,
        so a resume finds a recent complete one; those pruned meanwhile are never uploaded)."""
        if self.warned_behind:
            return
        self.warned_behind = True
        print(
            f"uploads to {self.url} fall behind the checkpoints: {newer[-1]} was published while {uploaded} uploaded "
            f"at {self.rate_mb_s:,.2f} MB/s to the bucket; the newest goes next and checkpoints pruned meanwhile are "
            "not uploaded: raise checkpoint.every or the bandwidth",
            file=sys.stderr,
            flush=True,
        )

    def _remove_incomplete(self, newest: str) -> None:
        """Checkpoint prefixes older than `newest` that never got their marker (an upload cut short)."""
        folder = storage.join(self.url, CHECKPOINTS_DIR)
        for name in storage.listdir(folder):
            older = name.startswith("step-") and name < newest and name not in self.uploaded
            if older and not storage.exists(storage.join(folder, name, MARKER)):
                storage.remove(storage.join(folder, name), recursive=True)

    def sync_files(self) -> None:
        """Each top-level file whose size or mtime changed since it was sent, as one whole object."""
        for path in top_level_files(self.staging):
            stamp = file_stamp(path)
            if stamp is None or self.sent.get(path.name) == stamp:
                continue
            data = whole_copy(path, stamp)
            if data is not None:  # else it changed while read: the next sync sends it
                storage.write_bytes(storage.join(self.url, path.name), data)
                self.sent[path.name] = stamp

    def _unreachable(self, error: BaseException) -> str:
        return f"the bucket {self.url} cannot be reached ({first_line(error)}){self._kept()}"

    def _kept(self) -> str:
        newest = newest_verified(self.staging)
        if newest is None:
            return ""
        return (
            f"; this machine's staging folder {self.staging} keeps the run up to checkpoint {newest.name} (verified): "
            "run the same command again once the bucket answers and it is uploaded before training goes on"
        )


def first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0][:200]}" if text else type(error).__name__


def top_level_files(staging: Path) -> list[Path]:
    """The run folder's own files: not its temporary files (`.NAME.XXXX.tmp`), not the writer's lock."""
    if not staging.is_dir():
        return []
    return sorted(
        p for p in staging.iterdir() if p.is_file() and not p.name.startswith(".") and not p.name.endswith(".lock")
    )


def file_stamp(path: Path) -> tuple[int, int] | None:
    try:
        stat = path.stat()
    except FileNotFoundError:
        return None
    return stat.st_size, stat.st_mtime_ns


def whole_copy(path: Path, stamp: tuple[int, int]) -> bytes | None:
    """The file's bytes when it did not change while they were read, an appended `.jsonl` cut after its last complete
    line (a record being written is sent at the next sync); None when it changed."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    if file_stamp(path) != stamp or len(data) != stamp[0]:
        return None
    if path.suffix == ".jsonl":
        return data[: data.rfind(b"\n") + 1]
    return data
