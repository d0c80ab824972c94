"""How a worker hands batches to the trainer: shared-memory slots plus two pipes, all plain file descriptors.

- Slots: one anonymous shared memory file (memfd) per worker, holding `n_slots` batches of (2, B, seq_len) int64.
  A memfd has no name in /dev/shm, so nothing can be left there whatever way the processes end; the kernel frees it
  when the last process holding it exits.
- Ready pipe (worker → trainer): one fixed-size message per filled slot, or an error report.
- Free pipe (trainer → worker): the indices of slots the trainer has copied out; the worker blocks on it when every
  slot is full. That is the bounded queue: at most `n_slots` batches wait, and nobody polls.

The pipes double as liveness signals: when either side dies, the kernel closes its ends and the other side reads EOF
at once (or gets EPIPE when writing), with no heartbeat.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import select
import struct
import tempfile

import numpy as np

READY = 1
ERROR = 2
_MESSAGE = struct.Struct("<iqq")  # (kind, slot or text length, batch sequence number)
_SLOT_INDEX = struct.Struct("<i")
MAX_ERROR_BYTES = 8192


def anonymous_shared_fd(size: int) -> int:
    """A file descriptor of `size` bytes of shared memory that has no name anywhere (nothing to clean up)."""
    if hasattr(os, "memfd_create"):
        fd = os.memfd_create("dlx-loader", os.MFD_CLOEXEC)
    else:  # other POSIX systems: a temporary file unlinked at once serves the same purpose
        fd, path = tempfile.mkstemp(prefix="dlx-loader-")
        os.unlink(path)
    os.ftruncate(fd, size)
    return fd


class SharedSlots:
    """`n_slots` batch buffers of shape (2, B, seq_len) int64 in one shared memory mapping."""

    def __init__(self, fd: int, n_slots: int, micro_batch_size: int, seq_len: int):
        shape = (2, micro_batch_size, seq_len)
        slot_bytes = int(np.prod(shape)) * 8
        self._mmap = mmap.mmap(fd, n_slots * slot_bytes)
        self.views = [
            np.ndarray(shape, dtype=np.int64, buffer=self._mmap, offset=i * slot_bytes) for i in range(n_slots)
        ]

    @staticmethod
    def nbytes(n_slots: int, micro_batch_size: int, seq_len: int) -> int:
        return n_slots * 2 * micro_batch_size * seq_len * 8

    def close(self) -> None:
        self.views = []
        # BufferError: a view is still referenced somewhere; the mapping goes when it does.
        with contextlib.suppress(BufferError):
            self._mmap.close()


def read_exact(fd: int, size: int) -> bytes:
    """`size` bytes from a pipe; b"" when the writer has closed it (EOF) before the first byte."""
    data = b""
    while len(data) < size:
        chunk = os.read(fd, size - len(data))
        if not chunk:
            if data:
                raise EOFError("pipe closed in the middle of a message")
            return b""
        data += chunk
    return data


def wait_readable(fd: int, timeout: float) -> bool:
    """Block (releasing the GIL) until `fd` has data or EOF, or `timeout` seconds pass."""
    readable, _, _ = select.select([fd], [], [], timeout)
    return bool(readable)


def send_ready(fd: int, slot: int, sequence: int) -> None:
    os.write(fd, _MESSAGE.pack(READY, slot, sequence))


def send_error(fd: int, text: str) -> None:
    data = text.encode(errors="replace")[-MAX_ERROR_BYTES:]
    os.write(fd, _MESSAGE.pack(ERROR, len(data), -1) + data)


def receive(fd: int) -> tuple[int, int, int, str] | None:
    """(kind, slot, sequence, error text) of the next message, or None at EOF (the worker is gone)."""
    header = read_exact(fd, _MESSAGE.size)
    if not header:
        return None
    kind, value, sequence = _MESSAGE.unpack(header)
    if kind == ERROR:
        return kind, -1, sequence, read_exact(fd, value).decode(errors="replace")
    return kind, value, sequence, ""


def send_free(fd: int, slots: list[int]) -> None:
    os.write(fd, b"".join(_SLOT_INDEX.pack(slot) for slot in slots))


def receive_free(fd: int) -> list[int]:
    """Every freed slot waiting in the pipe (blocks until there is one); [] at EOF: the trainer closed or died.

    Each `send_free` is one write of whole 4-byte indices, under PIPE_BUF, so the kernel never splits an index.
    """
    data = os.read(fd, 1024 * _SLOT_INDEX.size)
    return [index for (index,) in _SLOT_INDEX.iter_unpack(data)]
