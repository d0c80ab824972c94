"""The per-document stages, in a worker: the document's kind (declared, else detected), language, quality,
decontamination (each may remove the document, with a line for the audit trail), PII redaction, and the signature the
global deduplication decides on. What each removes is counted per source and per reason in a JSON-able record that
folds in corpus order (`fold`), so any split into units or tasks counts the same."""

from __future__ import annotations

import sys
import time
from collections import Counter

import numpy as np

from dlx.data.curate import audit
from dlx.data.curate.code import looks_like_code
from dlx.data.curate.kinds import declared_kind
from dlx.data.curate.language import detect
from dlx.data.curate.minhash import MinHasher
from dlx.data.curate.pii import redact
from dlx.data.curate.quality import failed_rule
from dlx.data.curate.spec import CurateSpec
from dlx.data.curate.text import exact_hash, shingles

MAX_EXAMPLES = 5
EXAMPLE_CHARS = 120
HEAD_BYTES = 48
LONG_DOCUMENT_CHARS = 4 << 20
"""A document this long gets a line on stderr when its curation starts and ends (the bar moves per work unit)."""


def signature_dtype(bands: int) -> np.dtype:
    """One document's record for deduplication: where it is in the corpus (unit, ordinal) and in its input (file of
    its unit, how it is located, its id or url), its split hash and size, and its hashes."""
    fields = [("unit", "<u4"), ("ordinal", "<u4"), ("hash", "<u8"), ("bytes", "<u8"), ("source", "<u2")]
    fields += [("exact", "<u8"), ("head", f"S{HEAD_BYTES}"), ("file", "<u4"), ("at", "u1"), ("where", "<u8")]
    fields += [("key", f"S{audit.KEY_BYTES}"), ("key_kind", "u1")]
    if bands:
        fields.append(("bands", "<u8", (bands,)))
    return np.dtype(fields)


def empty_counts() -> dict:
    return {"sources": {}, "examples": {}}


def source_counts(counts: dict, source: str) -> dict:
    empty = {"in": [0, 0], "removed": {}, "languages": {}, "redacted": {}, "kinds": {}}
    return counts["sources"].setdefault(source, empty)


def count_removed(counts: dict, source: str, reason: str, nbytes: int, example: str) -> None:
    """One document of `source` removed for `reason`, its first characters kept as an example (up to MAX_EXAMPLES)."""
    removed = source_counts(counts, source)["removed"].setdefault(reason, [0, 0])
    removed[0] += 1
    removed[1] += nbytes
    examples = counts["examples"].setdefault(reason, [])
    if len(examples) < MAX_EXAMPLES:
        examples.append(example[:EXAMPLE_CHARS].replace("\n", " "))


def fold(total: dict, more: dict) -> None:
    """Add the counts of the units that follow."""
    for source, c in more["sources"].items():
        t = source_counts(total, source)
        t["in"] = [a + b for a, b in zip(t["in"], c["in"], strict=True)]
        for reason, (docs, nbytes) in c["removed"].items():
            r = t["removed"].setdefault(reason, [0, 0])
            r[0] += docs
            r[1] += nbytes
        for key in ("languages", "redacted", "kinds"):
            for name, n in c.get(key, {}).items():
                t[key][name] = t[key].get(name, 0) + n
    for reason, examples in more["examples"].items():
        mine = total["examples"].setdefault(reason, [])
        mine.extend(examples[: MAX_EXAMPLES - len(mine)])


