"""Atomic writes: write beside the target under a temporary name, fsync, then rename over it.

A reader (or a resumed run) sees either the old complete file/folder or the new complete one, never half of one.
What is published gets the permissions `open()` and `mkdir()` would give under the process's umask (usually 0644 and
0755), not the 0600/0700 of `tempfile`'s private names: on a shared cluster a teammate can read the checkpoints and
datasets.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def process_umask() -> int:
    """The process's umask, read without changing it where Linux shows it; elsewhere set and restored at once."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def make_temp_file(path: Path) -> tuple[int, str]:
    """(open descriptor, name) of a new file beside `path` (`.NAME.XXXX.tmp`), with the permissions `open()` gives."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.fchmod(fd, 0o666 & ~process_umask())
    return fd, tmp


def synced_temp_file(path: Path, data: bytes) -> str:
    """A new temporary file beside `path` holding `data`, written and fsynced; its name."""
    fd, tmp = make_temp_file(path)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    return tmp


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = synced_temp_file(path, data)
    try:
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    fsync_dir(path.parent)


def create_once(path: str | os.PathLike, data: bytes) -> None:
    """Create `path` holding `data` (fsynced) unless it exists; never replaces it, even when two writers race."""
    path = Path(path)
    tmp = synced_temp_file(path, data)
    try:
        with contextlib.suppress(FileExistsError):
            os.link(tmp, path)
    finally:
        os.unlink(tmp)
    fsync_dir(path.parent)


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    atomic_write_bytes(path, text.encode())


@contextlib.contextmanager
def atomic_dir(path: str | os.PathLike, overwrite: bool = False) -> Iterator[Path]:
    """Yield a temporary folder to fill; on success it is renamed to `path` (replacing it if `overwrite`)."""
    tmp = make_temp_dir(path)
    try:
        yield tmp
        publish_dir(tmp, path, overwrite)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def make_temp_dir(path: str | os.PathLike) -> Path:
    """An empty folder beside `path` under a hidden temporary name (`.NAME.XXXX.tmp`)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp"))
    tmp.chmod(0o777 & ~process_umask())  # mkdtemp's are 0700
    return tmp


def publish_dir(tmp: Path, path: str | os.PathLike, overwrite: bool = False) -> None:
    """fsync every file of the filled `tmp`, then rename it to `path` in one step."""
    path = Path(path)
    for child in tmp.rglob("*"):
        if child.is_file():
            with open(child, "rb") as f:
                os.fsync(f.fileno())
    if path.exists() and overwrite:
        old = path.with_name(f".{path.name}.old")
        shutil.rmtree(old, ignore_errors=True)
        os.replace(path, old)
        os.replace(tmp, path)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, path)
    fsync_dir(path.parent)
