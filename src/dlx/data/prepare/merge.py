"""The merge of a prepare split into tasks: once every task is done, write the shards and the manifest that a
one-machine `dlx prepare` of the same inputs and options writes, byte for byte, whatever the number of tasks.

The tasks' counts, folded in task (and so unit) order, give the very scan record and validation threshold of the
one-machine scan. Each part's document table then says how many of its tokens go to train and to val, which lays out
both split streams: shard k of a split is tokens [k·shard_tokens, (k+1)·shard_tokens) of its stream, copied from the
few parts it spans. Shards are independent jobs for the worker pool; each is written, fsynced, hashed and renamed into
place by its worker, and the manifest lists it at the next commit (at most every COMMIT_SECONDS). A killed merge
resumes with the shards its manifest does not list. A second merge of the same folder is refused while one runs; the
task folders are deleted (by the workers, in parallel) once the manifest is complete.
"""

from __future__ import annotations

import bisect
import contextlib
import hashlib
import itertools
import math
import os
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dlx.data.curate.stages import signature_dtype
from dlx.data.pool import InlinePool, WorkerPool, make_pool
from dlx.data.prepare.curation import DropIndex, read_drops, report_files
from dlx.data.prepare.encode import COMMIT_SECONDS
from dlx.data.prepare.options import default_workers
from dlx.data.prepare.outdir import TASKS_DIR, commit_shards, locked, remove_strays, start_dataset
from dlx.data.prepare.parts import copy_split, part_names, split_tokens
from dlx.data.prepare.pipeline import totals
from dlx.data.prepare.progress import PrepareProgress
from dlx.data.prepare.scan import HASH_SPACE, ScanCounts, ScanRule, finish_scan
from dlx.data.prepare.taskdir import TaskState, read_plan, read_state, task_folder, tasks_dir
from dlx.data.prepare.writer import ShardWriter
from dlx.data.shards import (
    MANIFEST_FILE,
    SPLITS,
    TOKENIZER_FILE,
    Manifest,
    ShardInfo,
    Split,
    read_manifest,
    shard_name,
)
from dlx.errors import UserError

MERGE_RESUME = {"merge": True}
"""The manifest's resume state while a merge runs: the shards it lists are done."""
MAX_LISTED = 10


def merge_tasks(out: str | Path, *, workers: int | None = None, progress: bool = True) -> Manifest:
    """Write the dataset from the parts of every task (see `dlx prepare --help`); returns the finished manifest."""
    out, ui, started = Path(out), PrepareProgress(progress), time.monotonic()
    if not out.is_dir():
        raise UserError(f"--out {out} does not exist; run `dlx prepare INPUTS --out {out} --tasks N --task-index I`")
    busy = f"another `dlx prepare` is writing {out} (a merge, or a run without --tasks); wait for it to end"
    with locked(out, ui.note, busy=busy):
        manifest = read_manifest(out) if (out / MANIFEST_FILE).exists() else None
        if manifest is not None and manifest.complete:
            shutil.rmtree(tasks_dir(out), ignore_errors=True)  # left by a merge killed after its last commit
            ui.note(f"{out} is already prepared ({totals(manifest)}); nothing to do")
            return manifest
        plan = read_plan(out)
        states = _finished_tasks(out, plan)
        if manifest is None:
            manifest = _start(out, plan, states, ui)
        elif manifest.source.get("resume") != MERGE_RESUME:
            raise UserError(f"--out {out} holds a one-machine prepare that did not finish; it cannot be merged")
        with make_pool(min(workers or default_workers(), max(plan["units"], 1))) as pool:
            manifest = _write_shards(pool, out, plan, manifest, ui)
            for _ in pool.imap(remove_files, _file_batches(tasks_dir(out)), 2 * pool.n_workers + 2):
                pass  # the parts, deleted in parallel (on many filesystems one unlink costs milliseconds)
        shutil.rmtree(tasks_dir(out))
    ui.note(f"merged {plan['tasks']} tasks into {out}: {totals(manifest)} in {time.monotonic() - started:.1f}s")
    return manifest


def _finished_tasks(out: Path, plan: dict) -> list[TaskState]:
    """Every task's state, in order; UserError naming the tasks that are not done, or a folder of no task."""
    n_tasks = plan["tasks"]
    strays = sorted(
        p.name
        for p in tasks_dir(out).iterdir()
        if p.is_dir() and p.name not in {f"task-{i:05d}" for i in range(n_tasks)}
    )
    if strays:
        raise UserError(
            f"{out}/{TASKS_DIR}/{strays[0]} is not a task of this prepare (it has {n_tasks} tasks, 0 … "
            f"{n_tasks - 1}); delete that folder"
        )
    states, missing = [], []
    for i in range(n_tasks):
        state = read_state(out, i, plan)
        if state is not None and state.done:
            states.append(state)
            continue
        first, end = plan["ranges"][i][:2]
        missing.append(f"{i} (" + (f"at unit {state.next_unit} of {first}–{end - 1})" if state else "not started)"))
    if missing:
        listed = ", ".join(missing[:MAX_LISTED]) + (
            f" and {len(missing) - MAX_LISTED} more" if len(missing) > MAX_LISTED else ""
        )
        raise UserError(
            f"{len(missing)} of {n_tasks} tasks are not done: {listed}; run them, then `dlx prepare --merge --out "
            f"{out}` again"
        )
    return states


