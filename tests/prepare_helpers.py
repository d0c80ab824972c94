"""Shared by the prepare tests: small corpora with every kind of text, small tokenizers, reading shards back."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from tokenizers import AddedToken

from dlx.data.prepare.tokenizer import BOS_TOKEN, EOS_TOKEN, train_bpe
from dlx.data.shards import Manifest, open_shard, read_manifest

WORDS = [
    "the",
    "of",
    "and",
    "to",
    "in",
    "is",
    "was",
    "for",
    "that",
    "with",
    "as",
    "on",
    "by",
    "at",
    "from",
    "it",
    "an",
    "were",
    "are",
    "which",
    "this",
    "be",
    "or",
    "has",
    "had",
]
HANZI = "的一是在不了有和人这中大为上个国我以要他时来用们生到作地于出就分对成会可主发年动同工也能下过子说产种面而方后"
CODE = [
    "def f(x):\n    return x ** 2  # square\n",
    "for (int i = 0; i < n; ++i) {\n\tsum += a[i];\n}\n",
    "class A:\n    '''Doc.'''\n\n    def __init__(self):\n        self.x = {'k': [1, 2, 3]}\n",
]


def prepare_command(source: Path, out: Path, tokenizer: Path, *options: str) -> list[str]:
    """`dlx prepare SOURCE --out OUT --tokenizer TOKENIZER OPTIONS` as a child process runs it."""
    return [
        sys.executable,
        "-m",
        "dlx",
        "prepare",
        str(source),
        "--out",
        str(out),
        "--tokenizer",
        str(tokenizer),
        *options,
    ]


def make_document(rng: random.Random) -> str:
    """English-ish, Chinese-ish, code, and awkward Unicode and whitespace, in one document."""
    parts = [
        " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 60))).capitalize() + ".",
        "".join(rng.choice(HANZI) for _ in range(rng.randint(0, 40))) + "。",
        rng.choice(CODE),
        rng.choice(["", "  ", "\n\n", "\r\n", "\t", " émigré naïve café ", " 🙂👍🏽 ", " 1234567 ", "<|end_of_text|>"]),
    ]
    rng.shuffle(parts)
    return "".join(parts)


def make_documents(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [make_document(rng) for _ in range(n)]


def write_jsonl(path: Path, docs: list[str], field: str = "text") -> Path:
    path.write_text("".join(json.dumps({field: d, "id": i}, ensure_ascii=False) + "\n" for i, d in enumerate(docs)))
    return path


@pytest.fixture(scope="session")
def tiny_tokenizer(tmp_path_factory) -> Path:
    """A 400-token byte-level BPE shaped like Llama 3's (trained by prepare's own trainer)."""
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    path.write_text(train_bpe(make_documents(300, seed=99), 400).to_str())
    return path


@pytest.fixture(scope="session")
def llama3_like_tokenizer(tmp_path_factory) -> Path:
    """Vocabulary 128,256 laid out like Llama 3's: <|begin_of_text|> 128000, <|end_of_text|> 128001, reserved
    special tokens around them (here also below 128000, where Llama 3 has its 128k regular BPE tokens)."""
    tok = train_bpe(make_documents(300, seed=98), 400, special_tokens=())
    n = tok.get_vocab_size()
    reserved = [f"<|reserved_special_token_{i}|>" for i in range(128256 - n - 2)]
    specials = [*reserved[: 128000 - n], BOS_TOKEN, EOS_TOKEN, *reserved[128000 - n :]]
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])
    assert tok.token_to_id(EOS_TOKEN) == 128001 and tok.get_vocab_size() == 128256
    path = tmp_path_factory.mktemp("llama") / "tokenizer.json"
    path.write_text(tok.to_str())
    return path


def read_documents(folder: Path, split: str = "train") -> list[list[int]]:
    """Token ids of every document of a split, read back from the shards through the manifest."""
    manifest = read_manifest(folder)
    stream = np.concatenate(
        [np.asarray(open_shard(folder, s, manifest.dtype)) for s in manifest.split_shards(split)]
        or [np.zeros(0, dtype=np.int64)]
    )
    ends = np.flatnonzero(stream == manifest.eos_id)
    assert len(stream) == 0 or ends[-1] == len(stream) - 1, "every document ends with EOS, the last one too"
    docs, start = [], 0
    for end in ends:
        docs.append(stream[start:end].tolist())
        start = end + 1
    return docs


def decoded_documents(folder: Path, split: str = "train") -> list[str]:
    from dlx.data.prepare import load_tokenizer

    tok = load_tokenizer(folder)
    return [tok.decode(ids, skip_special_tokens=False) for ids in read_documents(folder, split)]


def all_documents(folder: Path) -> list[str]:
    return decoded_documents(folder, "train") + decoded_documents(folder, "val")


def folder_bytes(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


def dlx(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dlx", *args], capture_output=True, text=True, timeout=timeout)


def assert_one_line_error(result: subprocess.CompletedProcess, *needles: str) -> None:
    assert result.returncode == 2, (result.returncode, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


def manifest_of(folder: Path) -> Manifest:
    return read_manifest(folder)
