"""Bytes per token id, for bits per byte: the UTF-8 bytes of text each token stands for.

Bits per byte (bpb) = Σ cross-entropy over the evaluated target tokens, in bits, ÷ Σ the bytes those tokens decode to.
It does not depend on the tokenizer, so runs with different tokenizers (or an extended vocabulary) compare by it.

Exact for byte-level BPE (dlx's own tokenizer, Llama 3's, GPT-2's): every character of a token's string in the
vocabulary stands for exactly one byte, so a token's byte count is its string's length, and the bytes of a span of
tokens are the sum over its ids. Special tokens (eos, bos) stand for no text: 0 bytes. An added token that is not
special is plain text: its UTF-8 length. Other tokenizers (SentencePiece-style) have no such table: bpb is None there.

`dlx prepare` writes the table as `token_bytes.npy` beside tokenizer.json; a dataset prepared before has none and the
table is computed from its tokenizer.json (the same numbers).
"""

from __future__ import annotations

import functools
import hashlib
import io
import json
from pathlib import Path

import numpy as np

from dlx.atomic import atomic_write_bytes
from dlx.data.shards import TOKEN_BYTES_FILE, TOKENIZER_FILE


def token_byte_lengths(tokenizer_json: str) -> np.ndarray | None:
    """int32 (vocab size,): the bytes each id stands for; None when the tokenizer is not byte-level BPE."""
    from tokenizers import Tokenizer, pre_tokenizers

    spec = json.loads(tokenizer_json)
    if not _decodes_byte_level(spec.get("decoder")):
        return None
    vocab = Tokenizer.from_str(tokenizer_json).get_vocab(with_added_tokens=True)
    added = {t["content"]: bool(t.get("special")) for t in spec.get("added_tokens") or []}
    alphabet = set(pre_tokenizers.ByteLevel.alphabet())
    lengths = np.zeros(max(vocab.values()) + 1, dtype=np.int32)
    for token, token_id in vocab.items():
        if token in added:
            lengths[token_id] = 0 if added[token] else len(token.encode("utf-8"))
        elif set(token) <= alphabet:
            lengths[token_id] = len(token)
        else:
            return None  # a vocabulary entry that is not byte-level: not a byte-level BPE after all
    return lengths


def _decodes_byte_level(decoder: dict | None) -> bool:
    if not decoder:
        return False
    if decoder.get("type") == "Sequence":
        return any(_decodes_byte_level(d) for d in decoder.get("decoders", []))
    return decoder.get("type") == "ByteLevel"


def write_token_bytes(folder: Path, tokenizer_json: str) -> str | None:
    """token_bytes.npy beside the dataset's tokenizer.json, and its SHA-256 (for the manifest); nothing, and None, for
    a tokenizer that is not byte-level."""
    lengths = token_byte_lengths(tokenizer_json)
    if lengths is None:
        return None
    buffer = io.BytesIO()
    np.save(buffer, lengths)
    atomic_write_bytes(folder / TOKEN_BYTES_FILE, buffer.getvalue())
    return hashlib.sha256(buffer.getvalue()).hexdigest()


@functools.lru_cache(maxsize=8)
def read_token_bytes(folder: Path) -> np.ndarray | None:
    """The dataset's table: token_bytes.npy, else computed from its tokenizer.json; None without either (synthetic
    data) or for a tokenizer that is not byte-level."""
    table = folder / TOKEN_BYTES_FILE
    if table.is_file():
        return np.load(table)
    tokenizer = folder / TOKENIZER_FILE
    return token_byte_lengths(tokenizer.read_text(encoding="utf-8")) if tokenizer.is_file() else None
