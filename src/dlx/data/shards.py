"""The on-disk format that `dlx prepare` writes and the loader memory-maps.

A dataset folder holds:

    manifest.json          this format's description of every finished shard (written atomically, last)
    tokenizer.json         the Hugging Face tokenizer that produced the tokens
    token_bytes.npy        bytes per token id, for bits per byte (byte-level BPE tokenizers only)
    train-00000.bin ...    raw little-endian token arrays (`dtype` below), documents separated by eos_id
    val-00000.bin ...      the held-out validation split, same layout
    curation.md ...        what curation did, when it was asked (and its record of removed documents)

A shard appears in the manifest only once it is complete and fsynced; anything else in the folder is ignored.
The manifest names every file of the dataset with its size and SHA-256 (`Manifest.dataset_files`): publishing,
mirroring, `dlx data verify` and the checks before training all go through that one list. A manifest is validated
as it is read: a known format and version, eos_id and bos_id inside the vocabulary, file names inside the folder.
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
        return inside_the_folder(name, "shard")


def inside_the_folder(name: str, what: str) -> str:
    """`name` when it is a plain file name inside the dataset folder, else ValueError."""
    if Path(name).name != name or name in ("", ".", "..") or "\\" in name:
        raise ValueError(f"{what} name {name!r} is not a file name inside the dataset folder")
    return name


class DataFile(BaseModel):
    """One file of a dataset besides its shards and manifest.json."""

    model_config = ConfigDict(extra="forbid")

    name: str
    """File name inside the dataset folder, e.g. `tokenizer.json`."""
    bytes: int | None
    """Its size; None only for a file of a manifest written before sizes were recorded."""
    sha256: str
    """Hex SHA-256 of the file's bytes."""

    @field_validator("name")
    @classmethod
    def _inside_the_folder(cls, name: str) -> str:
        return inside_the_folder(name, "file")


TRAINING_FILES = (TOKENIZER_FILE, TOKEN_BYTES_FILE)
"""The files besides the shards that training reads (a bucket dataset's mirror fetches these at start)."""


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
    files: list[DataFile] = []
    """Every other file of the dataset (tokenizer.json, token_bytes.npy, the curation report and record) with its
    size and SHA-256; empty in a manifest written before it was recorded (`dataset_files` then derives the list)."""
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

    def dataset_files(self) -> list[DataFile]:
        """Every file of the dataset but manifest.json: the other files first, then the shards."""
        others = list(self.files) or [DataFile(name=TOKENIZER_FILE, bytes=None, sha256=self.tokenizer_sha256)]
        if not self.files and self.token_bytes_sha256 is not None:
            others.append(DataFile(name=TOKEN_BYTES_FILE, bytes=None, sha256=self.token_bytes_sha256))
        itemsize = np.dtype(self.dtype).itemsize
        shards = [DataFile(name=s.name, bytes=s.tokens * itemsize, sha256=s.sha256) for s in self.shards]
        return others + shards

    def listed(self, name: str) -> DataFile | None:
        """The entry of `name` in `dataset_files`, None when the dataset has no such file."""
        return next((entry for entry in self.dataset_files() if entry.name == name), None)

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
            "files": [entry.name for entry in self.dataset_files() if not _is_shard(entry.name)],
            "bytes": sum(entry.bytes or 0 for entry in self.dataset_files()),
        }


def _is_shard(name: str) -> bool:
    return name.endswith(".bin") and name.startswith(SPLITS)


def describe_file(folder: Path, name: str) -> DataFile:
    """The `DataFile` entry of a file already written in `folder`."""
    path = folder / name
    return DataFile(name=name, bytes=path.stat().st_size, sha256=sha256_file(path))


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


def verify_shards(folder: str | Path, hash_files: bool = True) -> list[str]:
    """Every problem found in the files the manifest lists (missing, wrong size, and with `hash_files` a wrong
    checksum), one line each, naming the file."""
    folder = Path(folder)
    entries = read_manifest(folder).dataset_files()
    return [problem for entry in entries if (problem := file_problem(folder, entry, hash_files)) is not None]


def file_problem(folder: Path, entry: DataFile, hash_file: bool = True) -> str | None:
    """What is wrong with one listed file of a local dataset folder (its checksum too with `hash_file`), or None."""
    path = folder / entry.name
    if not path.is_file():
        return f"{entry.name}: missing"
    size = path.stat().st_size
    if entry.bytes is not None and size != entry.bytes:
        return f"{entry.name}: {size} bytes, expected {entry.bytes}"
    if hash_file and sha256_file(path) != entry.sha256:
        return f"{entry.name}: checksum mismatch ({CHANGED.get(entry.name, CHANGED[''])})"
    return None


CHANGED = {
    TOKENIZER_FILE: "another tokenizer was put in this folder",
    TOKEN_BYTES_FILE: "the file changed after `dlx prepare` wrote it",
    "": "the file changed after prepare wrote it",
}
"""Why a listed file's checksum differs, by file (the shards and reports: the default)."""


def token_bytes_problems(folder: Path, manifest: Manifest) -> list[str]:
    """token_bytes.npy against the manifest's entry (nothing to check where the dataset has none)."""
    entry = manifest.listed(TOKEN_BYTES_FILE)
    problem = file_problem(folder, entry) if entry is not None else None
    return [problem] if problem else []
