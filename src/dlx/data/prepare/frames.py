"""Where a compressed file can be cut into pieces that decompress on their own, found from headers alone: the frames
of a .zst, the members of a BGZF .gz.

A file written by `zstd` is usually one frame and cannot be cut. Files of several frames can: `pzstd` (which puts a
skippable frame holding the next frame's size before each frame), the seekable format (a seek table at the end of
the file) and frames written one after another. Finding them reads a few bytes per frame with a seek table or pzstd's
hints, and three bytes per block (128 KB of output) otherwise; a file is only walked block by block when its first
frame's declared size proves that more frames follow.

A gzip file's members can only be found by decompressing it, except in BGZF (`bgzip`, blocked gzip), where every
member's header holds its size: those are cut at members, reading 18 bytes per member (64 KB of output); other gzip
files are one piece.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator

import zstandard

ZSTD_MAGIC = 0xFD2FB528
SKIPPABLE_MAGICS = range(0x184D2A50, 0x184D2A60)
PZSTD_HINT_MAGIC = 0x184D2A50
SEEKABLE_MAGIC = 0x8F92EAB1
SEEK_FOOTER_BYTES = 9
BLOCK_MAX = 128 << 10
BLOCK_HEADER_BYTES = 3
CHECKSUM_BYTES = 4
FRAME_HEADER_MAX = 18  # magic number and the longest frame header
BGZF_HEADER_BYTES = 18  # gzip header with the 6-byte BC extra field


def zstd_frame_starts(path: str, size: int) -> Iterator[int]:
    """The byte offsets at which the file's zstd frames start, in order (just 0 when it is one frame, or may be)."""
    with open(path, "rb") as f:
        fd = f.fileno()
        table = _seek_table(fd, size)
        if table is not None:
            yield from table
        elif _surely_several_frames(fd, size):
            yield from _walk_frames(fd, size)
        else:
            yield 0


def bgzf_member_starts(path: str, size: int) -> Iterator[int]:
    """The byte offsets of a BGZF file's members, in order (just 0 for any other gzip file)."""
    with open(path, "rb") as f:
        pos = 0
        while pos < size:
            member = _bgzf_size(os.pread(f.fileno(), BGZF_HEADER_BYTES, pos))
            if member is None:
                if pos == 0:
                    yield 0
                return  # not a BGZF member: the rest belongs to the last piece, whose reader reports any damage
            yield pos
            pos += member


def _bgzf_size(header: bytes) -> int | None:
    """The size of the BGZF member whose header this is, None if it is not one (gzip + the `BC` extra field)."""
    if len(header) < BGZF_HEADER_BYTES or header[:4] != b"\x1f\x8b\x08\x04" or header[12:16] != b"BC\x02\x00":
        return None
    return int.from_bytes(header[16:18], "little") + 1


def _u32(data: bytes, at: int = 0) -> int:
    return int.from_bytes(data[at : at + 4], "little")


def _seek_table(fd: int, size: int) -> list[int] | None:
    """Frame starts from a seekable-format seek table at the end of the file, None when there is none."""
    if size < SEEK_FOOTER_BYTES + 8:
        return None
    footer = os.pread(fd, SEEK_FOOTER_BYTES, size - SEEK_FOOTER_BYTES)
    if _u32(footer, 5) != SEEKABLE_MAGIC:
        return None
    n_frames, entry = _u32(footer), 12 if footer[4] & 0x80 else 8
    table_bytes = n_frames * entry
    if table_bytes + SEEK_FOOTER_BYTES + 8 > size:
        return None
    entries = os.pread(fd, table_bytes, size - SEEK_FOOTER_BYTES - table_bytes)
    starts, pos = [], 0
    for i in range(n_frames):
        starts.append(pos)
        pos += _u32(entries, i * entry)
    return starts if starts else None


def _surely_several_frames(fd: int, size: int) -> bool:
    """True when the file cannot be one frame: the first frame's declared content, stored raw, is shorter."""
    head = os.pread(fd, FRAME_HEADER_MAX, 0)
    if len(head) < 4:
        return False
    if _u32(head) in SKIPPABLE_MAGICS:
        return True  # pzstd begins with a skippable frame: walking its hints is cheap
    if _u32(head) != ZSTD_MAGIC:
        return False
    try:
        params = zstandard.get_frame_parameters(head)
    except zstandard.ZstdError:
        return False
    if params.content_size == zstandard.CONTENTSIZE_UNKNOWN:
        return False
    blocks = max(1, math.ceil(params.content_size / BLOCK_MAX))
    largest = zstandard.frame_header_size(head) + params.content_size + BLOCK_HEADER_BYTES * blocks + CHECKSUM_BYTES
    return size > largest


def _walk_frames(fd: int, size: int) -> Iterator[int]:
    """Frame starts by reading headers: a pzstd hint jumps over a frame, otherwise its block headers are read."""
    pos, hint = 0, None
    while pos < size:
        head = os.pread(fd, FRAME_HEADER_MAX, pos)
        if len(head) < 8:
            return
        magic = _u32(head)
        if magic in SKIPPABLE_MAGICS:
            length = _u32(head, 4)
            hint = _u32(head, 8) if magic == PZSTD_HINT_MAGIC and length == 4 else None
            pos += 8 + length
            continue
        if magic != ZSTD_MAGIC:
            return  # not a frame: the rest belongs to the last frame, whose reader reports the damage
        yield pos
        if hint is not None and _frame_boundary(fd, pos + hint, size):
            pos, hint = pos + hint, None
            continue
        pos, hint = _frame_end(fd, pos, head), None
        if pos is None:
            return


def _frame_boundary(fd: int, pos: int, size: int) -> bool:
    """A frame (or the end of the file) starts at pos."""
    return pos == size or (pos < size and (_u32(os.pread(fd, 4, pos)) in (ZSTD_MAGIC, *SKIPPABLE_MAGICS)))


def _frame_end(fd: int, pos: int, head: bytes) -> int | None:
    """One past the frame that starts at pos, from its block headers; None if the file ends inside it."""
    try:
        checksum = zstandard.get_frame_parameters(head).has_checksum
        pos += zstandard.frame_header_size(head)
    except zstandard.ZstdError:
        return None
    while True:
        header = os.pread(fd, BLOCK_HEADER_BYTES, pos)
        if len(header) < BLOCK_HEADER_BYTES:
            return None
        bits = int.from_bytes(header, "little")
        last, kind, length = bits & 1, (bits >> 1) & 3, bits >> 3
        pos += BLOCK_HEADER_BYTES + (1 if kind == 1 else length)  # an RLE block stores its byte once
        if last:
            return pos + (CHECKSUM_BYTES if checksum else 0)
