"""Text → token ids, fast: a byte-level BPE tokenizer.json converted to a `tiktoken.Encoding`, else HF tokenizers.

Both paths give the ids of `Tokenizer.encode_batch(texts, add_special_tokens=False)` with `encode_special_tokens`
set, i.e. text that looks like a special token (`<|end_of_text|>` inside a document) is encoded as plain text, so
the only special tokens in the shards are the BOS/EOS that prepare puts around documents.

tiktoken runs the same byte-level BPE several times faster per core (see BENCHMARKS.md). The conversion applies when
the tokenizer is a plain byte-level BPE: no normalizer, a ByteLevel pre-tokenizer (GPT-2 regex) or a Split regex
followed by ByteLevel (Llama 3), no dropout/byte fallback/subword affixes, and only special added tokens. It is then
checked against HF on a sample of the corpus plus a set of awkward strings; any difference falls back to HF.
"""

from __future__ import annotations

import json
import random
from typing import Protocol

GPT2_PATTERN = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
PROBES = [
    "",
    " ",
    "Hello, world! It's 2024; we'll see.\n\n",
    "  indented\n\tTabs\r\nCRLF  \n\n\n   trailing   ",
    "12345678901234 3.14159 1,000,000 ٣٤٥",
    "中文文本，测试。日本語のテキスト、한국어 텍스트",
    "émigré naïve café Ωμέγα Привет мир",
    "def f(x):\n    return x ** 2  # comment\n",
    "<|end_of_text|> <|begin_of_text|><s></s>",
    "emoji 🙂👍🏽 zero\u200bwidth \u00a0nbsp",
    "'S 'T 'RE 'VE 'M 'LL 'D don't I'M",
]


class NotConvertible(Exception):
    """The tokenizer is not a plain byte-level BPE; the HF path must be used."""


class Encoder(Protocol):
    name: str

    def encode(self, texts: list[str]) -> list[list[int]]: ...


class HFEncoder:
    """Hugging Face tokenizers, special-looking text encoded as plain text."""

    name = "huggingface"

    def __init__(self, json_text: str):
        from tokenizers import Tokenizer

        self.tokenizer = Tokenizer.from_str(json_text)
        self.tokenizer.encode_special_tokens = True

    def encode(self, texts: list[str]) -> list[list[int]]:
        batch = getattr(self.tokenizer, "encode_batch_fast", self.tokenizer.encode_batch)  # fast: no offsets
        return [e.ids for e in batch(texts, add_special_tokens=False)]


class TiktokenEncoder:
    name = "tiktoken"

    def __init__(self, json_text: str):
        self.encoding = tiktoken_encoding(json.loads(json_text))

    def encode(self, texts: list[str]) -> list[list[int]]:
        encode = self.encoding.encode_ordinary
        return [encode(t) for t in texts]


def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet: each byte is shown as one printable character."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, n = printable[:], 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(printable, chars, strict=True)}


def _pattern(pre: dict | None) -> str:
    """The pre-tokenizer regex, if the pre-tokenizer is one tiktoken can reproduce."""
    if pre and pre.get("type") == "ByteLevel" and pre.get("use_regex", True) and not pre.get("add_prefix_space"):
        return GPT2_PATTERN
    steps = pre.get("pretokenizers", []) if pre and pre.get("type") == "Sequence" else []
    if len(steps) == 2 and steps[0].get("type") == "Split" and steps[1].get("type") == "ByteLevel":
        split, level = steps
        regex = split.get("pattern", {}).get("Regex")
        split_ok = regex and split.get("behavior") == "Isolated" and not split.get("invert")
        if split_ok and not level.get("use_regex", True) and not level.get("add_prefix_space"):
            return regex
    raise NotConvertible(f"pre-tokenizer {json.dumps(pre)[:120]} is not ByteLevel or Split+ByteLevel")


def _check_model(spec: dict) -> dict:
    model = spec.get("model") or {}
    if model.get("type") != "BPE":
        raise NotConvertible(f"model type {model.get('type')} is not BPE")
    if spec.get("normalizer"):
        raise NotConvertible("it has a normalizer")
    if model.get("dropout") or model.get("byte_fallback"):
        raise NotConvertible("BPE dropout or byte fallback")
    if model.get("continuing_subword_prefix") or model.get("end_of_word_suffix"):
        raise NotConvertible("subword prefix/suffix")
    if any(not t.get("special") for t in spec.get("added_tokens", [])):
        raise NotConvertible("it has non-special added tokens (matched inside text)")
    return model


def tiktoken_encoding(spec: dict):
    """A tiktoken.Encoding equivalent to the byte-level BPE in a parsed tokenizer.json, or NotConvertible."""
    import tiktoken

    model = _check_model(spec)
    pattern = _pattern(spec.get("pre_tokenizer"))
    byte_of = _byte_decoder()
    added = {t["content"] for t in spec.get("added_tokens", [])}
    try:
        ranks = {bytes(byte_of[c] for c in token): i for token, i in model["vocab"].items() if token not in added}
    except KeyError:
        raise NotConvertible("a vocabulary entry is not in the byte-level alphabet") from None
    if len(set(ranks.values())) != len(ranks) or any(bytes([b]) not in ranks for b in range(256)):
        raise NotConvertible("the byte-level vocabulary is incomplete or has duplicate ids")
    # Special tokens are left out: encode_ordinary never matches them, and tiktoken would compile a regex of all.
    return tiktoken.Encoding("dlx", pat_str=pattern, mergeable_ranks=ranks, special_tokens={})


def choose_encoder(json_text: str, sample: list[str]) -> tuple[str, str]:
    """("tiktoken" | "huggingface", why): the fast path when it converts and matches HF on sample + probes."""
    try:
        fast = TiktokenEncoder(json_text)
    except NotConvertible as e:
        return HFEncoder.name, f"tiktoken fast path not used: {e}"
    texts = PROBES + sample
    reference = HFEncoder(json_text).encode(texts)
    for i, (a, b) in enumerate(zip(reference, fast.encode(texts), strict=True)):
        if a != b:
            return HFEncoder.name, f"tiktoken fast path not used: its ids differ from Hugging Face on sample text {i}"
    return TiktokenEncoder.name, f"tiktoken fast path (ids checked equal to Hugging Face on {len(texts)} texts)"


def spread(sample: list[str], max_chars: int) -> list[str]:
    """Documents drawn evenly (seeded) from the whole sample, about max_chars in all (to check the fast path on)."""
    order = list(range(len(sample)))
    random.Random(0).shuffle(order)
    picked, chars = [], 0
    for i in order:
        if chars >= max_chars:
            break
        picked.append(sample[i])
        chars += len(sample[i])
    return picked


def make_encoder(name: str, json_text: str) -> Encoder:
    return TiktokenEncoder(json_text) if name == TiktokenEncoder.name else HFEncoder(json_text)
