"""A run folder in object storage (`--run-dir s3://...`, gs://, hf://): the run trains in a local staging folder as
it would in any run folder, and `RunSync` uploads it.

    URL/config.yaml, tokenizer.json, metrics.jsonl, ...     the run folder's top-level files, sent whole when changed
    URL/checkpoints/step-00000100/...                       a checkpoint's files, uploaded once it is published locally
    URL/checkpoints/step-00000100/COMPLETE                  written last: the checkpoint is whole

A checkpoint without `COMPLETE` (an upload cut short by a kill) is never read. `pull_run` makes a fresh machine's
staging folder a copy of the run's top-level files and its newest complete checkpoint, so `--resume` and
`--resume auto` continue from the bucket, unless this machine holds a newer verified checkpoint (then that one goes
up first); `pull_checkpoint` does the same for `dlx export-hf` and `dlx eval`. Uploading, one writer per run and
pruning in the bucket are `dlx.train.rundir.sync`'s.
"""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

from dlx.data import storage
from dlx.data.storage import staging_root
from dlx.errors import UserError
from dlx.train.rundir.checkpoint import CHECKPOINTS_DIR, DamagedCheckpoint, list_checkpoints, read_trainer_state
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


def pull_run(url: str, key: str = "--run-dir", say=print) -> Path:
    """The local staging folder of a run URL, ready to train in (its lock is held: `sync.bucket_run`). Nothing
    verified is discarded: when this machine holds a complete checkpoint whose files match their SHA-256s and that is
    newer than the bucket's newest complete one (the bucket was unreachable, or its upload never finished), the
    staging folder is kept as it is and uploaded before training goes on; otherwise it becomes a copy of the bucket's
    top-level files and newest complete checkpoint, or an empty folder when the bucket holds no run yet."""
    storage.check_access(url, key)
    staging = staging_dir(url)
    in_bucket = storage.exists(storage.join(url, RUN_CONFIG_FILE))
    bucket = complete_checkpoints(url) if in_bucket else []
    local = newest_verified(staging)
    if local is not None and (not bucket or local.name > bucket[0]):
        say(
            f"run folder {url}: this machine's staging folder {staging} holds checkpoint {local.name} (verified), "
            f"newer than the bucket's ({bucket[0] if bucket else 'none'}): it is uploaded before training goes on"
        )
        return staging
    if not in_bucket:
        shutil.rmtree(staging, ignore_errors=True)  # no run in the bucket, nothing verified here: a new run
        staging.mkdir(parents=True, exist_ok=True)
        return staging
    staging.mkdir(parents=True, exist_ok=True)
    for name in storage.listdir(url):
        if name != CHECKPOINTS_DIR and storage.exists(storage.join(url, name)) and "." in name:
            storage.download(storage.join(url, name), staging / name)
    (staging / CHECKPOINTS_DIR).mkdir(exist_ok=True)
    if bucket:
        pull_checkpoint(url, staging, bucket[0])
    return staging


def newest_verified(staging: Path) -> Path | None:
    """The newest checkpoint of a staging run folder whose files all match their recorded sizes and SHA-256s."""
    if not (staging / RUN_CONFIG_FILE).is_file():
        return None
    for path in list_checkpoints(staging):
        try:
            read_trainer_state(path)
        except DamagedCheckpoint:
            continue
        return path
    return None


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
