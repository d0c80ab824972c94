"""A run folder in object storage (`--run-dir s3://...`, gs://, hf://): the run trains in a local staging folder as
it would in any run folder, and `RunSync` uploads it.

    URL/config.yaml, tokenizer.json, metrics.jsonl, ...     the run folder's top-level files, sent whole when changed
    URL/checkpoints/step-00000100/...                       a checkpoint's files, uploaded once it is published locally
    URL/checkpoints/step-00000100/COMPLETE                  written last: the checkpoint is whole

A checkpoint without `COMPLETE` (an upload cut short by a kill) is never read. `pull_run` makes a fresh machine's
staging folder a copy of the run's top-level files and its newest complete checkpoint, so `--resume` and
`--resume auto` continue from the bucket; `pull_checkpoint` does the same for `dlx export-hf` and `dlx eval`.
A checkpoint pruned locally (`checkpoint.keep_last`) is removed from the bucket too, its marker first.

Only the process of rank 0 (RANK unset or 0) uploads; the staging folder is on that machine, so a run in a bucket is
single-node (every rank writes its DCP shards into the same staging folder).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import threading
from pathlib import Path

from dlx.data import storage
from dlx.data.storage import staging_root
from dlx.errors import UserError
from dlx.train.rundir.checkpoint import CHECKPOINTS_DIR, list_checkpoints
from dlx.train.rundir.folder import RUN_CONFIG_FILE

MARKER = "COMPLETE"
"""The object written last into a checkpoint's prefix in the bucket."""
SYNC_EVERY_S = 5.0


def staging_dir(url: str) -> Path:
    """The local folder a run URL trains in; messages name the URL instead (`storage.shown`)."""
    digest = hashlib.sha256(url.rstrip("/").encode()).hexdigest()[:12]
    staging = staging_root() / "runs" / f"{storage.basename(url)}-{digest}"
    storage.stage_as(staging, url)
    return staging


def complete_checkpoints(url: str) -> list[str]:
    """Names of the checkpoints in the bucket whose marker exists, newest first."""
    names = [n for n in storage.listdir(storage.join(url, CHECKPOINTS_DIR)) if n.startswith("step-")]
    return [n for n in sorted(names, reverse=True) if storage.exists(storage.join(url, CHECKPOINTS_DIR, n, MARKER))]


def _download_prefix(url: str, local: Path) -> None:
    fs = storage.filesystem(url)
    scheme = url.partition("://")[0]
    prefix = url.partition("://")[2].rstrip("/")
    for name in storage.with_retries(url, lambda: fs.find(prefix)):
        relative = name[len(prefix) :].lstrip("/")
        if relative and relative != MARKER:
            storage.download(f"{scheme}://{name}", local / relative)


def pull_checkpoint(url: str, staging: Path, name: str) -> Path:
    """The bucket's checkpoint `name` in `staging/checkpoints/name`, downloaded whole (a temporary folder first)."""
    target = staging / CHECKPOINTS_DIR / name
    if target.is_dir():
        return target
    tmp = staging / CHECKPOINTS_DIR / f".{name}.download"
    shutil.rmtree(tmp, ignore_errors=True)
    _download_prefix(storage.join(url, CHECKPOINTS_DIR, name), tmp)
    tmp.rename(target)
    return target


def pull_run(url: str, key: str = "--run-dir") -> Path:
    """The local staging folder of a run URL holding its top-level files and its newest complete checkpoint; an empty
    staging folder when the bucket holds no run yet."""
    storage.check_access(url, key)
    staging = staging_dir(url)
    if not storage.exists(storage.join(url, RUN_CONFIG_FILE)):
        shutil.rmtree(staging, ignore_errors=True)  # what a run never uploaded is not a run to continue
        return staging
    staging.mkdir(parents=True, exist_ok=True)
    for name in storage.listdir(url):
        if name != CHECKPOINTS_DIR and storage.exists(storage.join(url, name)) and "." in name:
            storage.download(storage.join(url, name), staging / name)
    complete = complete_checkpoints(url)
    (staging / CHECKPOINTS_DIR).mkdir(exist_ok=True)
    for local in list_checkpoints(staging):  # newer local ones never reached the bucket: the bucket's run wins, as
        if not complete or local.name > complete[0]:  # its metrics.jsonl, just downloaded, ends where they began
            shutil.rmtree(local)
    if complete:
        pull_checkpoint(url, staging, complete[0])
    return staging


