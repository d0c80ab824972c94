"""`dlx prepare` from and to object storage: URL inputs are downloaded into a local staging folder (whole files,
resumable), and an `--out` URL is prepared into a local staging folder, then published: every file the manifest
lists first, `manifest.json` last, so a reader of the bucket never sees a half-written dataset (object stores have
no rename; the manifest is what readers look for).

The staging folders live under `$XDG_CACHE_HOME/dlx` (`~/.cache/dlx`) unless `DLX_STAGING_DIR` says otherwise; a
killed prepare resumes from its staging folder like a local one, and a killed publish is redone by the same command.
"""

from __future__ import annotations

import glob
import hashlib
from pathlib import Path

from dlx.data import storage
from dlx.data.shards import MANIFEST_FILE, Manifest, read_manifest
from dlx.data.storage import staging_root
from dlx.errors import UserError


def _key(url: str) -> str:
    return f"{storage.basename(url) or 'root'}-{hashlib.sha256(url.rstrip('/').encode()).hexdigest()[:12]}"


def out_staging(url: str) -> Path:
    """The local folder an `--out` URL is prepared in before it is published."""
    storage.check_access(url, "--out")
    staging = staging_root() / "out" / _key(url)
    storage.stage_as(staging, url)
    return staging


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


def published_manifest(url: str) -> bytes | None:
    """The manifest.json bytes of a dataset already published at `url`; None when there is none."""
    try:
        return storage.read_bytes(storage.join(url, MANIFEST_FILE))
    except FileNotFoundError:
        return None


def refuse_overwrite(staging: Path, url: str, overwrite: bool) -> None:
    """A published dataset whose staging folder is gone (another machine, a cleaned cache) is replaced only when
    asked: this machine cannot tell whether it was made from the same inputs and options."""
    if overwrite or (staging / MANIFEST_FILE).is_file() or published_manifest(url) is None:
        return
    raise UserError(
        f"--out {url} already holds a published dataset that this machine did not prepare (no staging folder "
        f"{staging}); choose another --out, or add --overwrite to replace it"
    )


def publish(staging: Path, url: str) -> str:
    """A complete staged dataset into `url`: every file its manifest lists (`Manifest.dataset_files`), then
    manifest.json last, so a reader never sees a half-published dataset. An identical published manifest means
    nothing to do; a different one is taken down first, and files it named that the new one does not are removed
    after. Returns the line that says what was published."""
    manifest = read_manifest(staging)
    if not manifest.complete:
        raise UserError(f"{staging} is not complete; run the same `dlx prepare` again to finish it before publishing")
    ours = (staging / MANIFEST_FILE).read_bytes()
    theirs = published_manifest(url)
    if theirs == ours:
        return f"{url} already holds this dataset (staged in {staging}): nothing to publish"
    stale = _listed_names(theirs) - {entry.name for entry in manifest.dataset_files()}
    if theirs is not None:
        storage.remove(storage.join(url, MANIFEST_FILE))
    for entry in manifest.dataset_files():
        storage.upload(staging / entry.name, storage.join(url, entry.name))
    storage.upload(staging / MANIFEST_FILE, storage.join(url, MANIFEST_FILE))
    for name in sorted(stale):
        storage.remove(storage.join(url, name))
    size = sum(entry.bytes or 0 for entry in manifest.dataset_files())
    files = len(manifest.dataset_files()) + 1
    return f"prepared {staging} → published {url} ({files} files, {size / 1e6:,.1f} MB)"


def _listed_names(raw: bytes | None) -> set[str]:
    """The file names a published manifest lists (none when there is none or it cannot be read)."""
    if raw is None:
        return set()
    try:
        return {entry.name for entry in Manifest.model_validate_json(raw).dataset_files()}
    except ValueError:
        return set()
