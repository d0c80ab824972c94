"""What a worker process does with one work unit: scan it (count, hash, sample) or encode it into spool files.

Encoding writes a unit's tokens to spool files on disk rather than sending them through a pipe, so a worker's memory
is bounded by one batch of text however large its unit (a 50 GB .jsonl.zst is one unit), and the parent copies the
spools into shards in unit order.
"""

from __future__ import annotations

import hashlib
import heapq
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from dlx.data.prepare.encoders import Encoder, make_encoder
from dlx.data.prepare.readers import BadRecord, read_unit
from dlx.data.prepare.units import WorkUnit
from dlx.errors import UserError

BATCH_CHARS = 1 << 20  # text per encode call: large enough to amortize calls, small enough to bound memory
MAX_REPORTED = 5
SPLITS = ("train", "val")


def document_hash(text: str) -> int:
    """A 64-bit hash of the text: documents with hash < threshold form the validation split.

    Hashing content (not position) makes the split independent of input order and keeps exact duplicates together,
    so a validation document never also appears in train.
    """
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest(), "little")


@dataclass
class ScanRequest:
    unit: WorkUnit
    text_field: str
    strict: bool
    keep_smallest: int
    """How many of the smallest hashes to return (for an exact --val-documents)."""
    fraction_threshold: int
    """Count documents with hash below this (for --val-fraction)."""
    sample_chars: int
    """Return documents up to this many characters, for training a tokenizer (0: none)."""


@dataclass
class ScanResult:
    nbytes: int = 0
    files: int = 0
    documents: int = 0
    text_bytes: int = 0
    empty: int = 0
    below_threshold: int = 0
    min_hash: int | None = None
    smallest: list[int] = field(default_factory=list)
    bad: int = 0
    bad_examples: list[BadRecord] = field(default_factory=list)
    sample: list[str] = field(default_factory=list)


def scan_unit(req: ScanRequest) -> ScanResult:
    """Count and hash a unit's documents without tokenizing them; bad records are counted (fatal if strict)."""
    res, sample_chars, heap = (
        ScanResult(req.unit.nbytes, req.unit.files_completed),
        0,
        [],
    )  # heap: the keep_smallest smallest hashes, negated (a max-heap)
    for item in read_unit(req.unit, req.text_field):
        if isinstance(item, BadRecord):
            if req.strict:
                raise UserError(f"{item.where()}: {item.reason} (--strict stops at the first bad record)")
            res.bad += 1
            if len(res.bad_examples) < MAX_REPORTED:
                res.bad_examples.append(item)
            continue
        if not item:
            res.empty += 1
            continue
        h = document_hash(item)
        res.documents += 1
        res.text_bytes += len(item.encode("utf-8"))
        res.below_threshold += h < req.fraction_threshold
        res.min_hash = h if res.min_hash is None else min(res.min_hash, h)
        if len(heap) < req.keep_smallest:
            heapq.heappush(heap, -h)
        elif heap and h < -heap[0]:
            heapq.heapreplace(heap, -h)
        if sample_chars < req.sample_chars:
            res.sample.append(item)
            sample_chars += len(item)
    res.smallest = sorted(-h for h in heap)
    return res


@dataclass(frozen=True)
class EncodeSetup:
    tokenizer_json: str
    encoder: str
    text_field: str
    val_threshold: int
    eos_id: int
    bos_id: int | None
    dtype: str
    spool_dir: str


@dataclass
class UnitTokens:
    index: int
    tokens: dict[str, int]
    documents: dict[str, int]
    nbytes: int
    files: int


_setup: EncodeSetup | None = None
_encoder: Encoder | None = None


def setup_encoder(setup: EncodeSetup) -> None:
    """Once per worker: build the encoder (tens of ms for tiktoken, more for a 128k vocabulary)."""
    global _setup, _encoder
    _setup, _encoder = setup, make_encoder(setup.encoder, setup.tokenizer_json)


def spool_path(spool_dir: str, index: int, split: str) -> Path:
    return Path(spool_dir) / f"{index:08d}.{split}.bin"


def encode_unit(unit: WorkUnit) -> UnitTokens:
    """Tokenize a unit's documents into its spool files: [BOS] ids EOS per document, train and val apart."""
    assert _setup is not None and _encoder is not None, "setup_encoder must run first"
    spools = {s: _Spool(spool_path(_setup.spool_dir, unit.index, s), _setup, _encoder) for s in SPLITS}
    try:
        for item in read_unit(unit, _setup.text_field):
            if isinstance(item, str) and item:
                spools["val" if document_hash(item) < _setup.val_threshold else "train"].add(item)
        for spool in spools.values():
            spool.flush()
    finally:
        for spool in spools.values():
            spool.close()
    return UnitTokens(
        unit.index,
        {s: spools[s].tokens for s in SPLITS},
        {s: spools[s].documents for s in SPLITS},
        unit.nbytes,
        unit.files_completed,
    )


class _Spool:
    """Batches one split's documents, encodes a batch at a time and appends the tokens to a spool file."""

    def __init__(self, path: Path, setup: EncodeSetup, encoder: Encoder):
        self.path, self.setup, self.encoder = path, setup, encoder
        self.batch: list[str] = []
        self.chars = self.tokens = self.documents = 0
        self._file = None

    def add(self, text: str) -> None:
        self.batch.append(text)
        self.chars += len(text)
        if self.chars >= BATCH_CHARS:
            self.flush()

    def flush(self) -> None:
        if not self.batch:
            return
        arr = join_documents(self.encoder.encode(self.batch), self.setup.eos_id, self.setup.bos_id, self.setup.dtype)
        if self._file is None:
            self._file = open(self.path, "wb")  # noqa: SIM115 - closed in close()
        arr.tofile(self._file)
        self.tokens += len(arr)
        self.documents += len(self.batch)
        self.batch, self.chars = [], 0

    def close(self) -> None:
        if self._file is not None:
            self._file.close()


def join_documents(ids: list[list[int]], eos_id: int, bos_id: int | None, dtype: str) -> np.ndarray:
    """One little-endian array: for each document [BOS] ids EOS."""
    flat: list[int] = []
    for doc in ids:
        if bos_id is not None:
            flat.append(bos_id)
        flat.extend(doc)
        flat.append(eos_id)
    return np.array(flat, dtype=np.dtype(dtype).newbyteorder("<"))