def pull_source(path: str, role: str) -> str:
    """For `dlx export-hf` and `dlx eval`: a run URL becomes a local folder holding its newest complete checkpoint,
    a checkpoint URL (…/checkpoints/step-N) that checkpoint; a local path is returned as it is."""
    if not storage.is_url(path):
        return path
    storage.check_access(path, role)
    head, _, name = path.rstrip("/").rpartition("/")
    if name.startswith("step-") and head.endswith(f"/{CHECKPOINTS_DIR}"):
        if not storage.exists(storage.join(path, MARKER)):
            raise UserError(f"{role} {path}: the checkpoint is incomplete (no {MARKER} marker); give an earlier one")
        return str(pull_checkpoint(head.rpartition("/")[0], staging_dir(head.rpartition("/")[0]), name))
    complete = complete_checkpoints(path)
    if not complete:
        raise UserError(f"{role} {path} holds no complete checkpoint; give a run folder that saved one")
    return str(pull_checkpoint(path, staging_dir(path), complete[0]))


class RunSync:
    """Uploads a staging run folder to its URL every few seconds from a background thread and once more on exit.

    The top-level files go first and again after each checkpoint (a checkpoint's upload can take minutes), each one
    only when its size or mtime changed since it was last sent, and only as a whole file: one read between two equal
    `stat`s, and an appended `.jsonl` up to its last complete line."""

    def __init__(self, url: str, staging: Path, every_s: float = SYNC_EVERY_S):
        self.url, self.staging, self.every_s = url, staging, every_s
        self.uploaded = set(complete_checkpoints(url)) if storage.exists(url) else set()
        self.sent: dict[str, tuple[int, int]] = {}
        """Top-level file name -> (size, mtime in ns) of the copy in the bucket."""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self.failure: BaseException | None = None

    def __enter__(self) -> RunSync:
        if os.environ.get("RANK", "0") == "0":
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if not self._thread.is_alive():
            return
        self._stop.set()
        self._thread.join()
        self.sync()  # the last checkpoint and the final files

    def _loop(self) -> None:
        while not self._stop.wait(self.every_s):
            try:
                self.sync()
            except Exception as e:  # retried at the next sync; the final one raises
                self.failure = e

    def sync(self) -> None:
        """The changed top-level files, then each checkpoint not uploaded yet (marker last) with the files again after
        it, then the removal of pruned ones."""
        self.sync_files()
        local = {p.name: p for p in list_checkpoints(self.staging)}
        for name in sorted(set(local) - self.uploaded):
            storage.upload_tree(local[name], storage.join(self.url, CHECKPOINTS_DIR, name))
            storage.write_bytes(storage.join(self.url, CHECKPOINTS_DIR, name, MARKER), b"")
            self.uploaded.add(name)
            self.sync_files()
        for name in sorted(self.uploaded - set(local)):
            storage.remove(storage.join(self.url, CHECKPOINTS_DIR, name, MARKER))
            storage.remove(storage.join(self.url, CHECKPOINTS_DIR, name), recursive=True)
            self.uploaded.discard(name)

    def sync_files(self) -> None:
        """Each top-level file whose size or mtime changed since it was sent, as one whole object."""
        for path in top_level_files(self.staging):
            stamp = file_stamp(path)
            if stamp is None or self.sent.get(path.name) == stamp:
                continue
            data = whole_copy(path, stamp)
            if data is not None:  # else it changed while read: the next sync sends it
                storage.write_bytes(storage.join(self.url, path.name), data)
                self.sent[path.name] = stamp


def top_level_files(staging: Path) -> list[Path]:
    """The run folder's own files: not its temporary files (`.NAME.XXXX.tmp`), not the writer's lock."""
    if not staging.is_dir():
        return []
    return sorted(
        p for p in staging.iterdir() if p.is_file() and not p.name.startswith(".") and not p.name.endswith(".lock")
    )


def file_stamp(path: Path) -> tuple[int, int] | None:
    try:
        stat = path.stat()
    except FileNotFoundError:
        return None
    return stat.st_size, stat.st_mtime_ns


def whole_copy(path: Path, stamp: tuple[int, int]) -> bytes | None:
    """The file's bytes when it did not change while they were read, an appended `.jsonl` cut after its last complete
    line (a record being written is sent at the next sync); None when it changed."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    if file_stamp(path) != stamp or len(data) != stamp[0]:
        return None
    if path.suffix == ".jsonl":
        return data[: data.rfind(b"\n") + 1]
    return data
