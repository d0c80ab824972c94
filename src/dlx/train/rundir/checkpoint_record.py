"""What trainer_state.json records about a checkpoint's files, and the checks a read makes: its schema, each file's size
and SHA-256. The SHA-256 of the files dlx writes itself is computed from the bytes handed to the writer (the file is not
read back), recorded beside the file's size (`files[name] = {"size": ..., "sha256": ...}`) and verified on every read
(resume, `model.init_from`, `dlx generate`/`eval`/`export-hf` on a run folder):

    train_state.pt      hashed as torch.save writes it (`HashingFile`)
    model.safetensors   its header read back (a few KB), then every tensor hashed from memory in the order of its
                        `data_offsets`: the same bytes safetensors wrote after the header (`safetensors_sha256`)
    model_args.json     hashed from the text written

The shards other libraries write on every rank (dcp/, deepspeed/) are recorded by size only.
"""

from __future__ import annotations

import hashlib
import json
import struct
from pathlib import Path
from typing import Any

import torch

STATE_FILE = "trainer_state.json"
MAX_STEP = 10**12
"""More optimizer steps than any run takes: a larger step in trainer_state.json is damage, not a position."""
MAX_COUNT = 2**63 - 1
MAX_WORLD = 1 << 20
CHUNK = 8 << 20
"""Bytes read per update when a file is verified."""


class HashingFile:
    """A binary file for torch.save that hashes every byte written to it; `error` keeps the OSError of a failed write
    (torch.save itself reports a full disk as `enforce fail ... unexpected pos`, which names no cause)."""

    def __init__(self, file: Any) -> None:
        self.file, self.error, self.sha = file, None, hashlib.sha256()

    def write(self, data: Any) -> int:
        try:
            written = self.file.write(data)
        except OSError as e:
            self.error = self.error or e
            raise
        self.sha.update(memoryview(data)[:written] if written is not None else data)
        return written

    def flush(self) -> None:
        self.file.flush()


def safetensors_sha256(path: Path, tensors: dict[str, torch.Tensor]) -> str:
    """The SHA-256 of the safetensors file `path` just written from `tensors`: its header from the file, the data from
    memory. ValueError when the header's layout does not account for every byte (then nothing is recorded)."""
    with open(path, "rb") as f:
        head = f.read(8)
        (size,) = struct.unpack("<Q", head)
        header_bytes = f.read(size)
    header = json.loads(header_bytes)
    sha = hashlib.sha256(head + header_bytes)
    entries = sorted((info["data_offsets"], name) for name, info in header.items() if name != "__metadata__")
    position = 0
    for (start, end), name in entries:
        data = tensor_bytes(tensors[name])
        if start != position or end - start != len(data):
            raise ValueError(f"{path.name}: {name} is not where its header says")
        sha.update(data)
        position = end
    if 8 + size + position != path.stat().st_size:
        raise ValueError(f"{path.name}: the header does not account for the whole file")
    return sha.hexdigest()


def tensor_bytes(tensor: torch.Tensor) -> memoryview:
    """The tensor's bytes as safetensors stores them (little-endian, row-major), without a copy on the CPU."""
    flat = tensor.detach().contiguous().cpu().reshape(-1)
    return memoryview(flat.view(torch.uint8).numpy()) if flat.numel() else memoryview(b"")


def text_sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def file_sha256(path: Path) -> str:
    """The SHA-256 of a file, read in `CHUNK`s (hashlib releases the GIL while hashing each)."""
    sha = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            sha.update(chunk)
    return sha.hexdigest()


def file_record(size: int, sha256: str | None) -> dict[str, Any]:
    """One file's entry in trainer_state.json's `files`."""
    return {"size": size, "sha256": sha256} if sha256 else {"size": size}


def schema_problem(raw: dict, step: Any, tokens_seen: Any, world_size: Any, files: Any, loader: Any) -> str | None:
    """What is wrong with trainer_state.json's fields (`raw` as read, the rest as the dataclass holds them), or None."""
    for key in ("step", "files", "format"):
        if key not in raw:
            return f"{STATE_FILE} has no {key!r}"
    for key, value, least, most in (
        ("step", step, 0, MAX_STEP),
        ("tokens_seen", tokens_seen, 0, MAX_COUNT),
        ("world_size", world_size, 1, MAX_WORLD),
    ):
        if type(value) is not int or not least <= value <= most:
            return f"{STATE_FILE} has {key} {value!r}, not a count between {least} and {most:,}"
    if not isinstance(files, dict) or not all(_valid_record(r) for r in files.values()):
        return f"{STATE_FILE} has 'files' that is not a mapping of file names to sizes and SHA-256s"
    if raw["format"] not in ("full", "dcp", "deepspeed") or not isinstance(loader, (dict, type(None))):
        return f"{STATE_FILE} has a format or loader position that dlx does not write"
    return None


def _valid_record(record: Any) -> bool:
    if type(record) is int:  # written before the SHA-256s
        return record >= 0
    if not isinstance(record, dict) or type(record.get("size")) is not int or record["size"] < 0:
        return False
    sha = record.get("sha256")
    return sha is None or (isinstance(sha, str) and len(sha) == 64)


def file_problem(folder: Path, name: str, record: int | dict[str, Any], checksums: bool = True) -> str | None:
    """What is wrong with one listed file (missing, outside the folder, another size, another SHA-256 unless not
    `checksums`), or None."""
    size, sha256 = (record, None) if isinstance(record, int) else (record["size"], record.get("sha256"))
    if Path(name).is_absolute() or ".." in Path(name).parts:
        return f"{STATE_FILE} lists {name}, outside the checkpoint"
    file = folder / name
    if not file.is_file():
        return f"{name} is missing"
    if file.stat().st_size != size:
        return f"{name} has {file.stat().st_size:,} bytes, {size:,} were written"
    if checksums and sha256 is not None and file_sha256(file) != sha256:
        return f"{name} has the recorded size but not the recorded SHA-256 (its bytes changed since the save)"
    return None
