"""Reading documents without tokenizing them: what every pass counts, and the first pass of a one-machine run.

Every pass that reads a unit (the scan, and the encode pass of a task) counts the same `ScanCounts` through
`documents`: documents, bad records (fatal under --strict), the hashes that fix the validation split. A one-machine run
scans the whole corpus before anything is written: it reports bad input before any output exists, fixes the
validation split's hash threshold exactly (--val-documents N needs the N smallest hashes of the whole corpus) and
collects the sample a tokenizer is trained on. Reading is cheap next to tokenizing (a few percent of the encode pass).
A run split into tasks folds the tasks' counts at the merge instead, in unit order, to the very same totals.
"""

from __future__ import annotations

import dataclasses
import hashlib
import heapq
import itertools
import math
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

from dlx.data.curate.pii import redact
from dlx.data.curate.spec import CurateSpec
from dlx.data.curate.stages import Curator, fold
from dlx.data.pool import InlinePool, WorkerPool
from dlx.data.prepare.curation import REDACTED, REDACTED_CODE, REMOVED, VERDICT_DTYPE, deduplicate, packed
from dlx.data.prepare.inputs import InputList
from dlx.data.prepare.options import PrepareOptions
from dlx.data.prepare.progress import PrepareProgress
from dlx.data.prepare.readers import BadRecord, missing_field_hint, read_file, read_unit
from dlx.data.prepare.units import WorkUnit, plan_units
from dlx.errors import UserError

TRAIN_SAMPLE_CHARS = 64 << 20  # text a tokenizer is trained on, spread over the whole corpus
CHECK_SAMPLE_CHARS = 256 << 10  # text the tiktoken fast path is checked on against Hugging Face (at start-up)
HASH_SPACE = 2**64
MAX_REPORTED = 5


def document_hash(text: str) -> int:
    """A 64-bit hash of the text: documents with hash < threshold form the validation split.

    Hashing content (not position) makes the split independent of input order and keeps exact duplicates together,
    so a validation document never also appears in train.
    """
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest(), "little")


@dataclass(frozen=True)
class ScanRule:
    """How documents are read and counted."""

    text_field: str
    strict: bool
    """A bad record raises UserError instead of being counted."""
    keep_smallest: int
    """How many of the smallest hashes to keep (for an exact --val-documents)."""
    fraction_threshold: int
    """Count documents with hash below this (for --val-fraction)."""
    curate: CurateSpec | None = None
    """The per-document curation stages to run (None: none)."""
    signatures: bool = False
    """Collect each kept document's deduplication signature (`ScanCounts.signatures`)."""
    verdicts: bool = False
    """Record what the per-document stages decided (`ScanCounts.verdicts`), for a later pass to follow."""

    @classmethod
    def of(cls, opts: PrepareOptions, signatures: bool = False, verdicts: bool = False) -> ScanRule:
        """The rule of these options; `signatures` when this pass feeds the global deduplication, `verdicts` when a
        later pass over the same units follows this one's per-document decisions."""
        curate = opts.curate if opts.curate.active else None
        fraction = int((opts.val_fraction or 0.0) * HASH_SPACE)
        sign = signatures and curate is not None and curate.dedup is not None
        return cls(opts.text_field, opts.strict, opts.val_documents or 0, fraction, curate, sign, verdicts)


