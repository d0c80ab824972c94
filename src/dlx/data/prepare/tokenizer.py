"""Tokenizers: load a Hugging Face tokenizer.json, or train a byte-level BPE shaped like Llama 3's.

The trained tokenizer uses Llama 3's pre-tokenizer regex, byte-level BPE with `ignore_merges` and Llama 3's special
token names, so everything downstream (the tiktoken fast path, `dlx generate`) treats it like a real Llama 3 tokenizer.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

from dlx.data.shards import MANIFEST_FILE, TOKENIZER_FILE, read_manifest
from dlx.errors import UserError

LLAMA3_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
BOS_TOKEN, EOS_TOKEN = "<|begin_of_text|>", "<|end_of_text|>"
# Document-end tokens of common tokenizers, most specific first; <|eot_id|> ends a chat turn, not a document.
EOS_NAMES = (EOS_TOKEN, "<|endoftext|>", "</s>", "<eos>", "<|eos|>", "<|end|>")
BOS_NAMES = (BOS_TOKEN, "<s>", "<bos>", "<|startoftext|>", "<|bos|>")
MAX_VOCAB = 2**32


@dataclass(frozen=True)
class TokenizerInfo:
    """What the shards need to know about a tokenizer."""

    json_text: str
    """The tokenizer.json text, written beside the shards byte for byte."""
    sha256: str
    vocab_size: int
    """Highest id + 1 (added tokens included)."""
    eos_id: int
    bos_id: int | None


def tokenizer_file(folder_or_file: str | Path) -> Path:
    """A tokenizer.json path from a file or from a folder holding one (a Hugging Face model or a dlx dataset)."""
    path = Path(folder_or_file)
    if path.is_dir():
        path = path / TOKENIZER_FILE
    if not path.is_file():
        raise UserError(f"tokenizer {path} does not exist; give a tokenizer.json or a folder holding one")
    return path


def load_tokenizer(folder_or_file: str | Path) -> Tokenizer:
    """A `tokenizers.Tokenizer` from a tokenizer.json, a Hugging Face model folder or a prepared dataset folder."""
    path = tokenizer_file(folder_or_file)
    return _parse(path, _read_text(path))


def tokenizer_text(folder_or_file: str | Path) -> str:
    """The exact text of a tokenizer.json (its SHA-256 is the manifest's tokenizer_sha256)."""
    return _read_text(tokenizer_file(folder_or_file))


def _read_text(path: Path) -> str:
    """The exact text (no newline translation), so its hash is the file's hash."""
    try:
        return path.read_bytes().decode("utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"cannot read tokenizer {path}: {e}") from None


def _parse(path: Path, text: str) -> Tokenizer:
    try:
        return Tokenizer.from_str(text)
    except Exception as e:  # tokenizers raises a bare Exception for any bad tokenizer.json
        raise UserError(f"{path} is not a Hugging Face tokenizer.json ({str(e).splitlines()[0][:200]})") from None


def read_tokenizer(folder_or_file: str | Path, add_bos: bool | None) -> TokenizerInfo:
    """Load, check and describe a tokenizer given with --tokenizer; add_bos None follows its own convention."""
    path = tokenizer_file(folder_or_file)
    text = _read_text(path)
    return describe(_parse(path, text), text, add_bos, _tokenizer_config(path.parent), str(path))


def describe(
    tok: Tokenizer, json_text: str, add_bos: bool | None, config: dict | None = None, name: str = ""
) -> TokenizerInfo:
    """Vocabulary size, EOS/BOS ids and hash; UserError if the ids do not fit a token dtype or EOS is unknown.
    add_bos None: BOS before every document if the tokenizer's own convention says so (`bos_by_convention`)."""
    vocab = tok.get_vocab(with_added_tokens=True)
    vocab_size = max(vocab.values()) + 1
    if vocab_size > MAX_VOCAB:
        raise UserError(f"tokenizer {name} has ids up to {vocab_size - 1:,}, more than uint32 tokens can hold")
    eos = _special_id(vocab, EOS_NAMES, (config or {}).get("eos_token"))
    if eos is None:
        raise UserError(f"tokenizer {name} has no end-of-document token (looked for {', '.join(EOS_NAMES)})")
    by_convention, named = bos_by_convention(json_text, config)
    bos = _special_id(vocab, (*([named] if named else []), *BOS_NAMES), (config or {}).get("bos_token"))
    if add_bos and bos is None:
        raise UserError(f"--bos: tokenizer {name} has no begin-of-document token (looked for {', '.join(BOS_NAMES)})")
    sha = hashlib.sha256(json_text.encode("utf-8")).hexdigest()
    wanted = by_convention if add_bos is None else add_bos
    return TokenizerInfo(json_text, sha, vocab_size, eos, bos if wanted else None)


def bos_by_convention(json_text: str, config: dict | None) -> tuple[bool, str | None]:
    """Whether this tokenizer's own encoding starts a text with BOS, as transformers applies it: tokenizer_config.json's
    `add_bos_token` when it is set, else tokenizer.json's post-processor (a TemplateProcessing, alone or in a
    Sequence, whose single-text template begins with a special token, e.g. Llama 3's `<|begin_of_text|>` $A), with
    the token the post-processor names (or None). A tokenizer dlx trains has no post-processor: no BOS."""
    first = _template_first_token(json.loads(json_text).get("post_processor"))
    configured = (config or {}).get("add_bos_token")
    adds = configured if isinstance(configured, bool) else first is not None
    return adds, first


def _template_first_token(processor: dict | None) -> str | None:
    """The special token a TemplateProcessing puts before a single text, looking inside a Sequence."""
    if not isinstance(processor, dict):
        return None
    if processor.get("type") == "Sequence":
        found = [_template_first_token(p) for p in processor.get("processors", [])]
        return next((name for name in found if name is not None), None)
    if processor.get("type") != "TemplateProcessing" or not processor.get("single"):
        return None
    first = processor["single"][0]
    return first["SpecialToken"]["id"] if isinstance(first, dict) and "SpecialToken" in first else None


def dataset_bos_note(folder: Path, bos_id: int | None) -> str:
    """A few words for `dlx data info` and the run header: what starts every document of a prepared dataset, with the
    BOS token's name from the dataset's tokenizer.json (its added tokens)."""
    if bos_id is None:
        return "bos: none (each document is its ids then EOS)"
    added = json.loads(_read_text(tokenizer_file(folder))).get("added_tokens") or []
    name = next((t.get("content") for t in added if t.get("id") == bos_id), None)
    return f"bos: {name or 'id'} (id {bos_id}) before every document"


def _special_id(vocab: dict[str, int], names: tuple[str, ...], configured: object) -> int | None:
    if isinstance(configured, dict):
        configured = configured.get("content")
    for name in (*names, configured):
        if isinstance(name, str) and name in vocab:
            return vocab[name]
    return None


def document_bos_id(tokenizer_path: Path) -> int | None:
    """The BOS id a text encoded for this tokenizer's model starts with (`dlx generate`, training samples): the
    dataset's choice when the tokenizer.json sits in a prepared dataset (its manifest), else the tokenizer's own
    convention (`bos_by_convention`)."""
    if (tokenizer_path.parent / MANIFEST_FILE).is_file():
        return read_manifest(tokenizer_path.parent).bos_id
    return read_tokenizer(tokenizer_path, None).bos_id


def encode_prompt(tokenizer: Tokenizer, text: str, bos_id: int | None) -> list[int]:
    """The ids of a prompt as training documents began: [BOS] then the text's ids (no post-processor of its own)."""
    ids = tokenizer.encode(text, add_special_tokens=False).ids
    return [bos_id, *ids] if bos_id is not None and ids else ids


def _tokenizer_config(folder: Path) -> dict | None:
    """tokenizer_config.json beside a tokenizer.json names its eos/bos tokens when they have unusual names."""
    path = folder / "tokenizer_config.json"
    try:
        return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None
    except (OSError, ValueError):
        return None


def train_bpe(
    texts: Iterable[str], vocab_size: int, special_tokens: tuple[str, ...] = (BOS_TOKEN, EOS_TOKEN)
) -> Tokenizer:
    """A byte-level BPE trained on texts (deterministic: the same texts always give the same tokenizer.json)."""
    tok = Tokenizer(models.BPE(ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(special_tokens),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    return tok


def document_token_ids(folder_or_file: str | Path) -> tuple[int, int | None]:
    """(end-of-document id, begin-of-document id or None) as `dlx prepare` picks them for this tokenizer, so that an
    exported model stops where its training documents ended."""
    path = tokenizer_file(folder_or_file)
    vocab = _parse(path, _read_text(path)).get_vocab(with_added_tokens=True)
    config = _tokenizer_config(path.parent) or {}
    eos = _special_id(vocab, EOS_NAMES, config.get("eos_token"))
    if eos is None:
        raise UserError(f"tokenizer {path} has no end-of-document token (looked for {', '.join(EOS_NAMES)})")
    return eos, _special_id(vocab, BOS_NAMES, config.get("bos_token"))
