"""The first pass: read every document once, without tokenizing, before anything is written.

It finds bad input (fatal under --strict, before any output exists), counts documents, fixes the validation split's
hash threshold exactly (--val-documents N needs the N smallest hashes of the whole corpus) and collects the sample a
tokenizer is trained on. Reading is cheap next to tokenizing (a few percent of the encode pass).
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field

from dlx.data.pool import InlinePool, WorkerPool
from dlx.data.prepare.inputs import InputFile
from dlx.data.prepare.options import PrepareOptions
from dlx.data.prepare.progress import PrepareProgress
from dlx.data.prepare.units import plan_units
from dlx.data.prepare.worker import MAX_REPORTED, ScanRequest, ScanResult, scan_unit
from dlx.errors import UserError

TRAIN_SAMPLE_CHARS = 64 << 20  # text a tokenizer is trained on, spread over the whole corpus
CHECK_SAMPLE_CHARS = 256 << 10  # text the tiktoken fast path is checked on against Hugging Face (at start-up)
HASH_SPACE = 2**64


@dataclass
class ScanSummary:
    documents: int = 0
    text_bytes: int = 0
    empty: int = 0
    bad: int = 0
    bad_examples: list[str] = field(default_factory=list)
    below_fraction: int = 0
    min_hash: int | None = None
    smallest: list[int] = field(default_factory=list)
    """The largest-first negated heap of the smallest hashes seen (for --val-documents)."""
    sample: list[str] = field(default_factory=list)
    val_threshold: int = 0

    def add(self, res: ScanResult, keep_smallest: int) -> None:
        """Fold in one unit's result, keeping memory bounded by keep_smallest, not by the corpus."""
        self.documents += res.documents
        self.text_bytes += res.text_bytes
        self.empty += res.empty
        self.bad += res.bad
        for bad in res.bad_examples[: MAX_REPORTED - len(self.bad_examples)]:
            self.bad_examples.append(f"{bad.where()}: {bad.reason}")
        self.below_fraction += res.below_threshold
        if res.min_hash is not None:
            self.min_hash = res.min_hash if self.min_hash is None else min(self.min_hash, res.min_hash)
        for h in res.smallest:
            if len(self.smallest) < keep_smallest:
                heapq.heappush(self.smallest, -h)
            elif h < -self.smallest[0]:
                heapq.heapreplace(self.smallest, -h)
        self.sample.extend(res.sample)

    def record(self) -> dict:
        """For the manifest's `source.scan` (deterministic: no timings)."""
        return {
            "documents": self.documents,
            "text_bytes": self.text_bytes,
            "empty_documents": self.empty,
            "bad_records": self.bad,
            "bad_examples": self.bad_examples,
            "val_threshold": self.val_threshold,
        }


def scan_corpus(
    pool: InlinePool | WorkerPool, files: list[InputFile], unit_bytes: int, opts: PrepareOptions, ui: PrepareProgress
) -> ScanSummary:
    """Scan every unit (in parallel), then fix the validation threshold; UserError if there is nothing to train on."""
    total = sum(f.size for f in files)
    budget = TRAIN_SAMPLE_CHARS if opts.train_vocab_size else CHECK_SAMPLE_CHARS
    keep = opts.val_documents or 0
    fraction_threshold = int((opts.val_fraction or 0.0) * HASH_SPACE)
    requests = (
        ScanRequest(
            u, opts.text_field, opts.strict, keep, fraction_threshold, math.ceil(budget * u.nbytes / max(total, 1))
        )
        for u in plan_units(files, unit_bytes)
    )
    summary = ScanSummary()
    ui.start("scan  ", total, len(files), show_tokens=False)
    try:
        for res in pool.imap(scan_unit, requests, window=2 * pool.n_workers + 2):
            summary.add(res, keep)
            ui.advance(res.nbytes, res.files)
    finally:
        ui.stop()
    if summary.documents == 0:
        raise UserError(
            f"no documents found in {len(files)} input file(s) ({summary.bad} bad records, "
            f"{summary.empty} empty documents)"
        )
    summary.val_threshold = val_threshold(summary, opts)
    return summary


def val_threshold(summary: ScanSummary, opts: PrepareOptions) -> int:
    """Documents whose hash is below this go to val.

    --val-documents N: just above the N-th smallest hash (exactly N documents, more only if the N-th has exact
    duplicates). --val-fraction F: F of the hash space, but at least the one smallest-hash document when the corpus
    has two or more, so a small corpus still gets a validation split.
    """
    if opts.val_documents is not None:
        n = opts.val_documents
        if n and n >= summary.documents:
            raise UserError(
                f"--val-documents {n} leaves no training data: the corpus has {summary.documents} documents"
            )
        return -summary.smallest[0] + 1 if n else 0
    if not opts.val_fraction or summary.documents < 2:
        return 0
    if summary.below_fraction == 0:
        assert summary.min_hash is not None
        return summary.min_hash + 1
    if summary.below_fraction == summary.documents:
        raise UserError(
            f"--val-fraction {opts.val_fraction} puts all {summary.documents} documents in val; use a smaller fraction"
        )
    return int(opts.val_fraction * HASH_SPACE)
