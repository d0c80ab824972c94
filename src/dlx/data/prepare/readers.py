"""Documents out of input files and work units, streamed: one JSON line, JSON array element (ijson), Parquet row or
whole text file at a time.

Readers yield either a Document (its text, a str, that also says where in its file it was read and carries the
record's RECORD_FIELDS) or a BadRecord; they never raise for bad input, so one broken file costs only its own
documents. Memory is bounded by the largest single document, never by the file or corpus size.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import re
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import IO

import ijson
import zstandard

from dlx.data.prepare.inputs import InputFile
from dlx.data.prepare.units import WorkUnit

READ_CHUNK = 1 << 20
PARQUET_BATCH_ROWS = 1024


@dataclass(frozen=True)
class BadRecord:
    path: str
    line: int
    """1-based line, Parquet row or JSON array element (see `unit`), 0 for the whole file; see also `offset`."""
    reason: str
    offset: int | None = None
    """Byte offset of the line, when the reader started mid-file and could not count lines cheaply."""
    unit: str = "line"
    """What `line` counts: `line`, `row`, `element`, or lines of the zstd frames from a byte on."""

    def where(self) -> str:
        if self.offset is not None:
            return f"{self.path}:{line_at_offset(self.path, self.offset)}"
        if self.line == 0:
            return self.path  # the whole file
        return f"{self.path}:{self.unit} {self.line}" if self.unit != "line" else f"{self.path}:{self.line}"


RECORD_FIELDS = ("id", "url", "path", "lang", "language", "max_stars_repo_path")
"""Fields of a JSON record or Parquet row carried beside its text: an identifier and address for the curation audit
(`id`, `url`), and what The Stack and other code corpora declare a file to be (`path`, `lang`, ...)."""


class Document(str):
    """A document's text, and where it was read: `at` says what `where` counts (`line` or `element`, 1-based, in a
    file read whole; `offset`, the byte its line starts at, in a byte range of JSON lines; `row`, 1-based, of a
    Parquet file; `frame_line`, 1-based, of the zstd frames or gzip members read from a byte on; "" for a file that
    is one document). `fields`: the record's RECORD_FIELDS that it has, as strings."""

    at: str = ""
    where: int = 0
    fields: dict[str, str] = {}  # noqa: RUF012 - the shared empty default, never changed in place


def located(text: str, at: str, where: int, record: dict | None = None) -> Document:
    """`text` as a Document read at (`at`, `where`), with the record's RECORD_FIELDS."""
    doc = Document(text)
    doc.at, doc.where = at, where
    if record is not None:
        fields = {name: str(record[name]) for name in RECORD_FIELDS if record.get(name) is not None}
        if fields:
            doc.fields = fields
    return doc


Item = Document | BadRecord


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
    """The decompressed bytes of a file as a buffered stream (peek shows up to READ_CHUNK bytes)."""
    if f.compression == "gz":
        return io.BufferedReader(gzip.open(f.path, "rb"), READ_CHUNK)  # type: ignore[arg-type]
    raw = open(f.path, "rb", buffering=READ_CHUNK)  # noqa: SIM115 - returned to the caller, who closes it
    if f.compression == "zst":
        return io.BufferedReader(zstandard.ZstdDecompressor().stream_reader(raw, closefd=True), READ_CHUNK)
    return raw


def read_unit(unit: WorkUnit, text_field: str) -> Iterator[Item]:
    """Every document (or bad record) of a work unit, in order."""
    if unit.end is None:
        for f in unit.files:
            yield from read_file(f, text_field)
        return
    f = unit.files[0]
    if f.kind == "parquet":
        yield from _parquet_rows(f.path, text_field, range(unit.start, unit.end))
    elif f.compression is not None:
        yield from _guarded(f, _jsonl_frames(f, unit, text_field))
    else:
        yield from _guarded(f, _jsonl_range(f, unit.start, unit.end, text_field))


def sample_documents(
    units: Iterable[WorkUnit], text_field: str, max_chars: int, bad: list[str] | None = None
) -> list[str]:
    """The first documents of the units, about max_chars of them. `bad`: gets each bad record's reason."""
    sample, chars = [], 0
    for unit in units:
        for item in read_unit(unit, text_field):
            if isinstance(item, BadRecord) and bad is not None:
                bad.append(item.reason)
            if isinstance(item, str) and item:
                sample.append(item)
                chars += len(item)
                if chars >= max_chars:
                    return sample
    return sample


