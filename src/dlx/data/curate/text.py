"""Text normalisation and the shingles that MinHash and decontamination hash: characters for CJK, words for
space-separated languages, identifier-blind tokens for source code (`code.code_tokens`: literals and operators kept,
comments dropped). Every hash here is deterministic across processes and machines (no Python `hash`)."""

from __future__ import annotations

import hashlib
import re
import unicodedata
import zlib

import numpy as np

from dlx.data.curate.code import code_tokens

CJK = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff"
_CJK_CHAR = re.compile(f"[{CJK}]")
_SPACES = re.compile(r"\s+")
_WORD_OR_CJK = re.compile(f"[{CJK}]|[^\\W_{CJK}]+")
_MULT = np.uint64(0x100000001B3)
_MASK32 = np.uint64(0xFFFFFFFF)


def normalise(text: str) -> str:
    """Unicode NFKC with whitespace runs collapsed to one space, ends stripped."""
    return _SPACES.sub(" ", unicodedata.normalize("NFKC", text)).strip()


def exact_hash(text: str) -> int:
    """64-bit hash of the normalised text: equal for documents that differ only in width forms and whitespace."""
    return int.from_bytes(hashlib.blake2b(normalise(text).encode("utf-8"), digest_size=8).digest(), "little")


def cjk_share(text: str) -> float:
    """Share of the non-space characters that are CJK (Han, kana, hangul)."""
    visible = len(text) - sum(map(str.isspace, text))
    return len(_CJK_CHAR.findall(text)) / max(visible, 1)


def kind_of(text: str, code: bool) -> str:
    """`code`, `cjk` or `words`: which shingles fit the text (`code`: the document is source code)."""
    if code:
        return "code"
    return "cjk" if cjk_share(text) >= 0.3 else "words"


def word_tokens(text: str) -> list[str]:
    """Lower-cased words, each CJK character a word of its own; punctuation dropped."""
    return _WORD_OR_CJK.findall(unicodedata.normalize("NFKC", text).lower())


def token_ids(tokens: list[str]) -> np.ndarray:
    """CRC-32 of each token, (tokens,) uint64."""
    return np.fromiter((zlib.crc32(t.encode("utf-8")) for t in tokens), dtype=np.uint64, count=len(tokens))


def ngram_hashes(ids: np.ndarray, n: int) -> np.ndarray:
    """64-bit polynomial hash of every run of n consecutive ids, (len - n + 1,) uint64; one hash of all ids when
    fewer than n."""
    if ids.size == 0:
        return np.zeros(0, dtype=np.uint64)
    n = min(n, ids.size)
    h = np.zeros(ids.size - n + 1, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for k in range(n):
            h = h * _MULT + ids[k : ids.size - n + 1 + k] + np.uint64(1)
    return h


CODE_TOKENS_PER_WORD = 3
"""Code shingles are this many times longer: code tokens are mostly punctuation, and with identifiers blinded two
unrelated programs share many short runs (`I = I + 1 ;`)."""


def shingles(text: str, n: int, code: bool) -> np.ndarray:
    """The text's shingle hashes, unique: character n-grams for CJK, word n-grams for words, code-token
    (CODE_TOKENS_PER_WORD × n)-grams for source code (`code`)."""
    kind = kind_of(text, code)
    if kind == "code":
        ids, n = token_ids(code_tokens(text)), n * CODE_TOKENS_PER_WORD
    elif kind == "cjk":
        chars = _SPACES.sub("", unicodedata.normalize("NFKC", text).lower())
        ids = np.frombuffer(chars.encode("utf-32-le"), dtype=np.uint32).astype(np.uint64)
    else:
        ids = token_ids(word_tokens(text))
    return np.unique(ngram_hashes(ids, n))


def fold32(h: np.ndarray) -> np.ndarray:
    """64-bit hashes folded to 32 bits."""
    return (h >> np.uint64(32)) ^ (h & _MASK32)
