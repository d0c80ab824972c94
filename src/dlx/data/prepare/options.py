"""What `prepare` was asked to do, validated once, before anything is read or written."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from dlx.data.prepare.inputs import InputList, stdlib_folder
from dlx.errors import UserError

DEFAULT_VAL_FRACTION = 0.005
DEFAULT_SHARD_TOKENS = 100_000_000
MIN_TRAINED_VOCAB = 260  # 256 byte tokens + BOS/EOS + at least a couple of merges
CORPORA = ("stdlib",)


@dataclass(frozen=True)
class PrepareOptions:
    """The validated options of one `prepare` run; only the output-shaping ones go into the manifest."""

    inputs: tuple[str, ...]
    """Files, folders and globs, in the order given (empty when `corpus` is set)."""
    corpus: str | None
    """An embedded corpus name (`stdlib`) instead of inputs."""
    tokenizer: Path | None
    """A tokenizer.json, or a folder holding one."""
    train_vocab_size: int | None
    """Train a byte-level BPE with this many tokens instead of loading one."""
    text_field: str
    """The JSON key / Parquet column that holds a document's text."""
    val_fraction: float | None
    """Share of documents held out for validation (ignored when `val_documents` is set)."""
    val_documents: int | None
    """Exact number of documents held out for validation."""
    shard_tokens: int
    """Tokens per shard file (the last shard of each split may be shorter)."""
    workers: int
    """Worker processes; 1 runs everything in this process."""
    strict: bool
    """Stop at the first bad input record instead of skipping it."""
    add_bos: bool
    """Put the tokenizer's BOS before every document (EOS always follows every document)."""
    progress: bool
    """Show a progress bar on stderr."""

    def inputs_record(self) -> list[str]:
        """The inputs as given, for the manifest's `source.inputs`."""
        return list(self.inputs) if self.inputs else [f"{self.corpus}:{stdlib_folder()}"]

    def request(self, inputs: InputList) -> dict:
        """What the output depends on (options and the measured inputs): a rerun must match it to resume or skip."""
        return {
            **self.output_request(),
            "files": inputs.files,
            "bytes": inputs.bytes,
            "fingerprint": inputs.fingerprint,
        }

    def output_request(self) -> dict:
        """The options that shape the output: a rerun must match them to resume or to skip the work."""
        tokenizer = {"train_vocab_size": self.train_vocab_size} if self.train_vocab_size else {"file": True}
        val = {"documents": self.val_documents} if self.val_documents is not None else {"fraction": self.val_fraction}
        return {
            "corpus": self.corpus,
            "text_field": self.text_field,
            "val": val,
            "shard_tokens": self.shard_tokens,
            "add_bos": self.add_bos,
            "tokenizer": tokenizer,
        }


def default_workers() -> int:
    """All the cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def build_options(
    inputs: list[str] | None,
    *,
    corpus: str | None,
    tokenizer: str | Path | None,
    train_tokenizer: int | None,
    text_field: str,
    val_fraction: float | None,
    val_documents: int | None,
    shard_tokens: int,
    workers: int | None,
    strict: bool,
    add_bos: bool,
    progress: bool,
) -> PrepareOptions:
    """Check every option; a bad one raises UserError naming the option and what is allowed."""
    inputs = list(inputs or [])
    if corpus is not None and corpus not in CORPORA:
        raise UserError(f"--corpus {corpus!r} is unknown; the embedded corpora are: {', '.join(CORPORA)}")
    if bool(inputs) == (corpus is not None):
        raise UserError("give input files/folders/globs or --corpus stdlib (exactly one of the two)")
    if (tokenizer is None) == (train_tokenizer is None):
        raise UserError("give --tokenizer PATH or --train-tokenizer VOCAB_SIZE (exactly one of the two)")
    if train_tokenizer is not None and not MIN_TRAINED_VOCAB <= train_tokenizer <= 2**32:
        raise UserError(f"--train-tokenizer must be between {MIN_TRAINED_VOCAB} and 2**32, got {train_tokenizer}")
    if val_documents is not None and val_documents < 0:
        raise UserError(f"--val-documents must be 0 or more, got {val_documents}")
    if val_documents is None:
        val_fraction = DEFAULT_VAL_FRACTION if val_fraction is None else val_fraction
        if not 0.0 <= val_fraction < 1.0:
            raise UserError(f"--val-fraction must be in [0, 1), got {val_fraction}")
    if shard_tokens < 1:
        raise UserError(f"--shard-tokens must be at least 1, got {shard_tokens}")
    if workers is not None and workers < 1:
        raise UserError(f"--workers must be at least 1, got {workers}")
    if not text_field:
        raise UserError("--text-field must not be empty")
    return PrepareOptions(
        inputs=tuple(inputs),
        corpus=corpus,
        tokenizer=Path(tokenizer) if tokenizer is not None else None,
        train_vocab_size=train_tokenizer,
        text_field=text_field,
        val_fraction=None if val_documents is not None else val_fraction,
        val_documents=val_documents,
        shard_tokens=shard_tokens,
        workers=workers or default_workers(),
        strict=strict,
        add_bos=add_bos,
        progress=progress,
    )
