"""The per-document stages, in a worker: language, quality, decontamination (each may remove the document), PII
redaction, and the signature the global deduplication decides on. What each removes is counted per source and per
reason in a JSON-able record that folds in corpus order (`fold`), so any split into units or tasks counts the same."""

from __future__ import annotations

from collections import Counter

import numpy as np

from dlx.data.curate.language import detect
from dlx.data.curate.minhash import MinHasher
from dlx.data.curate.pii import redact
from dlx.data.curate.quality import failed_rule
from dlx.data.curate.spec import CurateSpec
from dlx.data.curate.text import exact_hash, looks_like_code, shingles

MAX_EXAMPLES = 5
EXAMPLE_CHARS = 120
HEAD_BYTES = 48


def signature_dtype(bands: int) -> np.dtype:
    """One document's record for deduplication: where it is, its split hash and size, and its hashes."""
    fields = [("unit", "<u4"), ("ordinal", "<u4"), ("hash", "<u8"), ("bytes", "<u8"), ("source", "<u2")]
    fields += [("exact", "<u8"), ("head", f"S{HEAD_BYTES}")]
    if bands:
        fields.append(("bands", "<u8", (bands,)))
    return np.dtype(fields)


def empty_counts() -> dict:
    return {"sources": {}, "examples": {}}


def source_counts(counts: dict, source: str) -> dict:
    return counts["sources"].setdefault(source, {"in": [0, 0], "removed": {}, "languages": {}, "redacted": {}})


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
        for key in ("languages", "redacted"):
            for name, n in c[key].items():
                t[key][name] = t[key].get(name, 0) + n
    for reason, examples in more["examples"].items():
        mine = total["examples"].setdefault(reason, [])
        mine.extend(examples[: MAX_EXAMPLES - len(mine)])


class Curator:
    """Runs a CurateSpec's per-document stages and collects signatures (when `signatures`) for one unit."""

    def __init__(self, spec: CurateSpec, signatures: bool):
        self.spec = spec
        self.minhash = MinHasher(spec.bands, spec.rows) if signatures and spec.dedup == "near" else None
        self.signatures = signatures and spec.dedup is not None
        self.labels = [label for label, _ in spec.sources] or ["corpus"]
        self.records: list[tuple] = []
        self.redacted = False
        """Whether the last document `process` kept had PII replaced."""

    def process(self, text: str, path: str, counts: dict) -> str | None:
        """The text to keep (redacted when asked), or None when a stage removes it (counted in `counts`)."""
        source = self.spec.source_of(path)
        mine = source_counts(counts, source)
        nbytes = len(text.encode("utf-8"))
        mine["in"][0] += 1
        mine["in"][1] += nbytes
        reason = self._removal(text, mine)
        self.redacted = False
        if reason is not None:
            count_removed(counts, source, reason, nbytes, text)
            return None
        if self.spec.pii:
            found: Counter = Counter()
            text = redact(text, found)
            self.redacted = bool(found)
            for kind, n in found.items():
                mine["redacted"][kind] = mine["redacted"].get(kind, 0) + n
        return text

    def _removal(self, text: str, mine: dict) -> str | None:
        is_code = looks_like_code(text)
        if self.spec.languages:
            language = "code" if is_code else detect(text)
            mine["languages"][language] = mine["languages"].get(language, 0) + 1
            if not is_code and language not in self.spec.languages:
                return "language"
        if self.spec.quality and (rule := failed_rule(text, is_code, self.spec.quality)):
            return f"quality.{rule}"
        if self.spec.tasks is not None and (task := self.spec.tasks.match(text)):
            return f"decontaminated.{task}"
        return None

    def sign(self, unit: int, ordinal: int, text: str, h: int, path: str) -> None:
        """Record a kept document's signature (when signatures are collected)."""
        if not self.signatures:
            return
        source = self.labels.index(self.spec.source_of(path)) if self.spec.sources else 0
        head = text[:HEAD_BYTES].encode("utf-8")[:HEAD_BYTES]
        record = (unit, ordinal, h, len(text.encode("utf-8")), source, exact_hash(text), head)
        if self.minhash is not None:
            record += (self.minhash.band_hashes(self.minhash.signature(shingles(text, self.spec.shingle))),)
        self.records.append(record)

    def take_signatures(self) -> np.ndarray:
        """The signatures recorded so far, (docs,) of signature_dtype, and forget them."""
        bands = self.spec.bands if self.minhash is not None else 0
        out = np.array(self.records, dtype=signature_dtype(bands))
        self.records = []
        return out
