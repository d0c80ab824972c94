"""Work units: the corpus cut into pieces of about `unit_bytes` that workers tokenize independently.

A unit is a run of consecutive small files (at most MAX_UNIT_FILES), or one piece of a large file: a byte range of an
uncompressed .jsonl (the range owns the lines that start inside it), a run of whole frames of a .jsonl.zst of several
frames or of members of a BGZF .jsonl.gz (the same rule in decompressed bytes), or a run of row groups of a Parquet
file. Other large files (other gzip, a .zst of one frame, JSON arrays, one-document text) are one unit each, streamed
by one worker. The plan depends only on the
files and `unit_bytes`, so a resumed run and every task of a split run rebuild exactly the same units; the documents,
and so the shards, do not depend on the plan at all.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from dlx.data.prepare.frames import bgzf_member_starts, zstd_frame_starts
from dlx.data.prepare.inputs import InputFile

MIN_UNIT_BYTES = 64 << 10
MAX_UNIT_BYTES = 16 << 20
UNITS_PER_CORPUS = 64  # enough units to keep every worker busy and the progress bar moving on a small corpus
MAX_UNIT_FILES = 1024  # files in one unit at most: bounds what a unit holds (and sends to a worker) for tiny files


@dataclass(frozen=True)
class WorkUnit:
    index: int
    """Position in the plan: results are consumed in this order."""
    files: tuple[InputFile, ...]
    """The files to read, in order (exactly one when `end` is set)."""
    nbytes: int
    """Bytes on disk this unit stands for: progress, MB/s and the split between tasks count them."""
    files_completed: int
    """Files whose end this unit reads."""
    start: int = 0
    """First byte (.jsonl, .jsonl.zst, .jsonl.gz) or row group (Parquet) of a piece of one file."""
    end: int | None = None
    """One past the last byte or row group of the piece; None reads whole files."""
    before: int = 0
    """Compressed pieces: where the frame before `start` begins (its last byte tells whether a line starts at start)."""


def choose_unit_bytes(total_bytes: int) -> int:
    """About UNITS_PER_CORPUS units for a small corpus, MAX_UNIT_BYTES each for a large one."""
    return max(MIN_UNIT_BYTES, min(MAX_UNIT_BYTES, total_bytes // UNITS_PER_CORPUS))


def plan_units(files: Iterable[InputFile], unit_bytes: int) -> Iterator[WorkUnit]:
    """The units in order, lazily (a corpus of millions of files never holds all units, or all files, at once)."""
    index = 0
    group: list[InputFile] = []
    group_bytes = 0
    for f in files:
        if f.size < unit_bytes and group_bytes + f.size <= unit_bytes and len(group) < MAX_UNIT_FILES:
            group.append(f)
            group_bytes += f.size
            continue
        if group:
            yield WorkUnit(index, tuple(group), group_bytes, len(group))
            index, group, group_bytes = index + 1, [], 0
        if f.size < unit_bytes:
            group, group_bytes = [f], f.size
            continue
        for start, end, before, nbytes, last in _pieces(f, unit_bytes):
            yield WorkUnit(index, (f,), nbytes, int(last), start, end, before)
            index += 1
    if group:
        yield WorkUnit(index, tuple(group), group_bytes, len(group))


Piece = tuple[int, int | None, int, int, bool]
"""(start, end, before, nbytes, last piece of the file)."""


def _pieces(f: InputFile, unit_bytes: int) -> Iterator[Piece]:
    """A large file's pieces; the whole file as one piece when its format cannot be cut."""
    if f.kind == "jsonl" and f.compression is None:
        for start in range(0, f.size, unit_bytes):
            end = min(start + unit_bytes, f.size)
            yield start, end, 0, end - start, end == f.size
    elif f.kind == "jsonl" and f.compression in ("zst", "gz"):
        yield from _frame_pieces(f, unit_bytes)
    elif f.kind == "parquet":
        yield from _row_group_pieces(f, unit_bytes)
    else:
        yield 0, None, 0, f.size, True


def _frame_pieces(f: InputFile, unit_bytes: int) -> Iterator[Piece]:
    """Runs of whole zstd frames or BGZF members of about unit_bytes (compressed)."""
    start, before, previous = 0, 0, 0
    starts = zstd_frame_starts if f.compression == "zst" else bgzf_member_starts
    for frame in starts(f.path, f.size):
        if frame - start >= unit_bytes:
            yield start, frame, before, frame - start, False
            start, before = frame, previous
        previous = frame
    yield start, None if start == 0 else f.size, before, f.size - start, True


def _row_group_pieces(f: InputFile, unit_bytes: int) -> Iterator[Piece]:
    """Runs of whole row groups of about unit_bytes (compressed); the file's bytes are shared out in proportion."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        meta = pq.ParquetFile(f.path).metadata
        sizes = [
            sum(meta.row_group(g).column(c).total_compressed_size for c in range(meta.num_columns))
            for g in range(meta.num_row_groups)
        ]
    except (OSError, pa.ArrowException):
        sizes = []  # unreadable: one unit, whose reader reports it
    runs, first, run = [], 0, 0
    for g, size in enumerate(sizes):
        run += size
        if run >= unit_bytes or g == len(sizes) - 1:
            runs.append((first, g + 1, run))
            first, run = g + 1, 0
    if len(runs) < 2:
        yield 0, None, 0, f.size, True
        return
    total, done = sum(sizes), 0
    for first, end, run in runs:
        yield first, end, 0, f.size * (done + run) // total - f.size * done // total, end == len(sizes)
        done += run


def task_of(first_byte: int, nbytes: int, total_bytes: int, n_tasks: int) -> int:
    """The task a unit belongs to: tasks take consecutive units, about the same bytes each."""
    return min(n_tasks - 1, (first_byte + nbytes // 2) * n_tasks // max(total_bytes, 1))


def task_ranges(units: Iterable[WorkUnit], total_bytes: int, n_tasks: int) -> tuple[list[list[int]], int]:
    """[first unit, end unit, bytes, files] of every task (consecutive units), and the number of units."""
    ranges = [[-1, -1, 0, 0] for _ in range(n_tasks)]
    offset, n_units = 0, 0
    for unit in units:
        task = ranges[task_of(offset, unit.nbytes, total_bytes, n_tasks)]
        task[0] = unit.index if task[0] < 0 else task[0]
        task[1], task[2], task[3] = unit.index + 1, task[2] + unit.nbytes, task[3] + unit.files_completed
        offset, n_units = offset + unit.nbytes, n_units + 1
    end = 0
    for task in ranges:  # a task without units gets the empty range where its units would have been
        if task[0] < 0:
            task[0] = task[1] = end
        end = task[1]
    return ranges, n_units