def read_file(f: InputFile, text_field: str) -> Iterator[Item]:
    """Every document of one whole file; unreadable or corrupt files end in a BadRecord."""
    if f.kind == "parquet":
        yield from _parquet_rows(f.path, text_field, None)
        return
    yield from _guarded(f, _whole_file(f, text_field))


def _guarded(f: InputFile, items: Iterator[Item]) -> Iterator[Item]:
    """The items, ended by one BadRecord if the file cannot be read or decompressed."""
    try:
        yield from items
    except CORRUPT_ERRORS as e:
        yield BadRecord(f.path, 0, f"unreadable: {getattr(e, 'strerror', None) or e}")


def _whole_file(f: InputFile, text_field: str) -> Iterator[Item]:
    with open_binary(f) as stream:
        if f.kind == "text":
            yield _text_document(f.path, stream.read())
        elif f.kind == "jsonl" or stream.peek(READ_CHUNK).lstrip()[:1] != b"[":  # a .json of JSON lines
            yield from _json_lines(f.path, stream, text_field)
        else:
            yield from _json_array(f.path, stream, text_field)


def _text_document(path: str, data: bytes) -> Item:
    try:
        return located(data.decode("utf-8"), "", 0)
    except UnicodeDecodeError as e:
        return BadRecord(path, data.count(b"\n", 0, e.start) + 1, f"invalid UTF-8 at byte {e.start}")


TEXT_FIELDS = ("text", "content", "body", "document", "raw_content", "article", "passage", "story")
"""Field names that usually hold a corpus's text (WuDao: content), in the order a suggestion prefers them."""
_NO_FIELD = re.compile(r"no '(?P<field>.+?)' field \(keys: (?P<keys>.*)\)$")


def missing_field_hint(reasons: Iterable[str]) -> str:
    """For a corpus that gave no document: "the records have no 'text' field (their fields: id, title, content);
    give --text-field content", from the first bad record that lacks the text field; "" when none lacks it."""
    for reason in reasons:
        found = _NO_FIELD.search(reason)
        if found is None:
            continue
        keys = [key for key in found["keys"].split(", ") if key]
        guess = next((name for name in TEXT_FIELDS if name in keys), None)
        fix = f"give --text-field {guess}" if guess else "give --text-field with the field that holds the text"
        return f"the records have no {found['field']!r} field (their fields: {', '.join(keys)}); {fix}"
    return ""


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


def _parse_line(
    path: str, raw: bytes, text_field: str, line: int, offset: int | None, unit: str = "line"
) -> Item | None:
    """The document (or bad record) of one JSON line, at `line` (1-based) or at byte `offset` when not None."""
    if not raw.strip():
        return None
    try:
        text = raw.decode("utf-8")  # json.loads(bytes) would also accept UTF-16/32: only UTF-8 is valid JSON lines
    except UnicodeDecodeError as e:
        return BadRecord(path, line, f"invalid UTF-8 at byte {e.start} of the line", offset, unit)
    try:
        obj = json.loads(text)
    except ValueError as e:
        return BadRecord(path, line, f"malformed JSON: {str(e).splitlines()[0]}", offset, unit)
    try:
        text = json_text(obj, text_field)
    except NoText as e:
        return BadRecord(path, line, str(e), offset, unit)
    if offset is not None:
        return located(text, "offset", offset, obj)
    return located(text, "line" if unit == "line" else "frame_line", line, obj)


def _json_lines(path: str, stream: IO[bytes], text_field: str) -> Iterator[Item]:
    for line, raw in enumerate(stream, 1):
        item = _parse_line(path, raw, text_field, line, None)
        if item is not None:
            yield item


def _jsonl_range(f: InputFile, start: int, end: int, text_field: str) -> Iterator[Item]:
    """The lines that start in [start, end): the unit before owns a line that straddles `start`."""
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


