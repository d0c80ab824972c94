"""A run folder's files as `dlx view` reads them: JSON lines read as they grow, and whole small files.

A `LineFile` hands back only the lines appended since its last read. A file rewritten in place (a spike rollback marks
records abandoned, a resume drops the records past its checkpoint: both replace the file) or shortened is read again
from its start, and the caller is told to start over. A line without its newline at the end is held back until it is
whole; one cut short (a crash mid-write) is named until it is whole. Local files are read from where the last read
stopped; bucket objects are read whole (object stores have no append) and only the new part is parsed.
"""

from __future__ import annotations

import json
import os
from typing import Any

from dlx.data import storage
from dlx.view.sources import Problems

CHECK_BYTES = 64
"""Bytes before the read position that must still be there for a bucket object to count as appended to."""


class LineFile:
    """One JSON-lines file (`path` local or a URL), read incrementally."""

    def __init__(self, path: str, label: str) -> None:
        self.path, self.label = path, label
        self.offset = 0
        self.identity: Any = None
        self.seen = False
        """Whether the file existed at the last read."""

    def read_new(self, problems: Problems) -> tuple[list[dict[str, Any]], bool]:
        """(the records appended since the last read, whether the file was replaced so earlier records are void)."""
        data, reset = self._new_bytes()
        end = data.rfind(b"\n") + 1
        complete, rest = data[:end], data[end:]
        self.offset += end
        records, torn = parse_lines(complete)
        if torn:
            problems.add(f"{self.label}: {torn} line(s) cut short by a crash mid-write are skipped")
        cut = f"{self.label}: its last line is cut short (a crash mid-write); the lines before it are shown"
        if rest.strip() and not _parses(rest):
            problems.add(cut)
        else:
            problems.discard(cut)  # a writer finished the line
        return records, reset

    def _new_bytes(self) -> tuple[bytes, bool]:
        if storage.is_url(self.path):
            return self._new_object_bytes()
        try:
            with open(self.path, "rb") as f:
                stat = os.fstat(f.fileno())
                identity, previous = (stat.st_dev, stat.st_ino), self.identity
                replaced = identity != previous or stat.st_size < self.offset
                if replaced:
                    self.offset = 0
                self.identity, self.seen = identity, True
                f.seek(self.offset)
                return f.read(), replaced and previous is not None
        except FileNotFoundError:
            reset, self.offset, self.identity, self.seen = self.seen, 0, None, False
            return b"", reset

    def _new_object_bytes(self) -> tuple[bytes, bool]:
        try:
            data = storage.read_bytes(self.path)
        except FileNotFoundError:
            reset, self.offset, self.identity, self.seen = self.seen, 0, None, False
            return b"", reset
        self.seen = True
        before = data[max(self.offset - CHECK_BYTES, 0) : self.offset]
        reset = self.offset > 0 and (len(data) < self.offset or before != self.identity)
        if reset:
            self.offset = 0
        new = data[self.offset :]
        end = self.offset + new.rfind(b"\n") + 1
        self.identity = data[max(end - CHECK_BYTES, 0) : end]
        return new, reset


def parse_lines(data: bytes) -> tuple[list[dict[str, Any]], int]:
    """The JSON objects of whole lines, and how many lines were not JSON (cut short). One parse for the lot when
    every line is whole, line by line otherwise."""
    lines = [line for line in data.split(b"\n") if line.strip()]
    if not lines:
        return [], 0
    try:
        records = json.loads(b"[" + b",".join(lines) + b"]")
        return [r for r in records if isinstance(r, dict)], 0
    except ValueError:
        pass
    records, torn = [], 0
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            torn += 1
            continue
        if isinstance(record, dict):
            records.append(record)
    return records, torn


def _parses(line: bytes) -> bool:
    try:
        json.loads(line)
    except ValueError:
        return False
    return True


def read_text(path: str) -> str | None:
    """A small file's text (config.yaml, report.md, trainer_state.json); None when it is absent."""
    try:
        if storage.is_url(path):
            return storage.read_bytes(path).decode("utf-8", errors="replace")
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except (FileNotFoundError, NotADirectoryError):
        return None


def list_names(folder: str) -> list[str]:
    """Names directly under a folder (local or URL); empty when it is absent."""
    if storage.is_url(folder):
        return storage.listdir(folder)
    try:
        return sorted(os.listdir(folder))
    except (FileNotFoundError, NotADirectoryError):
        return []
