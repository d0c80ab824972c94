"""A prepared dataset in object storage, as the loader sees it: a local mirror folder with its manifest, tokenizer and
`remote.json` (the URL), whose shards a `dlx.data.loader.cache.ShardCache` fetches as training needs them.

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
from dlx.data.shards import MANIFEST_FILE, TOKENIZER_FILE, Manifest, sha256_file
from dlx.errors import UserError

REMOTE_FILE = "remote.json"


def default_cache_dir() -> Path:
    """`$XDG_CACHE_HOME/dlx/datasets`, else `~/.cache/dlx/datasets`."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "dlx" / "datasets"


def mirror_folder(url: str, cache_dir: str | Path) -> Path:
    """Where a dataset URL's mirror lives: its folder name and a hash of the URL."""
    digest = hashlib.sha256(url.rstrip("/").encode()).hexdigest()[:12]
    return Path(cache_dir or default_cache_dir()) / f"{storage.basename(url)}-{digest}"


def mirror_dataset(url: str, cache_dir: str | Path, key: str = "data.path") -> Path:
    """The local mirror of a prepared dataset at `url`: its manifest (read now), tokenizer.json (checked against the
    manifest) and remote.json. UserError naming `key` and the URL when the bucket, the dataset or a file is missing."""
    storage.check_access(url, key)
    folder = mirror_folder(url, cache_dir)
    try:
        raw = storage.read_bytes(storage.join(url, MANIFEST_FILE))
    except FileNotFoundError:
        raise UserError(
            f"{key} {url} is not a prepared dataset ({MANIFEST_FILE} missing); run `dlx prepare` first"
        ) from None
    try:
        manifest = Manifest.model_validate(json.loads(raw))
    except (json.JSONDecodeError, ValidationError) as e:
        raise UserError(
            f"{key} {url}: {MANIFEST_FILE} is damaged ({str(e).splitlines()[0]}); run `dlx prepare` again"
        ) from None
    tokenizer = folder / TOKENIZER_FILE
    if not tokenizer.is_file() or sha256_file(tokenizer) != manifest.tokenizer_sha256:
        try:
            storage.download(storage.join(url, TOKENIZER_FILE), tokenizer, manifest.tokenizer_sha256)
        except FileNotFoundError:
            raise UserError(f"{key} {url}: {TOKENIZER_FILE} missing; run `dlx prepare` again") from None
    atomic_write_bytes(folder / MANIFEST_FILE, raw)
    atomic_write_text(folder / REMOTE_FILE, json.dumps({"url": url.rstrip("/")}) + "\n")
    return folder


def remote_origin(folder: str | Path) -> str | None:
    """The URL a mirror folder stands for; None for a local dataset."""
    path = Path(folder) / REMOTE_FILE
    return json.loads(path.read_text())["url"] if path.is_file() else None
