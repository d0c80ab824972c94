"""Documents out of input files, streamed: one JSON line, array element, Parquet row or whole text file at a time.

Readers yield either a document's text (a str) or a BadRecord; they never raise for bad input, so one broken file
costs only its own documents. Memory is bounded by the largest single document, never by the file or corpus size.
"""

from __future__ import annotations

import codecs
import gzip
import io
import json
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import IO

import zstandard

from dlx.data.prepare.inputs import InputFile
from dlx.data.prepare.units import WorkUnit

READ_CHUNK = 1 << 20


@dataclass(frozen=True)
class BadRecord:
    path: str
    line: int
    """1-based line (row for Parquet, 0 for the whole file); for byte-range units see `offset`."""
    reason: str
    offset: int | None = None
    """Byte offset of the line, when the reader started mid-file and could not count lines cheaply."""
    unit: str = "line"

    def where(self) -> str:
        if self.offset is not None:
            return f"{self.path}:{line_at_offset(self.path, self.offset)}"
        if self.line == 0:
            return self.path  # the whole file
        return f"{self.path}:{self.unit} {self.line}" if self.unit != "line" else f"{self.path}:{self.line}"


Item = str | BadRecord


def line_at_offset(path: str, offset: int) -> int:
    """1-based line number of the byte at `offset` (read only for the few bad records that get reported)."""
    newlines = 0
    with open(path, "rb") as f:
        remaining = offset
        while remaining > 0 and (block := f.read(min(READ_CHUNK, remaining))):
            newlines += block.count(b"\n")
            remaining -= len(block)
    return newlines + 1


CORRUPT_ERRORS = (OSError, EOFError, zlib.error, zstandard.ZstdError)


def open_binary(f: InputFile) -> IO[bytes]:
    """The decompressed bytes of a file as a buffered stream."""
    raw = open(f.path, "rb")  # noqa: SIM115 - returned to the caller, who closes it
    if f.compression == "gz":
        return gzip.GzipFile(fileobj=raw, mode="rb")
    if f.compression == "zst":
        return io.BufferedReader(zstandard.ZstdDecompressor().stream_reader(raw, closefd=True), READ_CHUNK)
    return raw


def read_unit(unit: WorkUnit, text_field: str) -> Iterator[Item]:
    """Every document (or bad record) of a work unit, in order."""
    if unit.end is not None:
        yield from _read_jsonl_range(unit.files[0], unit.start, unit.end, text_field)
        return
    for f in unit.files:
        yield from read_file(f, text_field)


def read_file(f: InputFile, text_field: str) -> Iterator[Item]:
    """Every document of one whole file; unreadable or corrupt files end in a BadRecord."""
    if f.kind == "parquet":
        from dlx.data.prepare.parquet import read_parquet

        yield from read_parquet(f.path, text_field)
        return
    try:
        with open_binary(f) as stream:
            if f.kind == "text":
                yield _text_document(f.path, stream.read())
            elif f.kind == "jsonl":
                yield from _json_lines(f.path, stream, text_field)
            else:
                yield from _json_file(f.path, stream, text_field)
    except CORRUPT_ERRORS as e:
        yield BadRecord(f.path, 0, f"unreadable: {getattr(e, 'strerror', None) or e}")


def _text_document(path: str, data: bytes) -> Item:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        return BadRecord(path, data.count(b"\n", 0, e.start) + 1, f"invalid UTF-8 at byte {e.start}")


class NoText(ValueError):
    """A well-formed record that holds no usable document text."""


def json_text(obj: object, text_field: str) -> str:
    """The document text of one JSON record; NoText says why there is none."""
    if not isinstance(obj, dict):
        raise NoText(f"not a JSON object ({type(obj).__name__})")
    if text_field not in obj:
        raise NoText(f"no {text_field!r} field (keys: {', '.join(list(obj)[:8])})")
    return checked_text(obj[text_field], text_field)


def checked_text(text: object, text_field: str) -> str:
    if not isinstance(text, str):
        raise NoText(f"{text_field!r} is not a string ({type(text).__name__})")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise NoText(f"{text_field!r} holds an unpaired surrogate (not valid Unicode)") from None
    return text


def _parse_line(path: str, raw: bytes, text_field: str, line: int, offset: int | None) -> Item | None:
    if not raw.strip():
        return None
    try:
        text = raw.decode("utf-8")  # json.loads(bytes) would also accept UTF-16/32: only UTF-8 is valid JSON lines
    except UnicodeDecodeError as e:
        return BadRecord(path, line, f"invalid UTF-8 at byte {e.start} of the line", offset)
    try:
        obj = json.loads(text)
    except ValueError as e:
        return BadRecord(path, line, f"malformed JSON: {str(e).splitlines()[0]}", offset)
    try:
        return json_text(obj, text_field)
    except NoText as e:
        return BadRecord(path, line, str(e), offset)


