"""Text normalisation and the shingles that MinHash and decontamination hash: characters for CJK, words for
space-separated languages, identifier-blind tokens for source code (literals and operators kept). Every hash here is
deterministic across processes and machines (no Python `hash`)."""

from __future__ import annotations

import hashlib
import re
import unicodedata
import zlib

import numpy as np

CJK = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff"
_CJK_CHAR = re.compile(f"[{CJK}]")
_SPACES = re.compile(r"\s+")
_WORD_OR_CJK = re.compile(f"[{CJK}]|[^\\W_{CJK}]+")
_CODE_TOKEN = re.compile(r"[A-Za-z_]\w*|\d+(?:\.\d+)?|\"(?:\\.|[^\"\\\n])*\"|'(?:\\.|[^'\\\n])*'|\S")
_CODE_START = re.compile(
    r"^\s*(#include|#define|import |from \S+ import|def |class |public |private |static |int |void |using |"
    r"package |func |fn |return\b|for ?\(|while ?\(|if ?\(|}|//|/\*)"
)
_KEYWORD_TEXT = """
and as assert async await break case catch char class const continue def default del do double elif
else enum except extern false final finally float for from func go if import in int is lambda let
long namespace new nil none not null or package pass private protected public raise return self
short signed sizeof static std string struct super switch template this throw true try typedef
unsigned using var void while with yield include define cin cout endl printf scanf print input
range len main vector map set list
"""
KEYWORDS = frozenset(_KEYWORD_TEXT.split())
"""Code words kept as they are in code shingles (identifiers become `I`)."""
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


def looks_like_code(text: str) -> bool:
    """Source code by its lines: at least two, a third or more of the non-blank ones starting or ending like code."""
    lines = [line for line in text.splitlines() if line.strip()]
    if len(lines) < 2:
        return False
    codeish = sum(1 for line in lines if _CODE_START.match(line) or line.rstrip().endswith((";", "{", "}", ":", ")")))
    return codeish * 3 >= len(lines)


def kind_of(text: str) -> str:
    """`code`, `cjk` or `words`: which shingles fit the text."""
    if looks_like_code(text):
        return "code"
    return "cjk" if cjk_share(text) >= 0.3 else "words"


def word_tokens(text: str) -> list[str]:
    """Lower-cased words, each CJK character a word of its own; punctuation dropped."""
    return _WORD_OR_CJK.findall(unicodedata.normalize("NFKC", text).lower())


def code_tokens(text: str) -> list[str]:
    """Tokens of source code with identifiers replaced by `I` (keywords kept), literals and operators as written, so
    a renamed variable or a reformatted layout leaves the sequence unchanged while programs that differ in their
    numbers, strings or operators (what they compute) do not."""
    return [
        tok if not (tok[0].isalpha() or tok[0] == "_") or tok.lower() in KEYWORDS else "I"
        for tok in _CODE_TOKEN.findall(text)
    ]


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


def shingles(text: str, n: int) -> np.ndarray:
    """The text's shingle hashes, unique: character n-grams for CJK, word n-grams for words, code-token
    (CODE_TOKENS_PER_WORD × n)-grams."""
    kind = kind_of(text)
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
