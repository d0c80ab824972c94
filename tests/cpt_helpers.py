"""Text for continued-pretraining tests: a made-up Chinese corpus (CJK characters drawn by a Zipf law into 2-4
character words, clauses and sentences) and a Llama-3-style base tokenizer trained on English (stdlib sources)."""

from __future__ import annotations

import inspect
import random
from pathlib import Path

from tokenizers import Tokenizer

HANZI = [chr(0x4E00 + i * 37) for i in range(400)]
"""400 CJK Unified Ideographs, spread over the block."""
TOP_SPECIALS = ["<|reserved_special_token_0|>", "<|reserved_special_token_1|>"]
"""Special tokens at the top of the base vocabulary, as Llama 3 has 128000-128255."""


def chinese_text(n_sentences: int, seed: int) -> str:
    vocabulary = random.Random(1234)  # the same words for every seed: held-out text is of the same language
    words = ["".join(vocabulary.choices(HANZI[:120], k=vocabulary.randint(2, 4))) for _ in range(300)]
    rng = random.Random(seed)
    weights = [1 / (rank + 1) for rank in range(len(words))]
    sentences = []
    for _ in range(n_sentences):
        clauses = ["".join(rng.choices(words, weights, k=rng.randint(2, 6))) for _ in range(rng.randint(1, 3))]
        sentences.append("，".join(clauses) + "。")
    return "".join(sentences)


def english_texts() -> list[str]:
    import argparse
    import json.decoder
    import textwrap

    return [inspect.getsource(m) for m in (json.decoder, textwrap, argparse)]


def base_tokenizer(path: Path, vocab_size: int = 400) -> Path:
    """A byte-level BPE with Llama 3's pre-tokenizer on English, two special tokens above it; written to `path`."""
    from dlx.data.prepare.tokenizer import train_bpe

    tokenizer: Tokenizer = train_bpe(english_texts(), vocab_size)
    tokenizer.add_special_tokens(TOP_SPECIALS)
    path.parent.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(path))
    return path