def _json_lines(path: str, stream: IO[bytes], text_field: str, first_line: int = 1) -> Iterator[Item]:
    for line, raw in enumerate(stream, first_line):
        item = _parse_line(path, raw, text_field, line, None)
        if item is not None:
            yield item


def _read_jsonl_range(f: InputFile, start: int, end: int, text_field: str) -> Iterator[Item]:
    """The lines that start in [start, end): the unit before owns a line that straddles `start`."""
    try:
        with open(f.path, "rb") as stream:
            if start > 0:
                stream.seek(start - 1)
                stream.readline()  # the rest of the line holding byte start-1 (just "\n" if a line starts at start)
            pos = stream.tell()
            while pos < end and (raw := stream.readline()):
                item = _parse_line(f.path, raw, text_field, 0, pos)
                if item is not None:
                    yield item
                pos += len(raw)
    except OSError as e:
        yield BadRecord(f.path, 0, f"unreadable: {e.strerror or e}")


def _json_file(path: str, stream: IO[bytes], text_field: str) -> Iterator[Item]:
    """A .json file: a JSON array of objects (WuDao) or JSON lines, told apart by the first non-blank byte."""
    head = stream.read(READ_CHUNK)
    first = head.lstrip()[:1]
    if first != b"[":
        yield from _json_lines(path, io.BufferedReader(_Prepend(head, stream)), text_field)
        return
    yield from _json_array(path, head, stream, text_field)


def _json_array(path: str, head: bytes, stream: IO[bytes], text_field: str) -> Iterator[Item]:
    """Elements of a top-level JSON array, decoded one at a time so the file is never held whole."""
    reader = _ArrayReader(stream)
    try:
        reader.append(head)
        reader.peek()
        reader.pos += 1  # the "["
        first = True
        while (c := reader.peek()) != "]":
            if not first:
                if c != ",":
                    raise _Malformed("expected ',' or ']' between array elements")
                reader.pos += 1
                reader.peek()
            first = False
            line = reader.line
            obj = reader.value()
            try:
                yield json_text(obj, text_field)
            except NoText as e:
                yield BadRecord(path, line, str(e))
    except _Malformed as e:
        yield BadRecord(path, reader.line, f"malformed JSON array: {e} (rest of the file skipped)")


class _Malformed(Exception):
    pass


class _ArrayReader:
    """A growing window over a decoded JSON stream, with the line number of the read position."""

    def __init__(self, stream: IO[bytes]):
        self.stream, self.utf8 = stream, codecs.getincrementaldecoder("utf-8")()
        self.buf, self.pos, self.line, self.eof = "", 0, 1, False

    def append(self, data: bytes) -> None:
        try:
            self.buf += self.utf8.decode(data, final=not data)
        except UnicodeDecodeError as e:
            raise _Malformed(f"invalid UTF-8 ({e.reason})") from None
        self.eof = not data

    def fill(self) -> bool:
        """Read more, dropping what was parsed; at least as much as is left, so a huge element costs O(its size)."""
        if self.eof:
            return False
        self.buf, self.pos = self.buf[self.pos :], 0
        self.append(self.stream.read(max(READ_CHUNK, 2 * len(self.buf))))
        return True

    def peek(self) -> str:
        """The next non-blank character ("" at the end of the file), skipping blanks."""
        while True:
            buf, n = self.buf, len(self.buf)
            while self.pos < n and buf[self.pos] in " \t\r\n":
                self.line += buf[self.pos] == "\n"
                self.pos += 1
            if self.pos < n:
                return buf[self.pos]
            if not self.fill():
                raise _Malformed("the file ends inside the array")

    def value(self) -> object:
        """Decode one JSON value at the read position, reading more while it may be cut off."""
        while True:
            try:
                obj, end = _DECODER.raw_decode(self.buf, self.pos)
                if end < len(self.buf) or self.eof:
                    break
            except json.JSONDecodeError as e:
                if self.eof:
                    raise _Malformed(e.msg) from None
            self.fill()
        self.line += self.buf.count("\n", self.pos, end)
        self.pos = end
        return obj


_DECODER = json.JSONDecoder()


class _Prepend(io.RawIOBase):
    """A stream that first returns `head`, then the rest of `stream` (to re-read what was peeked)."""

    def __init__(self, head: bytes, stream: IO[bytes]):
        self._head, self._stream = head, stream

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        if self._head:
            n = min(len(b), len(self._head))
            b[:n], self._head = self._head[:n], self._head[n:]
            return n
        data = self._stream.read(len(b))
        b[: len(data)] = data
        return len(data)
