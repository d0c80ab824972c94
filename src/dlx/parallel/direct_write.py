"""DCP shards written around the page cache (O_DIRECT), where the filesystem takes it.

A buffered write copies every byte into the kernel's page cache, on the CPU that trains: at the 1B-scaled shape on 2
cores, writing a checkpoint's 0.28 GB cost 0.1–0.5 s of CPU, which `checkpoint.async` moved onto the next steps
instead of removing (BENCHMARKS.md "Checkpoint cost"). With O_DIRECT the device reads the bytes from dlx's own buffer:
the CPU copies each byte once, into that buffer. `benchmarks/bench_checkpoint_cost.py` measures the difference.

`DirectStream` is the file object DCP's `FileSystemWriter` writes a shard through: bytes gather in a page-aligned
buffer written out whole; at close the last block is padded, the file cut back to its length and synced. Where the
filesystem refuses O_DIRECT (tmpfs, some network filesystems) or the platform has none, the shard is an ordinary
buffered file. Reading is unchanged (DCP's `FileSystemReader`).
"""

from __future__ import annotations

import errno
import fcntl
import io
import mmap
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from torch.distributed.checkpoint import FileSystemWriter
from torch.distributed.checkpoint.filesystem import FileSystem

BLOCK = 4096
"""What O_DIRECT writes align to: offsets, lengths and the buffer's address (a multiple of 512 and 4096 sectors)."""
BUFFER_BYTES = 8 << 20
"""Bytes gathered before one write."""


class DirectStream(io.RawIOBase):
    """A write-only file opened with O_DIRECT; `tell` counts what was written through it (DCP records offsets)."""

    def __init__(self, fd: int) -> None:
        super().__init__()
        self._fd = fd
        self._buffer = mmap.mmap(-1, BUFFER_BYTES)  # page-aligned, as O_DIRECT needs
        self._view = memoryview(self._buffer)
        self._filled = 0
        self._written = 0
        self._direct = True

    def writable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self._fd

    def tell(self) -> int:
        return self._written + self._filled

    def write(self, data: Any) -> int:
        source = memoryview(data).cast("B")
        done = 0
        while done < len(source):
            take = min(BUFFER_BYTES - self._filled, len(source) - done)
            self._view[self._filled : self._filled + take] = source[done : done + take]
            self._filled += take
            done += take
            if self._filled == BUFFER_BYTES:
                self._write_out(BUFFER_BYTES)
        return done

    def flush(self) -> None:
        """Nothing before close: O_DIRECT writes whole blocks."""

    def close(self) -> None:
        if self.closed:
            return
        try:
            length = self.tell()
            if self._filled:
                padded = -(-self._filled // BLOCK) * BLOCK
                self._view[self._filled : padded] = bytes(padded - self._filled)
                self._write_out(padded)
            os.ftruncate(self._fd, length)
            os.fsync(self._fd)  # the length; the data went around the cache
        finally:
            self._view.release()
            self._buffer.close()
            os.close(self._fd)
            super().close()

    def abandon(self) -> None:
        """Close without writing what the buffer holds (the write failed: DCP removes the folder)."""
        if self.closed:
            return
        self._filled = 0
        self._view.release()
        self._buffer.close()
        os.close(self._fd)
        super().close()

    def _write_out(self, length: int) -> None:
        done = 0
        while done < length:
            try:
                done += os.write(self._fd, self._view[done:length])
            except OSError as e:
                if e.errno != errno.EINVAL or not self._direct:
                    raise
                self._buffered()  # this filesystem takes no direct write after all
                continue
            if done < length and self._direct:  # a size limit or a full disk: the rest meets it with its own errno
                self._buffered()
        self._written += length
        self._filled = 0

    def _buffered(self) -> None:
        """The rest of the file through the page cache: what remains need not be aligned."""
        flags = fcntl.fcntl(self._fd, fcntl.F_GETFL)
        fcntl.fcntl(self._fd, fcntl.F_SETFL, flags & ~os.O_DIRECT)
        self._direct = False


def open_direct(path: Path) -> io.IOBase:
    """`path` for writing with O_DIRECT, or buffered where the filesystem or the platform refuses it."""
    flag = getattr(os, "O_DIRECT", 0)
    if flag:
        try:
            return DirectStream(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | flag, 0o644))
        except OSError as e:
            if e.errno != errno.EINVAL:
                raise
    return open(path, "wb")


class DirectFileSystem(FileSystem):
    @contextmanager
    def create_stream(self, path: str | os.PathLike, mode: str) -> Iterator[io.IOBase]:
        if mode != "wb":
            with super().create_stream(path, mode) as stream:
                yield stream
            return
        stream = open_direct(Path(path))
        try:
            yield stream
        except BaseException:
            if isinstance(stream, DirectStream):
                stream.abandon()
            raise
        finally:
            stream.close()


def direct_writer(folder: Path) -> FileSystemWriter:
    """DCP's writer for `folder` with its shards written through `DirectStream`."""
    writer = FileSystemWriter(folder)
    writer.fs = DirectFileSystem()
    return writer
