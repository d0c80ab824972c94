"""The --out folder: is it new, finished, resumable, or someone else's? The lock that keeps two runs apart, and the
manifest writes that start a dataset and commit its shards."""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

from dlx.atomic import atomic_write_bytes, atomic_write_text
from dlx.data.shards import (
    MANIFEST_FILE,
    SPLITS,
    TOKEN_BYTES_FILE,
    TOKENIZER_FILE,
    Manifest,
    ShardInfo,
    describe_file,
    read_manifest,
    token_dtype,
    write_manifest,
)
from dlx.data.token_bytes import write_token_bytes
from dlx.errors import UserError

WORK_DIR = ".work"
TASKS_DIR = ".tasks"
_OURS = re.compile(
    r"^(manifest\.json|tokenizer\.json|token_bytes\.npy|(train|val)-\d+\.bin(\.partial)?|\..+\.tmp|\.work|\.tasks|"
    r"curation\.md|curation-drops\.npy|curation-verdicts\.npy|curation-removed\.jsonl)$"
)
_SHARD_FILE = re.compile(r"^(train|val)-\d+\.bin(\.partial)?$")


def existing_dataset(out: Path, request: dict, tokenizer_sha256: str | None) -> Manifest | None:
    """The manifest of a dataset in `out` made by the same request (to resume or skip), None for a fresh start.

    A folder that holds another tokenizer's shards, a dataset made from other inputs or options, or files that
    prepare did not write raises UserError before anything is written.
    """
    if not out.exists():
        return None
    if not out.is_dir():
        raise UserError(f"--out {out} is a file, not a folder")
    if not (out / MANIFEST_FILE).exists():
        foreign = sorted(p.name for p in out.iterdir() if not _OURS.match(p.name))
        if foreign:
            raise UserError(
                f"--out {out} is not empty and not a dlx dataset (it holds {', '.join(foreign[:3])}); "
                "choose a new folder"
            )
        return None
    manifest = read_manifest(out)
    recorded = manifest.source.get("request", {})
    if tokenizer_sha256 is not None and manifest.tokenizer_sha256 != tokenizer_sha256:
        raise UserError(
            f"--out {out} holds shards made with another tokenizer (sha256 "
            f"{manifest.tokenizer_sha256[:12]}, yours {tokenizer_sha256[:12]}); choose a new --out or "
            f"delete {out}"
        )
    if tokenizer_sha256 == manifest.tokenizer_sha256:  # --tokenizer is the folder's own (its tokenizer.json, say)
        request = {**request, "tokenizer": recorded.get("tokenizer")}
    if recorded.get("tokenizer") != request["tokenizer"]:
        raise UserError(
            f"--out {out} holds shards made with another tokenizer ({_describe(recorded.get('tokenizer'))}"
            f", not {_describe(request['tokenizer'])}); choose a new --out or delete {out}"
        )
    labels = {"fingerprint": "inputs", "files": "inputs", "bytes": "inputs"}
    differ = sorted({labels.get(k, k) for k in request.keys() | recorded.keys() if request.get(k) != recorded.get(k)})
    if differ:
        raise UserError(
            f"--out {out} holds a dataset prepared from other inputs or options (differs in: "
            f"{', '.join(differ)}); choose a new --out or delete {out}"
        )
    return manifest


def _describe(tokenizer: dict | None) -> str:
    if tokenizer and tokenizer.get("train_vocab_size"):
        return f"a {tokenizer['train_vocab_size']}-token BPE trained by prepare"
    return "a tokenizer.json given with --tokenizer"


@contextlib.contextmanager
def locked(folder: Path, note: Callable[[str], None], busy: str | None = None) -> Iterator[None]:
    """An exclusive lock on the folder itself, released by the kernel if this process dies (even by SIGKILL).

    A second run waits for the first (every rank of a job may call prepare: one works, the others then find the
    finished dataset), or, given `busy`, raises UserError(busy) at once.
    """
    fd = os.open(folder, os.O_RDONLY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if busy is not None:
                raise UserError(busy) from None
            note(f"waiting for another `dlx prepare` that is writing {folder}")
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def clear_work(out: Path) -> None:
    """Remove spools of an earlier run (a killed run's leftover workers exit on their own within a second)."""
    shutil.rmtree(out / WORK_DIR, ignore_errors=True)


def clear_fresh(out: Path) -> None:
    """Remove what a run killed before its first manifest left behind (all of it prepare's own files)."""
    clear_work(out)
    for p in out.iterdir():
        if _OURS.match(p.name) and p.is_file():
            p.unlink()


def remove_strays(out: Path, keep: set[str]) -> None:
    """Delete shard files (finished or partial) not named in `keep`, and temporary files of interrupted writes."""
    for p in out.iterdir():
        if (_SHARD_FILE.match(p.name) and p.name not in keep) or (re.match(r"^\..+\.tmp$", p.name) and p.is_file()):
            p.unlink()


def start_dataset(
    out: Path,
    source: dict,
    tokenizer_json: str,
    tokenizer_sha256: str,
    vocab_size: int,
    eos_id: int,
    bos_id: int | None,
    extra: dict[str, bytes] | None = None,
    work: dict[str, bytes] | None = None,
) -> Manifest:
    """The first writes of a dataset: tokenizer.json, token_bytes.npy and the `extra` files, then a manifest without
    shards that lists them (`source` holds the resume). `work` files are written too but are not the dataset's (the
    encode pass reads them, then deletes them): the manifest does not list them."""
    clear_fresh(out)
    for name, data in {**(extra or {}), **(work or {})}.items():
        atomic_write_bytes(out / name, data)
    atomic_write_text(out / TOKENIZER_FILE, tokenizer_json)
    token_bytes_sha256 = write_token_bytes(out, tokenizer_json)  # bytes per token id: bits per byte in evaluation
    names = [TOKENIZER_FILE, *([TOKEN_BYTES_FILE] if token_bytes_sha256 else []), *(extra or {})]
    manifest = Manifest(
        dtype=token_dtype(vocab_size),
        vocab_size=vocab_size,
        eos_id=eos_id,
        bos_id=bos_id,
        tokenizer_sha256=tokenizer_sha256,
        token_bytes_sha256=token_bytes_sha256,
        files=[describe_file(out, name) for name in names],
        source=source,
    )
    write_manifest(out, manifest)
    return manifest


def commit_shards(out: Path, manifest: Manifest, finished: list[ShardInfo], resume: dict | None) -> Manifest:
    """Write the manifest that also lists `finished` (already fsynced in place); `resume` None marks it complete."""
    shards = sorted([*manifest.shards, *finished], key=lambda s: (SPLITS.index(s.split), s.name))
    source = {k: v for k, v in manifest.source.items() if k != "resume"}
    if resume is not None:
        source["resume"] = resume
    manifest = manifest.model_copy(update={"shards": shards, "source": source, "complete": resume is None})
    write_manifest(out, manifest)
    return manifest
