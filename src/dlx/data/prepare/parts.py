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

from dlx.data.shards import SPLITS
from dlx.errors import UserError

DOC_DTYPE = np.dtype([("hash", "<u8"), ("tokens", "<u8")])
DOC_BLOCK = 1 << 16  # documents read at a time (1 MB of the .doc file)
COPY_TOKENS = 1 << 22  # tokens read at a time


def part_paths(folder: str | Path, index: int) -> tuple[Path, Path]:
    """(tokens, documents) files of unit `index` in `folder`."""
    return Path(folder) / f"{index:08d}.tok", Path(folder) / f"{index:08d}.doc"


def split_runs(doc_path: Path, threshold: int, split: str) -> Iterator[tuple[int, int]]:
    """(first token, token count) of each run of consecutive documents of `split`, in order."""
    offset = 0
    with open(doc_path, "rb") as f:
        while (docs := np.frombuffer(f.read(DOC_BLOCK * DOC_DTYPE.itemsize), dtype=DOC_DTYPE)).size:
            ends = offset + np.cumsum(docs["tokens"].astype(np.int64))
            starts = ends - docs["tokens"].astype(np.int64)
            is_val = docs["hash"] < np.uint64(threshold) if threshold < 2**64 else np.ones(docs.size, dtype=bool)
            picked = np.flatnonzero(is_val if split == "val" else ~is_val)
            if picked.size:
                breaks = np.flatnonzero(np.diff(picked) != 1) + 1
                firsts = picked[np.r_[0, breaks]]
                lasts = picked[np.r_[breaks - 1, picked.size - 1]]
                yield from zip(starts[firsts].tolist(), (ends[lasts] - starts[firsts]).tolist(), strict=True)
            offset = int(ends[-1])


def split_tokens(doc_path: Path, threshold: int) -> dict[str, int]:
    """Tokens of each split in a part."""
    return {split: sum(count for _, count in split_runs(doc_path, threshold, split)) for split in SPLITS}


def copy_split(
    paths: tuple[Path, Path],
    threshold: int,
    split: str,
    dtype: np.dtype,
    write: Callable[[np.ndarray], object],
    skip: int = 0,
    limit: int | None = None,
) -> int:
    """Pass a part's tokens of `split` to write(array), from its skip-th such token on, at most `limit`; the count."""
    tok_path, doc_path = paths
    left = limit if limit is not None else -1
    copied = 0
    with open(tok_path, "rb") as f:
        for first, count in split_runs(doc_path, threshold, split):
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
                        f"{tok_path} is shorter than {doc_path.name} says; it was damaged after it was written"
                    )
                write(np.frombuffer(data, dtype=dtype))
                first, count, copied = first + n, count - n, copied + n
            if left == 0:
                break
    return copied
