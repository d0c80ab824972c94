"""The on-disk format that `dlx prepare` writes and the loader memory-maps.

A dataset folder holds:

    manifest.json          this format's description of every finished shard (written atomically, last)
    tokenizer.json         the Hugging Face tokenizer that produced the tokens
    token_bytes.npy        bytes per token id, for bits per byte (byte-level BPE tokenizers only)
    train-00000.bin ...    raw little-endian token arrays (`dtype` below), documents separated by eos_id
    val-00000.bin ...      the held-out validation split, same layout

A shard appears in the manifest only once it is complete and fsynced; anything else in the folder is ignored.
Every file the manifest names carries its SHA-256 there. A manifest is validated as it is read: a known format and
version, eos_id and bos_id inside the vocabulary, shard names that are plain file names inside the folder.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, ValidationError, field_validator, model_validator

from dlx.atomic import atomic_write_text
from dlx.errors import UserError

MANIFEST_FILE = "manifest.json"
TOKENIZER_FILE = "tokenizer.json"
TOKEN_BYTES_FILE = "token_bytes.npy"
FORMAT_NAME = "dlx-shards"
FORMAT_VERSION = 1
Split = Literal["train", "val"]
SPLITS: tuple[Split, ...] = ("train", "val")
PARTIAL_SUFFIX = ".partial"
"""A shard still being filled by `dlx prepare` is `<name>.partial`; it is renamed to `<name>` once full and fsynced."""


def shard_name(split: Split, index: int) -> str:
    """`train-00003.bin`: the file name of a split's index-th shard."""
    return f"{split}-{index:05d}.bin"


def token_dtype(vocab_size: int) -> str:
    """uint16 when every id fits (vocab ≤ 65,536), else uint32."""
    return "uint16" if vocab_size <= 2**16 else "uint32"


