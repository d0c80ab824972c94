"""Object storage: every `s3://`, `gs://` and `hf://` path dlx reads or writes goes through this module.

The filesystems are fsspec's (s3fs, gcsfs, huggingface_hub: the `storage` extra), configured as each one's own
environment and config files say (`AWS_ENDPOINT_URL`, `AWS_PROFILE`, `GOOGLE_APPLICATION_CREDENTIALS`, `HF_TOKEN`, ...).
Their own retries are turned off; every call here retries throttling (HTTP 503 SlowDown) and dropped connections with
exponential backoff for at most `DLX_STORAGE_RETRY_S` seconds in total (60 by default), then raises `UserError` with
one line naming the object. A missing object is `FileNotFoundError`; missing credentials or a missing bucket are a
`UserError` from `check_access`, which callers run before they start work.

Object stores have no rename. What must be whole or absent is published by writing its parts first and a small object
last (a manifest, a completion marker) that readers look for before they read the parts. Downloads land in a temporary
file beside their target, are hashed while they stream, and are renamed into place only when whole (and, when a
checksum is given, matching it).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import random
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from dlx.atomic import fsync_dir, make_temp_file
from dlx.errors import UserError

SCHEMES = ("s3", "gs", "gcs", "hf")
"""URL schemes dlx reads and writes through fsspec."""
RETRY_ENV = "DLX_STORAGE_RETRY_S"
STAGING_ENV = "DLX_STAGING_DIR"
"""Seconds one operation may spend retrying throttling and dropped connections before it gives up."""
CHUNK = 8 << 20
"""Bytes read per request of a streamed download."""
_EXTRAS = {"s3": "s3fs", "gs": "gcsfs", "gcs": "gcsfs", "hf": "huggingface_hub"}
_TRANSIENT_WORDS = (
    "slowdown",
    "slow down",
    "503",
    "service unavailable",
    "throttl",
    "reduce your request rate",
    "connection",
    "timeout",
    "timed out",
)
_filesystems: dict[tuple, object] = {}

T = TypeVar("T")


def staging_root() -> Path:
    """The local folder under which URL inputs, `--out` URLs and bucket run folders are staged:
    `$DLX_STAGING_DIR`, else `$XDG_CACHE_HOME/dlx/staging` (`~/.cache/dlx/staging`)."""
    if os.environ.get(STAGING_ENV):
        return Path(os.environ[STAGING_ENV])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "dlx" / "staging"


_STAGED: dict[str, str] = {}


def stage_as(local: str | os.PathLike, url: str) -> None:
    """From now on, messages (`shown`) name `url` where they would name `local`, its staging folder."""
    _STAGED[str(local).rstrip("/")] = url.rstrip("/")


def shown(text: str) -> str:
    """`text` as the user reads it: every staging folder registered with `stage_as` replaced by its URL, except where
    the text names it as one (`staging folder PATH`, `staged in PATH`, `cache folder PATH`: on this machine only)."""
    for local in sorted(_STAGED, key=len, reverse=True):
        pattern = rf"(?<!staging folder )(?<!staged in )(?<!cache folder ){re.escape(local)}"
        text = re.sub(pattern, _STAGED[local], text)
    return text


def is_url(path: str | os.PathLike) -> bool:
    """True for `s3://...`, `gs://...`, `gcs://...` and `hf://...`."""
    scheme, sep, _ = str(path).partition("://")
    return bool(sep) and scheme in SCHEMES


def join(url: str, *names: str) -> str:
    """`url/name/...` with one slash between parts."""
    return "/".join([url.rstrip("/"), *(n.strip("/") for n in names)])


def basename(url: str) -> str:
    """The last part of a URL's path: `s3://b/data/web/` → `web`."""
    return url.rstrip("/").rsplit("/", 1)[-1]


def filesystem(url: str):
    """The fsspec filesystem for the URL's scheme, its own retries off (this module retries), one per scheme and
    endpoint."""
    scheme = url.partition("://")[0]
    key = (scheme, os.environ.get("AWS_ENDPOINT_URL"), os.environ.get("AWS_ACCESS_KEY_ID"))
    if key not in _filesystems:
        try:
            import fsspec

            options = (
                {"config_kwargs": {"retries": {"total_max_attempts": 1, "mode": "standard"}}} if scheme == "s3" else {}
            )
            fs = fsspec.filesystem(scheme, skip_instance_cache=True, **options)
            fs.retries = 1  # s3fs's own retry count (a class attribute); gcsfs and hf ignore it
            _filesystems[key] = fs
        except ImportError:
            raise UserError(f"{url}: reading {scheme}:// needs {_EXTRAS[scheme]}; pip install 'dlx[storage]'") from None
    return _filesystems[key]


def _is_transient(error: BaseException) -> bool:
    if isinstance(error, (FileNotFoundError, PermissionError, UserError)):
        return False
    if isinstance(error, (ConnectionError, TimeoutError)):
        return True
    text = f"{type(error).__name__} {error}".lower()
    return any(word in text for word in _TRANSIENT_WORDS)  # botocore's and aiohttp's own classes, by what they say


def retry_budget_s() -> float:
    return float(os.environ.get(RETRY_ENV, "60"))