@dataclass
class ScanCounts:
    """What reading found, for one unit or folded over many in unit order (memory bounded by `keep_smallest`)."""

    nbytes: int = 0
    files: int = 0
    documents: int = 0
    text_bytes: int = 0
    empty: int = 0
    bad: int = 0
    bad_examples: list[str] = field(default_factory=list)
    """The first MAX_REPORTED bad records, `where: why`."""
    below_fraction: int = 0
    min_hash: int | None = None
    smallest: list[int] = field(default_factory=list)
    """The `keep_smallest` smallest hashes, ascending."""
    sample: list[str] = field(default_factory=list)
    """Documents kept for training a tokenizer (scan pass only; never saved)."""
    sample_keys: list[int] = field(default_factory=list)
    """Each sample document's unit << 32 | ordinal, to leave out the ones deduplication removes (never saved)."""
    val_threshold: int = 0
    """Documents whose hash is below this go to val (set once the whole corpus is counted)."""
    curation: dict = field(default_factory=dict)
    """What the curation stages removed and redacted, per source and reason (`dlx.data.curate.stages`)."""
    signatures: list[np.ndarray] = field(default_factory=list)
    """Deduplication signatures of the kept documents, per unit in order (scan pass only; never saved)."""
    drops: np.ndarray | None = None
    """The documents deduplication removed, (unit, ordinal) in order (`curation.deduplicate`; never saved)."""
    verdicts: list[np.ndarray] = field(default_factory=list)
    """The documents the per-document stages removed or redacted, VERDICT_DTYPE per unit in order (scan pass of a
    one-machine run only; never saved in a task's state)."""
    origins: list[list[dict]] = field(default_factory=list)
    """Per unit in order, the files its signatures point into (`Curator.origins`), when signatures are collected."""
    removed: list[bytes] = field(default_factory=list)
    """The audit lines of the documents the per-document stages removed, `curation.packed` per unit in order (a
    one-machine scan; a task's worker writes them beside the unit's part instead; never saved)."""
    duplicates: bytes = b""
    """The audit lines of the documents deduplication removed (`deduplicate`; never saved)."""

    def add(self, other: ScanCounts, keep_smallest: int) -> None:
        """Fold in the counts of the units that follow."""
        for name in ("nbytes", "files", "documents", "text_bytes", "empty", "bad", "below_fraction"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.bad_examples.extend(other.bad_examples[: MAX_REPORTED - len(self.bad_examples)])
        if other.min_hash is not None:
            self.min_hash = other.min_hash if self.min_hash is None else min(self.min_hash, other.min_hash)
        self.smallest = list(itertools.islice(heapq.merge(self.smallest, other.smallest), keep_smallest))
        self.sample.extend(other.sample)
        self.sample_keys.extend(other.sample_keys)
        self.signatures.extend(other.signatures)
        self.verdicts.extend(other.verdicts)
        self.origins.extend(other.origins)
        self.removed.extend(other.removed)
        if other.curation:
            fold(self.curation or _started(self.curation), other.curation)

    def deduplicate(self, rule: ScanRule) -> None:
        """Decide the duplicates from the signatures (`curation.deduplicate`), set `drops` and `duplicates`, recount
        the documents and hash statistics over the documents kept, and leave the removed ones out of the sample."""
        assert rule.curate is not None
        sigs, self.signatures = np.concatenate(self.signatures), []  # one copy of the records at the decision
        kept_mask, self.drops, self.duplicates = deduplicate(self.curation, sigs, rule.curate, self.origins)
        if self.sample:
            dropped = set((self.drops["unit"].astype(np.int64) << 32 | self.drops["ordinal"]).tolist())
            kept = [(t, k) for t, k in zip(self.sample, self.sample_keys, strict=True) if k not in dropped]
            self.sample, self.sample_keys = [t for t, _ in kept], [k for _, k in kept]
        hashes = sigs["hash"][kept_mask]
        self.documents, self.text_bytes = int(hashes.size), int(sigs["bytes"][kept_mask].sum())
        self.below_fraction = int((hashes < np.uint64(rule.fraction_threshold)).sum()) if rule.fraction_threshold else 0
        self.min_hash = int(hashes.min()) if hashes.size else None
        self.smallest = np.sort(hashes)[: rule.keep_smallest].tolist()

    def record(self) -> dict:
        """For the manifest's `source.scan` (deterministic: no timings)."""
        curation = {"curation": self.curation} if self.curation else {}
        return curation | {
            "documents": self.documents,
            "text_bytes": self.text_bytes,
            "empty_documents": self.empty,
            "bad_records": self.bad,
            "bad_examples": self.bad_examples,
            "val_threshold": self.val_threshold,
        }

    def to_json(self) -> dict:
        """Everything but the sample, for a task's state file."""
        return {k: getattr(self, k) for k in (f.name for f in dataclasses.fields(self)) if k not in _UNSAVED}

    @classmethod
    def from_json(cls, data: dict) -> ScanCounts:
        return cls(**data)


_UNSAVED = ("sample", "sample_keys", "signatures", "drops", "verdicts", "removed", "duplicates")


def _started(curation: dict) -> dict:
    curation.update(sources={}, examples={})
    return curation


def _items(unit: WorkUnit, text_field: str) -> Iterator[tuple[str, str | BadRecord]]:
    """(path of the file, document or bad record) of every item of a unit, in order."""
    if unit.end is None:
        for f in unit.files:
            for item in read_file(f, text_field):
                yield f.path, item
    else:
        for item in read_unit(unit, text_field):
            yield unit.files[0].path, item


def documents(
    unit: WorkUnit, rule: ScanRule, counts: ScanCounts, sample_chars: int = 0, verdicts: np.ndarray | None = None
) -> Iterator[tuple[str, int]]:
    """(text, hash) of every non-empty document of a unit that the curation stages keep (redacted when asked),
    counting everything read into `counts`. Given the unit's `verdicts` (recorded by an earlier pass with
    `rule.verdicts`), the per-document stages do not run again: their decisions are followed."""
    heap: list[int] = []  # the keep_smallest smallest hashes, negated (a max-heap)
    chars = ordinal = 0
    counts.nbytes += unit.nbytes
    counts.files += unit.files_completed
    curator = None
    if rule.curate is not None and verdicts is None:
        curator = Curator(rule.curate, rule.signatures, _frames_from(unit))
        _started(counts.curation)
    items = _items(unit, rule.text_field)
    if verdicts is not None:
        assert rule.curate is not None
        items = _following(items, verdicts, rule.curate)
    elif curator is not None:
        items = _curated(items, curator, counts, unit.index if rule.verdicts else None)
    for path, item in items:
        if isinstance(item, BadRecord):
            if rule.strict:
                raise UserError(f"{item.where()}: {item.reason} (--strict stops at the first bad record)")
            counts.bad += 1
            if len(counts.bad_examples) < MAX_REPORTED:
                counts.bad_examples.append(f"{item.where()}: {item.reason}")
            continue
        if not item:
            counts.empty += 1
            continue
        h = document_hash(item)
        if curator is not None:
            curator.sign(unit.index, ordinal, item, h, path)
        ordinal += 1
        counts.documents += 1
        counts.text_bytes += len(item.encode("utf-8"))
        counts.below_fraction += h < rule.fraction_threshold
        counts.min_hash = h if counts.min_hash is None else min(counts.min_hash, h)
        if len(heap) < rule.keep_smallest:
            heapq.heappush(heap, -h)
        elif heap and h < -heap[0]:
            heapq.heapreplace(heap, -h)
        if chars < sample_chars:
            counts.sample.append(item)
            counts.sample_keys.append(unit.index << 32 | (ordinal - 1))
            chars += len(item)
        yield item, h
    counts.smallest = sorted(-h for h in heap)
    if curator is not None:
        counts.removed = [packed(curator.removed)] if curator.removed else []
        if curator.signatures:
            counts.signatures, counts.origins = [curator.take_signatures()], [curator.origins]


def _frames_from(unit: WorkUnit) -> int | None:
    """The byte a unit's zstd frames or gzip members start at, when it reads a compressed file in pieces."""
    whole = unit.end is None or unit.files[0].kind == "parquet" or unit.files[0].compression is None
    return None if whole else unit.start


Items = Iterator[tuple[str, "str | BadRecord"]]


def _curated(items: Items, curator: Curator, counts: ScanCounts, unit: int | None) -> Items:
    """The items with the per-document stages applied: removed documents left out, kept ones redacted when asked;
    with `unit`, what was decided is recorded in `counts.verdicts` (by position among the unit's non-empty
    documents)."""
    decided: list[tuple[int, int, int]] = []
    position = 0
    for path, item in items:
        if isinstance(item, BadRecord) or not item:
            yield path, item
            continue
        kept = curator.process(item, path, counts.curation)
        if unit is not None and (kept is None or curator.redacted):
            redacted = REDACTED_CODE if curator.kind == "code" else REDACTED
            decided.append((unit, position, REMOVED if kept is None else redacted))
        position += 1
        if kept is not None:
            yield path, kept
    if unit is not None:
        counts.verdicts = [np.array(decided, dtype=VERDICT_DTYPE)]


def _following(items: Items, verdicts: np.ndarray, spec: CurateSpec) -> Items:
    """The items as `_curated` left them, from its recorded verdicts (this unit's, in position order)."""
    pii = {REDACTED: tuple(spec.pii_kinds["prose"]), REDACTED_CODE: tuple(spec.pii_kinds["code"])}
    positions, kinds = verdicts["position"].tolist(), verdicts["verdict"].tolist()
    position, at = 0, 0
    for path, item in items:
        if isinstance(item, BadRecord) or not item:
            yield path, item
            continue
        verdict = kinds[at] if at < len(positions) and positions[at] == position else None
        at += verdict is not None
        position += 1
        if verdict == REMOVED:
            continue
        yield path, redact(item, Counter(), pii[verdict]) if verdict in pii else item


@dataclass(frozen=True)
class ScanRequest:
    unit: WorkUnit
    rule: ScanRule
    sample_chars: int
    """Keep documents up to this many characters, for training a tokenizer (0: none)."""


def scan_unit(req: ScanRequest) -> ScanCounts:
    """Count and hash a unit's documents without tokenizing them (in a worker)."""
    counts = ScanCounts()
    for _ in documents(req.unit, req.rule, counts, req.sample_chars):
        pass
    return counts


def scan_corpus(
    pool: InlinePool | WorkerPool,
    inputs: InputList,
    unit_bytes: int,
    opts: PrepareOptions,
    ui: PrepareProgress,
    verdicts: bool = False,
) -> ScanCounts:
    """Scan every unit (in parallel), deduplicate (when asked), then fix the validation threshold; UserError if there
    is nothing to train on. `verdicts`: record the per-document decisions for the encode pass to follow."""
    budget = TRAIN_SAMPLE_CHARS if opts.train_vocab_size else CHECK_SAMPLE_CHARS
    rule = ScanRule.of(opts, signatures=True, verdicts=verdicts)
    requests = (
        ScanRequest(u, rule, math.ceil(budget * u.nbytes / max(inputs.bytes, 1)))
        for u in plan_units(inputs, unit_bytes)
    )
    summary = ScanCounts()
    ui.start("scan  ", inputs.bytes, inputs.files, show_tokens=False)
    try:
        for res in pool.imap(scan_unit, requests, window=2 * pool.n_workers + 2):
            summary.add(res, rule.keep_smallest)
            ui.advance(res.nbytes, res.files)
    finally:
        ui.stop()
    if rule.signatures and summary.signatures:
        summary.deduplicate(rule)
    finish_scan(summary, inputs.files, opts.val_fraction, opts.val_documents)
    return summary


def finish_scan(summary: ScanCounts, n_files: int, val_fraction: float | None, val_documents: int | None) -> None:
    """Check the corpus has documents to train on and set the validation threshold (UserError otherwise)."""
    if summary.documents == 0 and (removed := _removed_by_reason(summary.curation)):
        reasons = ", ".join(f"{reason} {n:,}" for reason, n in removed.most_common())
        raise UserError(
            f"curation removed all {sum(removed.values()):,} documents of {n_files} input file(s) ({reasons}); "
            "nothing is left to train on: run the same command with --dry-run for curation.md and its examples, "
            "then drop or loosen the stage that removed them"
        )
    if summary.documents == 0:
        hint = missing_field_hint(summary.bad_examples)  # "where: why" lines; the reason ends each
        raise UserError(
            f"no documents found in {n_files} input file(s) ({summary.bad} bad records, "
            f"{summary.empty} empty documents){': ' + hint if hint else ''}"
        )
    summary.val_threshold = val_threshold(summary, val_fraction, val_documents)


def _removed_by_reason(curation: dict) -> Counter:
    """Documents removed per reason, over every source."""
    removed: Counter = Counter()
    for counts in curation.get("sources", {}).values():
        for reason, (docs, _) in counts["removed"].items():
            removed[reason] += docs
    return removed


def val_threshold(summary: ScanCounts, val_fraction: float | None, val_documents: int | None) -> int:
    """Documents whose hash is below this go to val.

    --val-documents N: just above the N-th smallest hash (exactly N documents, more only if the N-th has exact
    duplicates). --val-fraction F: F of the hash space, but at least the one smallest-hash document when the corpus
    has two or more, so a small corpus still gets a validation split.
    """
    if val_documents is not None:
        if val_documents and val_documents >= summary.documents:
            raise UserError(
                f"--val-documents {val_documents} leaves no training data: the corpus has {summary.documents} documents"
            )
        return summary.smallest[-1] + 1 if val_documents else 0
    if not val_fraction or summary.documents < 2:
        return 0
    if summary.below_fraction == 0:
        assert summary.min_hash is not None
        return summary.min_hash + 1
    if summary.below_fraction == summary.documents:
        raise UserError(
            f"--val-fraction {val_fraction} puts all {summary.documents} documents in val; use a smaller fraction"
        )
    return int(val_fraction * HASH_SPACE)
