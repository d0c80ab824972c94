"""One writer per run folder: `RUN_DIR/writer.lock`, held by rank 0 of the job that trains the run.

The lock is an exclusive `flock` on that file, which the kernel releases when its holder dies, even by SIGKILL: a
requeued or restarted job is never blocked by its own dead predecessor on the same machine. The file names the holder
(pid, host, start) for the refusal's one line, and its `alive` time is refreshed every `REFRESH_S` while it trains: on a
shared filesystem whose locks do not reach across machines, a holder on another host counts only while it refreshed in
the last `STALE_S` seconds; after that its lock is stale and taken over.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

from dlx.errors import UserError

LOCK_FILE = "writer.lock"
REFRESH_S = 30.0
STALE_S = 120.0


class RunLock:
    """The run folder's writer lock; `acquire` on rank 0 (through `main_decides`), `release` when the run closes."""

    def __init__(self, run_dir: Path):
        self.path = run_dir / LOCK_FILE
        self._fd: int | None = None
        self._refreshed = 0.0
        self._started = 0.0

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> None:
        """Take the lock or raise UserError naming its holder. The folder must exist."""
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise UserError(self._busy(read_holder(self.path))) from None
        holder = read_holder(self.path)
        elsewhere = holder is not None and holder.get("host") != socket.gethostname()
        silent_s = time.time() - _number(holder.get("alive")) if holder else 0.0
        if elsewhere and silent_s < STALE_S:
            os.close(fd)  # held from another machine, whose lock this filesystem does not show us
            raise UserError(self._busy(holder))
        if elsewhere:
            print(
                f"run folder {self.path.parent}: took over the stale lock of pid {holder.get('pid')} on "
                f"{holder.get('host')} (no refresh for {silent_s:,.0f} s; a holder on another host counts for "
                f"{STALE_S:.0f} s after its last)",
                file=sys.stderr,
                flush=True,
            )
        self._fd, self._started = fd, time.time()
        self.refresh(force=True)

    def refresh(self, force: bool = False) -> None:
        """Rewrite the holder's line with the time now (every REFRESH_S at most): the sign that the holder lives."""
        now = time.time()
        if self._fd is None or (not force and now - self._refreshed < REFRESH_S):
            return
        self._refreshed = now
        line = json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "started": self._started, "alive": now})
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, line.encode() + b"\n", 0)

    def release(self) -> None:
        """Clear the holder's line and unlock (the file stays: removing it would let two writers lock two files)."""
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        try:
            os.ftruncate(fd, 0)
        finally:
            os.close(fd)

    def _busy(self, holder: dict[str, Any] | None) -> str:
        who = f"pid {holder.get('pid')} on {holder.get('host')}" if holder else "another process"
        return (
            f"run folder {self.path.parent} is being trained by {who} (lock {self.path}); one writer per run: wait "
            "for it to end or stop it, or pick another --run-dir"
        )


def _number(value: Any) -> float:
    return float(value) if isinstance(value, (int, float)) else 0.0


def read_holder(path: Path) -> dict[str, Any] | None:
    """The holder's line, or None when the file is empty, missing or unreadable."""
    try:
        holder = json.loads(path.read_text() or "null")
    except (OSError, ValueError):
        return None
    return holder if isinstance(holder, dict) else None
