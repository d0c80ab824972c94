"""A unit's tokens on disk (a part), and how they are routed into the train and val splits.

A part is two files named by the unit's index: `NNNNNNNN.tok`, every document's `[BOS] ids EOS` in order as raw
little-endian tokens, and `NNNNNNNN.doc`, per document its 64-bit content hash and its token count. Workers write parts
without knowing the validation threshold; whoever appends them to shards (the one-machine run as units finish, the
merge of a run split into tasks) routes each document by `hash < threshold`. Every read is a block at a time, so
memory does not grow with the size of a part.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

from dlx.errors import UserError

DOC_DTYPE = np.dtype([("hash", "<u8"), ("tokens", "<u8")])
DOC_BLOCK = 1 << 16  # documents read at a time (1 MB of the .doc file)
COPY_TOKENS = 1 << 22  # tokens read at a time


def part_names(index: int) -> tuple[str, str]:
    """(tokens, documents) file names of unit `index`."""
    return f"{index:08d}.tok", f"{index:08d}.doc"


def part_paths(folder: str | Path, index: int) -> tuple[Path, Path]:
    """(tokens, documents) files of unit `index` in `folder`."""
    tok, doc = part_names(index)
    return Path(folder) / tok, Path(folder) / doc


def signature_path(folder: str | Path, index: int) -> Path:
    """Unit `index`'s deduplication signatures (`dlx.data.curate.stages.signature_dtype`), written by a task."""
    return Path(folder) / f"{index:08d}.sig"


def removed_path(folder: str | Path, index: int) -> Path:
    """Unit `index`'s audit lines of the documents the per-document stages removed (JSON lines), written by a task."""
    return Path(folder) / f"{index:08d}.rm"


def _doc_blocks(
    doc_path: str | Path, dropped: np.ndarray | None = None
) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
    """(hashes, first token, one past the last token, removed by deduplication) of the documents of a part, a block
    at a time; `dropped` holds the ordinals (in the part) of the documents deduplication removed."""
    offset = first_doc = 0
    with open(doc_path, "rb") as f:
        while (docs := np.frombuffer(f.read(DOC_BLOCK * DOC_DTYPE.itemsize), dtype=DOC_DTYPE)).size:
            ends = offset + np.cumsum(docs["tokens"], dtype=np.int64)  # (docs,)
            removed = np.zeros(docs.size, dtype=bool)
            if dropped is not None and dropped.size:
                removed = np.isin(np.arange(first_doc, first_doc + docs.size), dropped)
            yield docs["hash"], ends - docs["tokens"].astype(np.int64), ends, removed
            offset, first_doc = int(ends[-1]), first_doc + docs.size


def _in_split(hashes: np.ndarray, threshold: int, split: str, removed: np.ndarray) -> np.ndarray:
    """Which documents belong to `split`: val when hash < threshold; neither when deduplication removed them."""
    is_val = hashes < np.uint64(threshold) if threshold < 2**64 else np.ones(hashes.size, dtype=bool)
    return (is_val if split == "val" else ~is_val) & ~removed


def split_runs(
    doc_path: str | Path, threshold: int, split: str, dropped: np.ndarray | None = None
) -> Iterator[tuple[int, int]]:
    """(first token, token count) of each run of consecutive documents of `split`, in order."""
    for hashes, starts, ends, removed in _doc_blocks(doc_path, dropped):
        picked = _in_split(hashes, threshold, split, removed)  # (docs,) bool
        if picked.all():
            yield int(starts[0]), int(ends[-1] - starts[0])
        elif picked.any():
            change = np.flatnonzero(picked[1:] != picked[:-1]) + 1  # where a run of the other split begins
            firsts = np.concatenate(([0], change))
            lasts = np.concatenate((change, [picked.size])) - 1
            keep = picked[firsts]
            yield from zip(
                starts[firsts[keep]].tolist(), (ends[lasts[keep]] - starts[firsts[keep]]).tolist(), strict=True
            )


def split_tokens(doc_path: str | Path, threshold: int, dropped: np.ndarray | None = None) -> dict[str, int]:
    """Tokens of each split in a part."""
    val = train = 0
    for hashes, starts, ends, removed in _doc_blocks(doc_path, dropped):
        val += int((ends - starts)[_in_split(hashes, threshold, "val", removed)].sum())
        train += int((ends - starts)[_in_split(hashes, threshold, "train", removed)].sum())
    return {"train": train, "val": val}


def copy_split(
    paths: tuple[str | Path, str | Path],
    threshold: int,
    split: str,
    dtype: np.dtype,
    write: Callable[[np.ndarray], object],
    skip: int = 0,
    limit: int | None = None,
    dropped: np.ndarray | None = None,
) -> int:
    """Pass a part's tokens of `split` to write(array), from its skip-th such token on, at most `limit`; the count."""
    tok_path, doc_path = paths
    left = limit if limit is not None else -1
    copied = 0
    with open(tok_path, "rb") as f:
        for first, count in split_runs(doc_path, threshold, split, dropped):
            if skip >= count:
                skip -= count
                continue
            first, count, skip = first + skip, count - skip, 0
            if left >= 0:
                count = min(count, left)
                left -= count
            while count:
                n = min(count, COPY_TOKENS)
                data = os.pread(f.fileno(), n * dtype.itemsize, first * dtype.itemsize)
                if len(data) != n * dtype.itemsize:
                    raise UserError(
                        f"{tok_path} is shorter than its document table says; it was damaged after it was written"
                    )
                write(np.frombuffer(data, dtype=dtype))
                first, count, copied = first + n, count - n, copied + n
            if left == 0:
                break
    return copied
