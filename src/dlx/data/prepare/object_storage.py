"""`dlx prepare` from and to object storage: URL inputs are downloaded into a local staging folder (whole files,
resumable), and an `--out` URL is prepared into a local staging folder, then published: every shard and the
tokenizer first, `manifest.json` last, so a reader of the bucket never sees a half-written dataset (object stores have
no rename; the manifest is what readers look for).

The staging folders live under `$XDG_CACHE_HOME/dlx` (`~/.cache/dlx`) unless `DLX_STAGING_DIR` says otherwise; a
killed prepare resumes from its staging folder like a local one, and a killed publish is redone by the same command.
"""

from __future__ import annotations

import glob
import hashlib
from pathlib import Path

from dlx.data import storage
from dlx.data.shards import MANIFEST_FILE, TOKENIZER_FILE, read_manifest
from dlx.data.storage import staging_root
from dlx.errors import UserError


def _key(url: str) -> str:
    return f"{storage.basename(url) or 'root'}-{hashlib.sha256(url.rstrip('/').encode()).hexdigest()[:12]}"


def out_staging(url: str) -> Path:
    """The local folder an `--out` URL is prepared in before it is published."""
    storage.check_access(url, "--out")
    return staging_root() / "out" / _key(url)


def local_inputs(inputs: list[str] | None) -> list[str] | None:
    """The inputs with every URL (a file, a folder, a glob) replaced by a local copy of what it names."""
    if not inputs:
        return inputs
    return [_download_input(spec) if storage.is_url(spec) else spec for spec in inputs]


def _download_input(spec: str) -> str:
    storage.check_access(spec, "input")
    fs = storage.filesystem(spec)
    scheme = spec.partition("://")[0]
    magic = glob.has_magic(spec)
    base = spec[: spec.index(next(c for c in spec if c in "*?["))].rsplit("/", 1)[0] if magic else spec
    matches = storage.with_retries(spec, lambda: fs.glob(spec)) if magic else [spec]
    files: list[str] = []
    for match in matches:
        if storage.with_retries(match, lambda m=match: fs.isdir(m)):
            files += storage.with_retries(match, lambda m=match: fs.find(m))
        else:
            files.append(match)
    if not files:
        raise UserError(f"input {spec}: no such object (or the glob matches nothing)")
    root = staging_root() / "inputs" / _key(base)
    prefix = base.partition("://")[2].rstrip("/")
    names = sorted(f.partition("://")[2] if "://" in f else f for f in files)
    single = not magic and names == [prefix]  # the URL names one object
    for name in names:
        relative = Path(name).name if single else name[len(prefix) :].lstrip("/")
        size = storage.with_retries(name, lambda n=name: fs.size(f"{scheme}://{n}"))
        target = root / relative
        if not (target.is_file() and target.stat().st_size == size):  # a finished copy of an earlier run is kept
            storage.download(f"{scheme}://{name}", target, size=size)
    if magic:
        return str(root / spec[len(base) :].lstrip("/"))
    return str(root / Path(prefix).name) if single else str(root)


def publish(staging: Path, url: str) -> None:
    """A complete staged dataset into `url`: shards and tokenizer.json, then manifest.json last."""
    manifest = read_manifest(staging)
    if not manifest.complete:
        raise UserError(f"{staging} is not complete; run the same `dlx prepare` again to finish it before publishing")
    for name in [s.name for s in manifest.shards] + [TOKENIZER_FILE]:
        storage.upload(staging / name, storage.join(url, name))
    storage.upload(staging / MANIFEST_FILE, storage.join(url, MANIFEST_FILE))
