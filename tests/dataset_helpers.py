"""The one way tests build a prepared dataset: shards, manifest and tokenizer as `dlx prepare` leaves them."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np

from dlx.data.shards import Manifest, ShardInfo, sha256_file, shard_name, token_dtype, write_manifest


def write_dataset(
    folder: Path,
    splits: dict[str, list[np.ndarray]],
    vocab_size: int,
    eos_id: int = 0,
    documents: dict[str, list[int]] | None = None,
    tokenizer: str = "{}",
) -> Path:
    """A prepared dataset as `dlx prepare` leaves it: each array of `splits` one shard (`train-00000.bin`, ...) in the
    vocabulary's token dtype with its SHA-256, `tokenizer` as tokenizer.json, and a complete manifest.
    `documents`: the documents that end in each shard, per split (1 per shard when not given)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tokenizer.json").write_text(tokenizer)
    dtype = np.dtype(token_dtype(vocab_size)).newbyteorder("<")
    shards = []
    for split, arrays in splits.items():
        for i, tokens in enumerate(arrays):
            path = folder / shard_name(split, i)
            np.asarray(tokens).astype(dtype).tofile(path)
            n_docs = documents[split][i] if documents else 1
            shards.append(
                ShardInfo(name=path.name, split=split, tokens=len(tokens), documents=n_docs, sha256=sha256_file(path))
            )
    manifest = Manifest(
        dtype=dtype.name,
        vocab_size=vocab_size,
        eos_id=eos_id,
        tokenizer_sha256=sha256_file(folder / "tokenizer.json"),
        shards=shards,
        complete=True,
    )
    write_manifest(folder, manifest)
    return folder


def counting_dataset(folder: Path, splits: dict[str, list[int]], vocab_size: int = 2**20) -> Path:
    """Shards of the given lengths holding consecutive integers (mod vocab_size), one stream per split: a window's
    first token tells which window it is."""
    streams = {}
    for split, lengths in splits.items():
        bounds = np.cumsum([0, *lengths])
        streams[split] = [np.arange(a, b) % vocab_size for a, b in itertools.pairwise(bounds.tolist())]
    return write_dataset(folder, streams, vocab_size)