class Curator:
    """Runs a CurateSpec's per-document stages for one unit: collects signatures (when `signatures`), the audit lines
    of the documents it removes (`removed`) and the files they came from (`origins`, which signatures index).
    `frames_from`: the byte the unit's zstd frames or gzip members start at, when it reads them."""

    def __init__(self, spec: CurateSpec, signatures: bool, frames_from: int | None = None):
        self.spec = spec
        self.minhash = MinHasher(spec.bands, spec.rows) if signatures and spec.dedup == "near" else None
        self.signatures = signatures and spec.dedup is not None
        self.labels = [label for label, _ in spec.sources] or ["corpus"]
        self.frames_from = frames_from
        self.records: list[tuple] = []
        self.removed: list[bytes] = []
        self.origins: list[dict] = []
        self._files: dict[str, int] = {}
        self.kind = "prose"
        """The kind of the last document `process` saw."""
        self.redacted = False
        """Whether the last document `process` kept had PII replaced."""
        self._place: tuple | None = None
        """Where the last document `process` kept is, until `sign` takes it."""

    def process(self, doc: str, path: str, counts: dict) -> str | None:
        """The text to keep (redacted when asked), or None when a stage removes it (counted in `counts`). `doc` may be
        a `prepare.readers.Document` (where it was read, its record's fields) or a plain str."""
        source = self.spec.source_of(path)
        mine = source_counts(counts, source)
        nbytes = len(doc.encode("utf-8"))
        mine["in"][0] += 1
        mine["in"][1] += nbytes
        fields = getattr(doc, "fields", {})
        one_document_file = not getattr(doc, "at", "")
        declared = declared_kind(self.spec.input_kind(source), path, one_document_file, fields)
        self.kind = declared or ("code" if looks_like_code(doc) else "prose")
        how = f"{self.kind} ({'declared' if declared else 'detected'})"
        mine["kinds"][how] = mine["kinds"].get(how, 0) + 1
        self._locate(doc, path, fields)
        started = self._announce(doc, path)
        removal = self._removal(doc, mine)
        self.redacted = False
        text: str | None = None
        if removal is not None:
            reason, measured = removal
            more = {} if measured is None else {"measured": round(measured, 4)}
            count_removed(counts, source, reason, nbytes, f"[{measured:.4g}] {doc}" if more else doc)
            self.removed.append(audit.line(self._origin(doc, path) | audit.record_fields(fields), reason, **more))
        else:
            text = self._redacted(doc, mine)
        if started is not None:
            print(f"curation: done in {time.monotonic() - started:.1f}s", file=sys.stderr, flush=True)
        return text

    def pii_kinds(self, kind: str) -> tuple[str, ...]:
        return tuple(self.spec.pii_kinds[kind]) if self.spec.pii else ()

    def _redacted(self, text: str, mine: dict) -> str:
        if not self.spec.pii:
            return text
        found: Counter = Counter()
        text = redact(text, found, self.pii_kinds(self.kind))
        self.redacted = bool(found)
        for kind, n in found.items():
            mine["redacted"][kind] = mine["redacted"].get(kind, 0) + n
        return text

    def _removal(self, text: str, mine: dict) -> tuple[str, float | None] | None:
        is_code = self.kind == "code"
        if self.spec.languages:
            language = "code" if is_code else detect(text)
            mine["languages"][language] = mine["languages"].get(language, 0) + 1
            if not is_code and language not in self.spec.languages:
                return "language", None
        if self.spec.quality and (failed := failed_rule(text, self.kind, self.spec.quality)):
            return f"quality.{failed[0]}", failed[1]
        if self.spec.tasks is not None and (task := self.spec.tasks.match(text)):
            return f"decontaminated.{task}", None
        return None

    def _file(self, path: str) -> int:
        """The index of `path` in this unit's `origins`."""
        if path not in self._files:
            self._files[path] = len(self.origins)
            entry = {"file": path}
            self.origins.append(entry if self.frames_from is None else entry | {"frames_from": self.frames_from})
        return self._files[path]

    def _locate(self, doc: str, path: str, fields: dict) -> None:
        """Remember where the document is, for its signature."""
        at = getattr(doc, "at", "")
        key, key_kind = audit.key_of(fields)
        self._place = (self._file(path), audit.AT_CODES.index(at), getattr(doc, "where", 0), key, key_kind)

    def _origin(self, doc: str, path: str) -> dict:
        return audit.origin(self.origins[self._files[path]], getattr(doc, "at", ""), getattr(doc, "where", 0))

    def _announce(self, doc: str, path: str) -> float | None:
        """A line on stderr for a long document (its curation may take seconds); the time it started."""
        if len(doc) < LONG_DOCUMENT_CHARS:
            return None
        place = ", ".join(f"{k} {v}" for k, v in self._origin(doc, path).items())
        print(f"curation: a document of {len(doc) / 1e6:.1f} M characters ({place})", file=sys.stderr, flush=True)
        return time.monotonic()

    def sign(self, unit: int, ordinal: int, text: str, h: int, path: str) -> None:
        """Record the signature of the document `process` kept last (when signatures are collected); a text that
        `process` did not see is located by its file alone and its kind detected."""
        if not self.signatures:
            return
        place, self._place = self._place, None
        code = self.kind == "code" if place is not None else looks_like_code(text)
        place = place or (self._file(path), 0, 0, b"", 0)
        source = self.labels.index(self.spec.source_of(path)) if self.spec.sources else 0
        head = text[:HEAD_BYTES].encode("utf-8")[:HEAD_BYTES]
        record = (unit, ordinal, h, len(text.encode("utf-8")), source, exact_hash(text), head, *place)
        if self.minhash is not None:
            grams = shingles(text, self.spec.shingle, code)
            record += (self.minhash.band_hashes(self.minhash.signature(grams)),)
        self.records.append(record)

    def take_signatures(self) -> np.ndarray:
        """The signatures recorded so far, (docs,) of signature_dtype, and forget them."""
        bands = self.spec.bands if self.minhash is not None else 0
        out = np.array(self.records, dtype=signature_dtype(bands))
        self.records = []
        return out