class ShardInfo(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    """File name inside the dataset folder, e.g. `train-00003.bin`."""
    split: Split
    """Which split the shard belongs to."""
    tokens: int
    """Number of tokens in the file (file size / itemsize)."""
    documents: int
    """Number of documents that end in this shard (each is followed by eos_id)."""
    sha256: str
    """Hex SHA-256 of the file's bytes."""

    @field_validator("name")
    @classmethod
    def _inside_the_folder(cls, name: str) -> str:
        if Path(name).name != name or name in ("", ".", "..") or "\\" in name:
            raise ValueError(f"shard name {name!r} is not a file name inside the dataset folder")
        return name


class Manifest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    format: Literal["dlx-shards"] = FORMAT_NAME
    version: Literal[1] = FORMAT_VERSION
    """The format's version; a manifest of another version is refused (made by a newer dlx)."""
    dtype: Literal["uint16", "uint32"]
    """Numpy dtype of the tokens, little-endian."""
    vocab_size: int
    """The tokenizer's vocabulary size; a model must have at least this many embedding rows."""
    eos_id: int
    """The token that ends every document."""
    bos_id: int | None = None
    """The token that starts every document, when prepare was asked for one."""
    tokenizer_sha256: str
    """Hex SHA-256 of tokenizer.json."""
    token_bytes_sha256: str | None = None
    """Hex SHA-256 of token_bytes.npy; None when the dataset has none (or was prepared before it was recorded)."""
    shards: list[ShardInfo] = []
    """Finished shards, in order."""
    complete: bool = False
    """True once every input has been tokenized; False while prepare is still running or was interrupted."""
    source: dict = {}
    """How the dataset was made (inputs, options), for the record."""

    @model_validator(mode="after")
    def _ids_inside_the_vocabulary(self) -> Manifest:
        for key, token in (("eos_id", self.eos_id), ("bos_id", self.bos_id)):
            if token is not None and not 0 <= token < self.vocab_size:
                raise ValueError(f"{key} {token} is outside the vocabulary (0 to {self.vocab_size - 1})")
        return self

    def split_shards(self, split: Split) -> list[ShardInfo]:
        return [s for s in self.shards if s.split == split]

    def split_tokens(self, split: Split) -> int:
        return sum(s.tokens for s in self.split_shards(split))

    def split_documents(self, split: Split) -> int:
        return sum(s.documents for s in self.split_shards(split))

    def summary(self) -> dict:
        """What `dlx data info --json` prints: totals, dtype, tokenizer hash, and per-split figures."""
        splits = {
            split: {
                "tokens": self.split_tokens(split),
                "documents": self.split_documents(split),
                "shards": len(self.split_shards(split)),
            }
            for split in SPLITS
        }
        return {
            "tokens": sum(s.tokens for s in self.shards),
            "documents": sum(s.documents for s in self.shards),
            "shards": len(self.shards),
            "dtype": self.dtype,
            "tokenizer_sha256": self.tokenizer_sha256,
            "vocab_size": self.vocab_size,
            "eos_id": self.eos_id,
            "bos_id": self.bos_id,
            "complete": self.complete,
            "splits": splits,
        }


def sha256_file(path: Path, chunk: int = 1 << 22) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def read_manifest(folder: str | Path) -> Manifest:
    folder = Path(folder)
    path = folder / MANIFEST_FILE
    if not folder.is_dir():
        raise UserError(f"dataset folder {folder} does not exist; run `dlx prepare ... --out {folder}` first")
    if not path.is_file():
        raise UserError(f"{folder} is not a prepared dataset ({MANIFEST_FILE} missing); run `dlx prepare` first")
    try:
        return Manifest.model_validate(json.loads(path.read_text()))
    except json.JSONDecodeError as e:
        raise UserError(f"{path} is damaged ({e}); run `dlx prepare` again") from None
    except ValidationError as e:
        raise UserError(f"{path} is refused ({_first_error(e)}); run `dlx prepare` again") from None


def _first_error(error: ValidationError) -> str:
    first = error.errors()[0]
    where = ".".join(str(part) for part in first["loc"])
    message = first["msg"].removeprefix("Value error, ")
    if first["type"] == "literal_error":
        message = f"{first['input']!r} is not {first['ctx']['expected']}"
    return f"{where}: {message}" if where else message


def write_manifest(folder: str | Path, manifest: Manifest) -> None:
    atomic_write_text(Path(folder) / MANIFEST_FILE, manifest.model_dump_json(indent=2) + "\n")


def open_shard(folder: str | Path, shard: ShardInfo, dtype: str) -> np.memmap:
    """A read-only memory map of one shard; its size must match the manifest."""
    path = Path(folder) / shard.name
    if not path.is_file():
        raise UserError(f"shard {path} is missing; run `dlx data verify {folder}` and `dlx prepare` again")
    expected = shard.tokens * np.dtype(dtype).itemsize
    if path.stat().st_size != expected:
        raise UserError(
            f"shard {path} has {path.stat().st_size} bytes, manifest says {expected}; the shard is corrupt, "
            "run `dlx prepare` again"
        )
    return np.memmap(path, dtype=np.dtype(dtype).newbyteorder("<"), mode="r", shape=(shard.tokens,))


def verify_shards(folder: str | Path) -> list[str]:
    """Every problem found (missing file, wrong size, wrong checksum), one line each, naming the shard."""
    folder = Path(folder)
    manifest = read_manifest(folder)
    problems = []
    itemsize = np.dtype(manifest.dtype).itemsize
    for shard in manifest.shards:
        path = folder / shard.name
        if not path.is_file():
            problems.append(f"{shard.name}: missing")
        elif path.stat().st_size != shard.tokens * itemsize:
            problems.append(f"{shard.name}: {path.stat().st_size} bytes, expected {shard.tokens * itemsize}")
        elif sha256_file(path) != shard.sha256:
            problems.append(f"{shard.name}: checksum mismatch (the file changed after prepare wrote it)")
    tokenizer = folder / TOKENIZER_FILE
    if not tokenizer.is_file():
        problems.append(f"{TOKENIZER_FILE}: missing")
    elif sha256_file(tokenizer) != manifest.tokenizer_sha256:
        problems.append(f"{TOKENIZER_FILE}: checksum mismatch (another tokenizer was put in this folder)")
    return problems + token_bytes_problems(folder, manifest)


def token_bytes_problems(folder: Path, manifest: Manifest) -> list[str]:
    """token_bytes.npy against the SHA-256 the manifest records (nothing to check where it records none)."""
    if manifest.token_bytes_sha256 is None:
        return []
    table = folder / TOKEN_BYTES_FILE
    if not table.is_file():
        return [f"{TOKEN_BYTES_FILE}: missing"]
    if sha256_file(table) != manifest.token_bytes_sha256:
        return [f"{TOKEN_BYTES_FILE}: checksum mismatch (the file changed after `dlx prepare` wrote it)"]
    return []