def with_retries(what: str, call: Callable[[], T]) -> T:
    """`call()`, retried on throttling and dropped connections with exponential backoff (0.05 s doubling to 5 s,
    jittered) for at most `retry_budget_s()` in total; then UserError naming `what`."""
    deadline, delay, tries = time.monotonic() + retry_budget_s(), 0.05, 0
    while True:
        tries += 1
        try:
            return call()
        except Exception as error:
            if not _is_transient(error):
                raise
            wait = min(delay * (0.5 + random.random()), max(0.0, deadline - time.monotonic()))
            if wait <= 0:
                reason = str(error).splitlines()[0][:120] if str(error) else type(error).__name__
                raise UserError(
                    f"object storage: {what}: gave up after {tries} tries in {retry_budget_s():.0f} s ({reason}); "
                    f"check the endpoint and try again (raise {RETRY_ENV} to wait longer)"
                ) from None
            time.sleep(wait)
            delay = min(delay * 2, 5.0)


def check_access(url: str, key: str = "path") -> None:
    """UserError in one line when the URL's bucket is missing or the credentials do not reach it (`key` names the
    option in the message)."""
    fs = filesystem(url)
    bucket = url.partition("://")[2].split("/", 1)[0]
    try:
        with_retries(url, lambda: fs.ls(f"{bucket}/", detail=False))
    except FileNotFoundError:
        raise UserError(f"{key} {url}: bucket {bucket} does not exist; create it or fix the URL") from None
    except PermissionError as e:
        raise UserError(
            f"{key} {url}: access to bucket {bucket} denied ({_first_line(e)}); check the credentials"
        ) from None
    except UserError:
        raise
    except Exception as e:
        raise UserError(
            f"{key} {url}: cannot reach bucket {bucket} ({_first_line(e)}); check the credentials and endpoint"
        ) from None


def _first_line(error: BaseException) -> str:
    return (str(error).splitlines() or [type(error).__name__])[0][:160]


def exists(url: str) -> bool:
    fs = filesystem(url)
    return with_retries(url, lambda: fs.exists(url))


def read_bytes(url: str) -> bytes:
    """The whole object; FileNotFoundError when it is absent."""
    fs = filesystem(url)
    return with_retries(url, lambda: fs.cat_file(url))


def write_bytes(url: str, data: bytes) -> None:
    """One object written whole (a single PUT for small data: readers see the old object or the new one)."""
    fs = filesystem(url)
    with_retries(url, lambda: fs.pipe_file(url, data))


def listdir(url: str) -> list[str]:
    """Names directly under the URL's folder (objects and prefixes); empty when there are none."""
    fs = filesystem(url)
    try:
        entries = with_retries(url, lambda: fs.ls(url, detail=False, refresh=True))
    except FileNotFoundError:
        return []
    return sorted(basename(e) for e in entries if e.rstrip("/") != url.partition("://")[2].rstrip("/"))


def remove(url: str, recursive: bool = False) -> None:
    fs = filesystem(url)
    with contextlib.suppress(FileNotFoundError):
        with_retries(url, lambda: fs.rm(url, recursive=recursive))


def size_of(url: str) -> int | None:
    """The object's size in bytes; None when there is no such object."""
    fs = filesystem(url)
    try:
        return int(with_retries(url, lambda: fs.size(url)))
    except FileNotFoundError:
        return None


def sha256_object(url: str) -> str:
    """Hex SHA-256 of an object's bytes, streamed (nothing is written locally)."""
    fs = filesystem(url)

    def attempt() -> str:
        digest = hashlib.sha256()
        with fs.open(url, "rb", block_size=CHUNK, cache_type="none") as src:
            while block := src.read(CHUNK):
                digest.update(block)
        return digest.hexdigest()

    return with_retries(url, attempt)


def upload(local: str | os.PathLike, url: str) -> None:
    """One local file to one object."""
    fs = filesystem(url)
    with_retries(url, lambda: fs.put_file(str(local), url))


def upload_tree(local: str | os.PathLike, url: str) -> list[str]:
    """Every file under a local folder to the same relative names under `url`, in sorted order; returns the names."""
    root = Path(local)
    names = sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())
    for name in names:
        upload(root / name, join(url, name))
    return names


def download(url: str, target: str | os.PathLike, sha256: str | None = None, size: int | None = None) -> int:
    """The object into `target`, whole or not at all: streamed into a temporary file beside it, hashed on the way, and
    renamed into place only when its size (given, else the object's own) and SHA-256 (when given) match. A short
    stream is retried; a checksum mismatch is a UserError naming the object; nothing is left behind. Returns the bytes
    downloaded (a retried attempt counts again)."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    fs, counted = filesystem(url), [0]
    if size is None:  # a stream cut short can end like a whole one: the object's own size tells them apart
        size = int(with_retries(url, lambda: fs.size(url)))

    def attempt() -> str:
        fd, tmp = make_temp_file(target)
        digest = hashlib.sha256()
        try:
            with os.fdopen(fd, "wb") as out, fs.open(url, "rb", block_size=CHUNK, cache_type="none") as src:
                while block := src.read(CHUNK):
                    counted[0] += len(block)
                    digest.update(block)
                    out.write(block)
            return tmp if _matches(url, tmp, digest.hexdigest(), sha256, size) else ""
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise

    tmp = with_retries(url, attempt)
    os.replace(tmp, target)
    fsync_dir(target.parent)
    return counted[0]


def _matches(url: str, tmp: str, digest: str, sha256: str | None, size: int | None) -> bool:
    actual = os.path.getsize(tmp)
    if size is not None and actual != size:
        raise ConnectionError(f"{url}: {actual} of {size} bytes arrived")  # a dropped stream: retried
    if sha256 is not None and digest != sha256:
        os.unlink(tmp)
        raise UserError(
            f"{url} does not match the checksum in its manifest (the object changed after it was written); "
            "prepare the dataset again"
        )
    return True
