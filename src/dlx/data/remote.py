"""A prepared dataset in object storage, as the loader sees it: a local mirror folder with its manifest, the files
training reads besides the shards (`shards.TRAINING_FILES`: tokenizer.json, token_bytes.npy) and `remote.json` (the
URL), whose shards a `dlx.data.loader.cache.ShardCache` fetches as training needs them.

Everything that reads a dataset's manifest or tokenizer (checks, the run folder's tokenizer copy, evaluation) reads
the mirror as it reads a local dataset; only `TokenLoader` looks at `remote.json`.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from pydantic import ValidationError

from dlx.atomic import atomic_write_bytes, atomic_write_text
from dlx.data import storage
from dlx.data.shards import MANIFEST_FILE, TRAINING_FILES, DataFile, Manifest, sha256_file
from dlx.errors import UserError

REMOTE_FILE = "remote.json"


def default_cache_dir() -> Path:
    """`$XDG_CACHE_HOME/dlx/datasets`, else `~/.cache/dlx/datasets`."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "dlx" / "datasets"


def mirror_folder(url: str, cache_dir: str | Path) -> Path:
    """Where a dataset URL's mirror lives: its folder name and a hash of the URL."""
    digest = hashlib.sha256(url.rstrip("/").encode()).hexdigest()[:12]
    folder = Path(cache_dir or default_cache_dir()) / f"{storage.basename(url)}-{digest}"
    storage.stage_as(folder, url)
    return folder


def read_remote_manifest(url: str, key: str) -> tuple[bytes, Manifest]:
    """The bytes and the validated manifest of the dataset at `url`; UserError naming `key` and the URL when it is
    missing or damaged."""
    try:
        raw = storage.read_bytes(storage.join(url, MANIFEST_FILE))
    except FileNotFoundError:
        raise UserError(
            f"{key} {url} is not a prepared dataset ({MANIFEST_FILE} missing); run `dlx prepare` first"
        ) from None
    try:
        return raw, Manifest.model_validate(json.loads(raw))
    except (json.JSONDecodeError, ValidationError) as e:
        raise UserError(
            f"{key} {url}: {MANIFEST_FILE} is damaged ({str(e).splitlines()[0]}); run `dlx prepare` again"
        ) from None


def remote_problems(url: str, manifest: Manifest, hash_files: bool = True) -> list[str]:
    """Every problem of the files the manifest lists, in the bucket (missing, wrong size, and with `hash_files` a
    wrong SHA-256, streamed), one line each naming the file."""
    problems = []
    for entry in manifest.dataset_files():
        size = storage.size_of(storage.join(url, entry.name))
        if size is None:
            problems.append(f"{entry.name}: missing")
        elif entry.bytes is not None and size != entry.bytes:
            problems.append(f"{entry.name}: {size} bytes, expected {entry.bytes}")
        elif hash_files and storage.sha256_object(storage.join(url, entry.name)) != entry.sha256:
            problems.append(f"{entry.name}: checksum mismatch (the object changed after `dlx prepare` published it)")
    return problems


def mirror_dataset(url: str, cache_dir: str | Path, key: str = "data.path") -> Path:
    """The local mirror of a prepared dataset at `url`: its manifest (read now), tokenizer.json (checked against the
    manifest) and remote.json. UserError naming `key` and the URL when the bucket, the dataset or a file is missing."""
    storage.check_access(url, key)
    folder = mirror_folder(url, cache_dir)
    raw, manifest = read_remote_manifest(url, key)
    for name in TRAINING_FILES:
        entry = manifest.listed(name)
        if entry is not None:
            fetch_listed(url, folder, entry, key)
    atomic_write_bytes(folder / MANIFEST_FILE, raw)
    atomic_write_text(folder / REMOTE_FILE, json.dumps({"url": url.rstrip("/")}) + "\n")
    return folder


def fetch_listed(url: str, folder: Path, entry: DataFile, key: str) -> Path:
    """One listed file of the dataset at `url` in `folder`, verified against its SHA-256 (kept when already there)."""
    target = folder / entry.name
    if target.is_file() and sha256_file(target) == entry.sha256:
        return target
    try:
        storage.download(storage.join(url, entry.name), target, entry.sha256, size=entry.bytes)
    except FileNotFoundError:
        raise UserError(f"{key} {url}: {entry.name} missing; run `dlx prepare` again") from None
    return target


def remote_origin(folder: str | Path) -> str | None:
    """The URL a mirror folder stands for; None for a local dataset."""
    path = Path(folder) / REMOTE_FILE
    return json.loads(path.read_text())["url"] if path.is_file() else None
