"""Work units: the corpus cut into pieces of about `unit_bytes` that workers tokenize independently.

A unit is either a run of consecutive small files, or one byte range of a large uncompressed JSON-lines file (the range
owns the lines that start inside it). Other large files (compressed, JSON arrays, Parquet, one-document text) are one
unit each, streamed by one worker. The plan depends only on the file list and `unit_bytes`, so a resumed run
rebuilds exactly the units of the run it continues; the documents, and so the shards, do not depend on the plan at all.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from dlx.data.prepare.inputs import InputFile

MIN_UNIT_BYTES = 64 << 10
MAX_UNIT_BYTES = 16 << 20
UNITS_PER_CORPUS = 64  # enough units to keep every worker busy and the progress bar moving on a small corpus


@dataclass(frozen=True)
class WorkUnit:
    index: int
    """Position in the plan: results are consumed in this order."""
    files: tuple[InputFile, ...]
    """The files to read, in order (exactly one when `end` is set)."""
    start: int = 0
    """First byte of the range (byte-range units only)."""
    end: int | None = None
    """One past the last byte of the range; None reads whole files."""

    @property
    def nbytes(self) -> int:
        """Input bytes this unit covers, for progress and MB/s."""
        return (self.end - self.start) if self.end is not None else sum(f.size for f in self.files)

    @property
    def files_completed(self) -> int:
        """Files whose last byte this unit reads."""
        if self.end is None:
            return len(self.files)
        return int(self.end >= self.files[0].size)


def choose_unit_bytes(total_bytes: int) -> int:
    """About UNITS_PER_CORPUS units for a small corpus, MAX_UNIT_BYTES each for a large one."""
    return max(MIN_UNIT_BYTES, min(MAX_UNIT_BYTES, total_bytes // UNITS_PER_CORPUS))


def plan_units(files: list[InputFile], unit_bytes: int) -> Iterator[WorkUnit]:
    """The units in order, lazily (a corpus of millions of files never holds all units at once)."""
    index = 0
    group: list[InputFile] = []
    group_bytes = 0
    for f in files:
        if f.size < unit_bytes or not f.splittable:
            if group and (group_bytes + f.size > unit_bytes or f.size >= unit_bytes):
                yield WorkUnit(index, tuple(group))
                index, group, group_bytes = index + 1, [], 0
            group.append(f)
            group_bytes += f.size
            continue
        if group:
            yield WorkUnit(index, tuple(group))
            index, group, group_bytes = index + 1, [], 0
        for start in range(0, f.size, unit_bytes):
            yield WorkUnit(index, (f,), start, min(start + unit_bytes, f.size))
            index += 1
    if group:
        yield WorkUnit(index, tuple(group))