def _start(out: Path, plan: dict, states: list[TaskState], ui: PrepareProgress) -> Manifest:
    """Fold the tasks' counts as the one-machine scan does, then write tokenizer.json and the first manifest."""
    val = plan["request"]["val"]
    summary = ScanCounts()
    for state in states:
        summary.add(state.counts, val.get("documents") or 0)
    dedup = plan["request"].get("curation", {}).get("dedup")
    if dedup:
        _deduplicate(out, plan, summary)
    finish_scan(summary, plan["request"]["files"], val.get("fraction"), val.get("documents"))
    if summary.bad:
        ui.note(f"warning: skipped {summary.bad} bad record(s) (--strict makes them fatal); the first:")
        for example in summary.bad_examples:
            ui.note(f"  {example}")
    tok = plan["tokenizer"]
    json_text = (tasks_dir(out) / TOKENIZER_FILE).read_bytes().decode("utf-8")
    if hashlib.sha256(json_text.encode("utf-8")).hexdigest() != tok["sha256"]:
        raise UserError(f"{tasks_dir(out) / TOKENIZER_FILE} was changed by hand; delete {out} and run the tasks again")
    source = {"inputs": plan["inputs"], "request": plan["request"], "scan": summary.record(), "resume": MERGE_RESUME}
    extra = None
    if "curation" in plan["request"]:
        extra = report_files(summary.curation, plan["request"], summary.drops, _audit_trail(out, plan, summary))
    return start_dataset(out, source, json_text, tok["sha256"], tok["vocab_size"], tok["eos_id"], tok["bos_id"], extra)


def _audit_trail(out: Path, plan: dict, summary: ScanCounts) -> bytes:
    """curation-removed.jsonl: the lines each unit's task wrote for the per-document stages, then the duplicates'."""
    parts = _PartFiles(out, plan)
    lines = []
    for unit in range(plan["units"]):
        path = Path(parts(unit)[0]).with_suffix(".rm")
        if path.is_file():
            lines.append(path.read_bytes())
    return b"".join(lines) + summary.duplicates


def _deduplicate(out: Path, plan: dict, summary: ScanCounts) -> None:
    """The global deduplication over the signature files of every unit, in unit order."""
    from dlx.data.curate.spec import CurateSpec

    request, dedup = plan["request"], plan["request"]["curation"]["dedup"]
    bands = dedup.get("bands", 0) if dedup["mode"] == "near" else 0
    parts, dtype = _PartFiles(out, plan), signature_dtype(bands)
    summary.signatures = [np.zeros(0, dtype)]
    for unit in range(plan["units"]):
        path = Path(parts(unit)[0]).with_suffix(".sig")
        if not path.is_file():
            task = path.parent
            raise UserError(f"{path} is missing; delete {task} and run task {int(task.name[5:])} again")
        summary.signatures.append(np.fromfile(path, dtype=dtype))
    labels = request["curation"].get("sources", [])
    spec = CurateSpec(dedup=dedup["mode"], bands=bands or 1, sources=tuple((label, "") for label in labels))
    val = request["val"]
    fraction = int((val.get("fraction") or 0) * HASH_SPACE)
    rule = ScanRule(request["text_field"], False, val.get("documents") or 0, fraction, spec, True)
    summary.deduplicate(rule)


@dataclass(frozen=True)
class ShardJob:
    folder: str
    split: Split
    index: int
    dtype: str
    shard_tokens: int
    eos_id: int
    threshold: int
    pieces: list[tuple[str, str, int, int, np.ndarray | None]]
    """(tokens file, documents file, first token of the split to take, tokens to take, ordinals of the documents
    deduplication removed) per part, in order."""


def count_part(job: tuple[str, str, int, np.ndarray | None]) -> tuple[int, int]:
    """(train, val) tokens of one part without its deduplicated documents (in a worker); UserError if it is missing."""
    tok, doc, threshold, dropped = job
    try:
        tokens = split_tokens(doc, threshold, dropped)
        os.stat(tok)
    except FileNotFoundError as e:
        task = Path(tok).parent
        raise UserError(
            f"{e.filename} is missing; delete {task} and run task {int(task.name.removeprefix('task-'))} again"
        ) from None
    return tokens["train"], tokens["val"]


def write_shard(job: ShardJob) -> ShardInfo:
    """Write one shard from its pieces (in a worker): fsynced, hashed and renamed to its final name."""
    writer = ShardWriter(Path(job.folder), job.split, job.dtype, job.shard_tokens, job.eos_id, index=job.index)
    dtype = np.dtype(job.dtype).newbyteorder("<")
    finished: list[ShardInfo] = []
    for tok, doc, skip, take, dropped in job.pieces:
        copied = copy_split(
            (tok, doc),
            job.threshold,
            job.split,
            dtype,
            lambda a: finished.extend(writer.write(a)),
            skip,
            take,
            dropped,
        )
        if copied != take:
            raise UserError(
                f"{tok} holds fewer tokens than its document table says; it was damaged after it was written"
            )
    finished += writer.close()
    return finished[0]