def _jsonl_frames(f: InputFile, unit: WorkUnit, text_field: str) -> Iterator[Item]:
    """The lines that start in the decompressed bytes of the frames (zstd) or members (BGZF) in [start, end), the
    last one read to its end.

    As for byte ranges, a line that straddles `start` belongs to the unit before; whether one does is told by the
    last decompressed byte of the frame before.
    """
    assert unit.end is not None and f.compression is not None
    where = f"{'zstd frames' if f.compression == 'zst' else 'gzip members'} from byte {unit.start}, line"
    with open(f.path, "rb") as raw:
        fd = raw.fileno()
        owns_first = unit.start == 0 or _last_byte(f.compression, fd, unit.before, unit.start) == b"\n"
        rest = None
        for line, data in enumerate(_window(f.compression, fd, unit.start, unit.end), 1):
            if line == 1 and not owns_first:
                continue
            if not data.endswith(b"\n") and unit.end < f.size:
                rest = rest or _window(f.compression, fd, unit.end, f.size)
                data += rest.readline()
            item = _parse_line(f.path, data, text_field, line, None, where)
            if item is not None:
                yield item


def _window(compression: str, fd: int, start: int, end: int) -> IO[bytes]:
    """The decompressed bytes of the zstd frames or gzip members stored in [start, end) of a file."""
    window = _Window(fd, start, end)
    if compression == "gz":
        return io.BufferedReader(gzip.GzipFile(fileobj=window, mode="rb"), READ_CHUNK)  # type: ignore[arg-type]
    return io.BufferedReader(zstandard.ZstdDecompressor().stream_reader(window, read_across_frames=True), READ_CHUNK)


def _last_byte(compression: str, fd: int, start: int, end: int) -> bytes:
    """The last decompressed byte of the frames in [start, end), looking further back past empty frames."""
    last, stream = b"", _window(compression, fd, start, end)
    while block := stream.read(READ_CHUNK):
        last = block[-1:]
    if not last and start > 0:
        return _last_byte(compression, fd, 0, start)
    return last or b"\n"


class _Window(io.RawIOBase):
    """Bytes [start, end) of an open file, read by position (two windows on one file do not disturb each other)."""

    def __init__(self, fd: int, start: int, end: int):
        self.fd, self.pos, self.end = fd, start, end

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        data = os.pread(self.fd, min(len(b), self.end - self.pos), self.pos)
        b[: len(data)] = data
        self.pos += len(data)
        return len(data)


def _json_array(path: str, stream: IO[bytes], text_field: str) -> Iterator[Item]:
    """Elements of a top-level JSON array, decoded one at a time (ijson) so the file is never held whole."""
    element = 0
    try:
        for element, obj in enumerate(ijson.items(stream, "item", use_float=True, buf_size=READ_CHUNK), 1):
            try:
                yield located(json_text(obj, text_field), "element", element, obj)
            except NoText as e:
                yield BadRecord(path, element, str(e), unit="element")
    except ijson.JSONError as e:
        message = e.args[0] if e.args else ""
        reason = (message.decode("utf-8", "replace") if isinstance(message, bytes) else str(message)).splitlines()
        yield BadRecord(
            path,
            element + 1,
            f"malformed JSON array: {reason[0] if reason else e} (rest of the file skipped)",
            unit="element",
        )


def _parquet_rows(path: str, text_field: str, row_groups: range | None) -> Iterator[Item]:
    """One row is one document, read a record batch at a time from the text column and the RECORD_FIELDS columns the
    file has (whole file or row groups).

    A file that cannot be opened or lacks the column is one BadRecord, reported by its first piece only.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    first_piece = row_groups is None or row_groups.start == 0
    try:
        pf = pq.ParquetFile(path)
    except (OSError, pa.ArrowException) as e:
        if first_piece:
            yield BadRecord(path, 0, f"unreadable Parquet file: {e}")
        return
    names = pf.schema_arrow.names
    if text_field not in names:
        if first_piece:
            yield BadRecord(path, 0, f"no {text_field!r} column (columns: {', '.join(names[:8])})")
        return
    row = sum(pf.metadata.row_group(g).num_rows for g in range(row_groups.start)) if row_groups else 0
    groups = list(row_groups) if row_groups is not None else None
    extra = [name for name in RECORD_FIELDS if name in names and name != text_field]
    try:
        for batch in pf.iter_batches(batch_size=PARQUET_BATCH_ROWS, row_groups=groups, columns=[text_field, *extra]):
            records = batch.select(extra).to_pylist() if extra else None
            for i, value in enumerate(batch.column(0).to_pylist()):
                row += 1
                try:
                    yield located(checked_text(value, text_field), "row", row, records[i] if records else None)
                except NoText as e:
                    yield BadRecord(path, row, str(e), unit="row")
    except (OSError, pa.ArrowException) as e:
        yield BadRecord(path, row + 1, f"unreadable Parquet data: {e}", unit="row")
