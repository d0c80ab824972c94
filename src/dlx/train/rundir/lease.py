"""One writer per run folder in a bucket, across machines and on one: `StagingLock` and `BucketLease`.

On one machine the staging folder of a run URL is locked (`flock` on `STAGING.lock` beside it) before anything in it
is touched, so a second launch is refused before it can replace the first one's files. Across machines the bucket
holds `URL/writer.lease`, {"owner", "host", "pid", "renewed", "lease_s"}: the writer renews it with every sync
(every few seconds); another launch respects it while it was renewed within `lease_s` seconds, and takes it over
after that (a holder on the same host whose process is gone is taken over at once: the restart loop's next attempt).
Object stores have no lock: a launch writes its lease, waits `SETTLE_S`, and trains only if it reads its own lease
back; a writer that later finds another owner in the lease stops uploading and stops the run.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import psutil

from dlx.data import storage
from dlx.errors import UserError

LEASE_FILE = "writer.lease"
LEASE_S = 60.0
"""A lease not renewed for this long is free (the writer renews it every few seconds while it trains)."""
SETTLE_S = 1.0
"""How long a launch waits after writing its lease before reading it back."""


class StagingLock:
    """An exclusive `flock` on `STAGING.lock` beside a run URL's staging folder, released by the kernel when the
    holder dies."""

    def __init__(self, staging: Path, url: str):
        self.path, self.url = staging.with_name(staging.name + ".lock"), url
        self._fd: int | None = None

    def __enter__(self) -> StagingLock:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            holder = _read_json(self.path.read_bytes())
            who = f"pid {holder.get('pid')}" if holder else "another process"
            raise UserError(
                f"run folder {self.url} is being trained by {who} on this machine; one writer per run: wait for it "
                "to end or stop it, or pick another --run-dir"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps({"pid": os.getpid()}).encode() + b"\n", 0)
        self._fd = fd
        return self

    def __exit__(self, *exc: object) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class BucketLease:
    """`URL/writer.lease`: taken by `acquire`, renewed by `renew` (which raises LeaseLost when another launch owns
    it), removed by `release`."""

    def __init__(self, url: str, lease_s: float = LEASE_S):
        self.url, self.lease_s = url, lease_s
        self.owner = uuid.uuid4().hex
        self.object = storage.join(url, LEASE_FILE)

    def acquire(self) -> None:
        holder = self.read()
        if holder is not None and live(holder):
            raise UserError(busy(self.url, holder))
        if holder is not None:
            print(
                f"run folder {self.url}: {takeover_reason(holder)}; this launch takes the lease over", file=sys.stderr
            )
        self.write()
        time.sleep(SETTLE_S)
        holder = self.read()
        if holder is None or holder.get("owner") != self.owner:
            raise UserError(busy(self.url, holder or {}))

    def renew(self) -> None:
        holder = self.read()
        if holder is not None and holder.get("owner") != self.owner:
            raise LeaseLost(busy(self.url, holder))
        self.write()

    def release(self) -> None:
        holder = self.read()
        if holder is not None and holder.get("owner") == self.owner:
            storage.remove(self.object)

    def read(self) -> dict[str, Any] | None:
        try:
            return _read_json(storage.read_bytes(self.object))
        except FileNotFoundError:
            return None

    def write(self) -> None:
        fields = {"owner": self.owner, "host": socket.gethostname(), "pid": os.getpid()}
        storage.write_bytes(
            self.object, json.dumps({**fields, "renewed": time.time(), "lease_s": self.lease_s}).encode()
        )


class LeaseLost(Exception):
    """Another launch owns the run folder's lease now: this one must not upload again."""


def live(holder: dict[str, Any]) -> bool:
    """A lease is live while renewed within its `lease_s`, unless its holder was a process of this host that is gone."""
    if holder.get("host") == socket.gethostname() and not _alive(holder.get("pid")):
        return False
    return time.time() - _number(holder.get("renewed")) < (_number(holder.get("lease_s")) or LEASE_S)


def takeover_reason(holder: dict[str, Any]) -> str:
    if holder.get("host") == socket.gethostname() and not _alive(holder.get("pid")):
        return f"the lease's holder, pid {holder.get('pid')} on this host, is gone"
    silent = time.time() - _number(holder.get("renewed"))
    return f"the lease of pid {holder.get('pid')} on {holder.get('host')} was last renewed {silent:,.0f} s ago"


def busy(url: str, holder: dict[str, Any]) -> str:
    silent = time.time() - _number(holder.get("renewed"))
    return (
        f"run folder {url} is being trained by pid {holder.get('pid')} on {holder.get('host')} (its lease "
        f"{LEASE_FILE} was renewed {max(silent, 0):,.0f} s ago; it is free {_number(holder.get('lease_s')):,.0f} s "
        "after the last renewal); one writer per run: wait for it to end or stop it, or pick another --run-dir"
    )


def _alive(pid: Any) -> bool:
    return isinstance(pid, int) and psutil.pid_exists(pid)


def _number(value: Any) -> float:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0.0


def _read_json(data: bytes) -> dict[str, Any] | None:
    try:
        value = json.loads(data or b"null")
    except ValueError:
        return None
    return value if isinstance(value, dict) else None