def _write_shards(
    pool: InlinePool | WorkerPool, out: Path, plan: dict, manifest: Manifest, ui: PrepareProgress
) -> Manifest:
    """Lay out both splits from the parts' document tables, then write the shards the manifest does not list yet."""
    threshold = manifest.source["scan"]["val_threshold"]
    parts = _PartFiles(out, plan)
    drops = DropIndex(read_drops(out) if plan["request"].get("curation", {}).get("dedup") else None)
    window = 2 * pool.n_workers + 2
    jobs = ((*parts(u), threshold, drops(u)) for u in range(plan["units"]))
    counts = np.array(list(pool.imap(count_part, jobs, window)), dtype=np.int64).reshape(-1, 2)  # (units, splits)
    remove_strays(out, {s.name for s in manifest.shards})
    itemsize = np.dtype(manifest.dtype).itemsize
    shard_tokens = plan["request"]["shard_tokens"]
    left = [(n, math.ceil(n / shard_tokens)) for n in counts.sum(axis=0).tolist()]  # (tokens, shards) per split
    todo = sum(k for _, k in left) - len(manifest.shards)
    left_bytes = (sum(n for n, _ in left) - sum(s.tokens for s in manifest.shards)) * itemsize
    ui.start("merge ", left_bytes, todo, show_tokens=True, count_label="shards")
    finished: list[ShardInfo] = []
    last_commit = time.monotonic()
    try:
        for info in pool.imap(write_shard, _shard_jobs(out, plan, manifest, parts, counts, threshold, drops), window):
            finished.append(info)
            if time.monotonic() - last_commit >= COMMIT_SECONDS:
                manifest, finished = commit_shards(out, manifest, finished, MERGE_RESUME), []
                last_commit = time.monotonic()
            ui.advance(info.tokens * itemsize, 1, info.tokens)
    finally:
        ui.stop()
    return commit_shards(out, manifest, finished, None)


class _PartFiles:
    """(tokens, documents) files of a unit's part, in the folder of the task whose range holds the unit."""

    def __init__(self, out: Path, plan: dict):
        ranges = plan["ranges"]
        contiguous = all(a[1] == b[0] for a, b in itertools.pairwise(ranges))
        if not ranges or ranges[0][0] != 0 or ranges[-1][1] != plan["units"] or not contiguous:
            raise UserError(f"{out}/{TASKS_DIR}/plan.json is damaged (its tasks do not cover its units); delete {out}")
        self.firsts = [first for first, *_ in ranges]
        self.folders = [str(task_folder(out, task)) for task in range(len(ranges))]

    def __call__(self, unit: int) -> tuple[str, str]:
        folder = self.folders[bisect.bisect_right(self.firsts, unit) - 1]  # tasks without units share the next first
        tok, doc = part_names(unit)
        return f"{folder}/{tok}", f"{folder}/{doc}"


def remove_files(paths: list[str]) -> None:
    """Delete files (in a worker)."""
    for path in paths:
        with contextlib.suppress(FileNotFoundError):  # listed twice while the folder shrank
            os.unlink(path)


def _file_batches(folder: Path, size: int = 256) -> Iterator[list[str]]:
    """The files in the subfolders of `folder`, a batch at a time."""
    batch: list[str] = []
    for sub in sorted(p for p in folder.iterdir() if p.is_dir()):
        for entry in os.scandir(sub):
            if entry.is_file():
                batch.append(entry.path)
                if len(batch) == size:
                    yield batch
                    batch = []
    if batch:
        yield batch


def _shard_jobs(
    out: Path, plan: dict, manifest: Manifest, parts: _PartFiles, counts: np.ndarray, threshold: int, drops: DropIndex
) -> Iterator[ShardJob]:
    """One job per shard the manifest does not list: the pieces of parts that make up its tokens."""
    shard_tokens, listed = plan["request"]["shard_tokens"], {s.name for s in manifest.shards}
    for column, split in enumerate(SPLITS):
        per_unit = counts[:, column] if len(counts) else np.zeros(0, dtype=np.int64)  # (units,)
        ends = np.cumsum(per_unit)
        starts = ends - per_unit
        total = int(ends[-1]) if len(ends) else 0
        for k in range(math.ceil(total / shard_tokens)):
            if shard_name(split, k) in listed:
                continue
            lo, hi = k * shard_tokens, min((k + 1) * shard_tokens, total)
            first, end = np.searchsorted(ends, lo, side="right"), np.searchsorted(starts, hi, side="left")
            pieces = [
                (*parts(u), int(max(lo - starts[u], 0)), int(min(hi, ends[u]) - max(lo, starts[u])), drops(u))
                for u in range(first, end)
                if per_unit[u]
            ]
            yield ShardJob(str(out), split, k, manifest.dtype, shard_tokens, manifest.eos_id, threshold, pieces)
