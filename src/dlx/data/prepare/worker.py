"""What a worker process does with one work unit: encode it into a part (see `parts`), counting what it reads.

Encoding writes a unit's tokens to files on disk rather than sending them through a pipe, so a worker's memory is
bounded by one batch of text however large its unit (a 50 GB .jsonl.zst of one frame is one unit). The same reading
counts the unit's documents, bad records and hashes (`scan.documents`): a task of a split run needs them at the merge.
"""

from __future__ import annotations

import os
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dlx.data.prepare.curation import UnitVerdicts
from dlx.data.prepare.encoders import Encoder, make_encoder
from dlx.data.prepare.parts import DOC_DTYPE, part_paths, removed_path, signature_path
from dlx.data.prepare.scan import ScanCounts, ScanRule, documents
from dlx.data.prepare.units import WorkUnit

BATCH_CHARS = 1 << 20  # text per encode call: large enough to amortize calls, small enough to bound memory


@dataclass(frozen=True)
class EncodeSetup:
    tokenizer_json: str
    encoder: str
    rule: ScanRule
    eos_id: int
    bos_id: int | None
    dtype: str
    spool_dir: str
    """Where parts are written."""
    durable: bool = False
    """fsync each part before reporting it done (a task keeps its parts; a one-machine run copies and deletes them)."""
    verdicts_file: str | None = None
    """The scan's per-document decisions (`curation.VERDICTS_FILE`) to follow instead of running the stages again."""


@dataclass
class UnitTokens:
    index: int
    tokens: int
    counts: ScanCounts
    """What reading the unit found (with its bytes and finished files, for progress)."""


_setup: EncodeSetup | None = None
_encoder: Encoder | None = None
_verdicts: UnitVerdicts | None = None


def setup_encoder(setup: EncodeSetup) -> None:
    """Once per worker: build the encoder (tens of ms for tiktoken, more for a 128k vocabulary)."""
    global _setup, _encoder, _verdicts
    _setup, _encoder = setup, make_encoder(setup.encoder, setup.tokenizer_json)
    _verdicts = UnitVerdicts(setup.verdicts_file) if setup.verdicts_file else None


def encode_unit(unit: WorkUnit) -> UnitTokens:
    """Tokenize a unit's documents into its part: [BOS] ids EOS per document, and each document's hash and length."""
    assert _setup is not None and _encoder is not None, "setup_encoder must run first"
    counts = ScanCounts()
    with _Part(part_paths(_setup.spool_dir, unit.index), _setup, _encoder) as part:
        verdicts = _verdicts(unit.index) if _verdicts is not None else None
        for text, h in documents(unit, _setup.rule, counts, verdicts=verdicts):
            part.add(text, h)
    if _setup.rule.signatures:  # a task's signatures, for the deduplication at the merge
        _write(signature_path(_setup.spool_dir, unit.index), b"".join(sigs.tobytes() for sigs in counts.signatures))
        counts.signatures = []
    if counts.removed:  # a task's audit lines, for the merge's curation-removed.jsonl
        _write(removed_path(_setup.spool_dir, unit.index), b"".join(zlib.decompress(b) for b in counts.removed))
        counts.removed = []
    return UnitTokens(unit.index, part.tokens, counts)


def _write(path: Path, data: bytes) -> None:
    """A file of the unit's part, fsynced when the setup is durable."""
    assert _setup is not None
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        if _setup.durable:
            os.fsync(f.fileno())


class _Part:
    """Batches documents, encodes a batch at a time and appends tokens and document entries to the part's files."""

    def __init__(self, paths: tuple[Path, Path], setup: EncodeSetup, encoder: Encoder):
        self.setup, self.encoder = setup, encoder
        self.files = [open(p, "wb") for p in paths]  # noqa: SIM115 - closed in __exit__
        self.texts: list[str] = []
        self.hashes: list[int] = []
        self.chars = self.tokens = 0

    def __enter__(self) -> _Part:
        return self

    def add(self, text: str, h: int) -> None:
        self.texts.append(text)
        self.hashes.append(h)
        self.chars += len(text)
        if self.chars >= BATCH_CHARS:
            self.flush()

    def flush(self) -> None:
        if not self.texts:
            return
        ids = self.encoder.encode(self.texts)
        arr = join_documents(ids, self.setup.eos_id, self.setup.bos_id, self.setup.dtype)
        extra = 1 + (self.setup.bos_id is not None)
        docs = np.array(list(zip(self.hashes, (len(d) + extra for d in ids), strict=True)), dtype=DOC_DTYPE)
        arr.tofile(self.files[0])
        docs.tofile(self.files[1])
        self.tokens += len(arr)
        self.texts, self.hashes, self.chars = [], [], 0

    def __exit__(self, exc_type: object, *exc: object) -> None:
        try:
            if exc_type is None:
                self.flush()
                for f in self.files:
                    f.flush()
                    if self.setup.durable:
                        os.fsync(f.fileno())
        finally:
            for f in self.files:
                f.close()


def join_documents(ids: list[list[int]], eos_id: int, bos_id: int | None, dtype: str) -> np.ndarray:
    """One little-endian array: for each document [BOS] ids EOS."""
    flat: list[int] = []
    for doc in ids:
        if bos_id is not None:
            flat.append(bos_id)
        flat.extend(doc)
        flat.append(eos_id)
    return np.array(flat, dtype=np.dtype(dtype).newbyteorder("<"))
