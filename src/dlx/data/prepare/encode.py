"""The second pass of a one-machine run: workers tokenize units into parts, the parent appends them to shards in
unit order, routing each document to train or val.

After a unit (at most every COMMIT_SECONDS, and whenever a shard is finished) the parent fsyncs the partial shards and
rewrites the manifest with the resume state (the next unit and each split's committed partial length). A run killed
at any moment restarts from that state: it cuts the partials back, re-tokenizes the units after the last commit and
appends the very same tokens.
"""

from __future__ import annotations

import itertools
import os
import time
from pathlib import Path

import numpy as np

from dlx import faults
from dlx.data.pool import InlinePool, WorkerPool
from dlx.data.prepare.curation import DropIndex
from dlx.data.prepare.inputs import InputList
from dlx.data.prepare.outdir import WORK_DIR, clear_work, commit_shards, remove_strays
from dlx.data.prepare.parts import copy_split, part_paths, split_tokens
from dlx.data.prepare.progress import PrepareProgress
from dlx.data.prepare.units import plan_units
from dlx.data.prepare.worker import EncodeSetup, UnitTokens, encode_unit, setup_encoder
from dlx.data.prepare.writer import ShardWriter, restore_partial
from dlx.data.shards import PARTIAL_SUFFIX, SPLITS, Manifest, ShardInfo, shard_name

COMMIT_SECONDS = 1.0  # commit at least this often (and whenever a shard is finished)


def initial_resume_state(unit_bytes: int) -> dict:
    return {"next_unit": 0, "unit_bytes": unit_bytes, **{s: {"index": 0, "tokens": 0, "documents": 0} for s in SPLITS}}


def encode_corpus(
    pool: InlinePool | WorkerPool,
    out: Path,
    inputs: InputList,
    manifest: Manifest,
    setup: EncodeSetup,
    shard_tokens: int,
    ui: PrepareProgress,
    drops: DropIndex | None = None,
) -> Manifest:
    """Tokenize every unit not yet committed into `out`, leaving out the documents in `drops`; return the completed
    manifest."""
    drops = drops or DropIndex(None)
    resume, threshold = manifest.source["resume"], manifest.source["scan"]["val_threshold"]
    writers = _restore_writers(out, manifest, setup, shard_tokens)
    os.makedirs(setup.spool_dir, exist_ok=True)
    pool.broadcast(setup_encoder, setup)
    units = plan_units(inputs, resume["unit_bytes"])
    done = list(itertools.islice(units, resume["next_unit"]))
    ui.start("encode", inputs.bytes, inputs.files, show_tokens=True)
    ui.advance(sum(u.nbytes for u in done), sum(u.files_completed for u in done))
    last_commit, next_unit = time.monotonic(), resume["next_unit"]
    try:
        for res in pool.imap(encode_unit, units, window=2 * pool.n_workers + 2):
            finished = _append_part(res, writers, setup, threshold, drops(res.index))
            next_unit = res.index + 1
            if finished or time.monotonic() - last_commit >= COMMIT_SECONDS:
                manifest = _commit(out, manifest, writers, finished, next_unit)
                last_commit = time.monotonic()
            ui.advance(res.counts.nbytes, res.counts.files, res.tokens)
        faults.pause_point("prepare_final")
        final = [info for w in writers.values() for info in w.close()]
        manifest = _commit(out, manifest, writers, final, next_unit, complete=True)
    finally:
        ui.stop()
        clear_work(out)
    return manifest


def _restore_writers(out: Path, manifest: Manifest, setup: EncodeSetup, shard_tokens: int) -> dict[str, ShardWriter]:
    resume = manifest.source["resume"]
    itemsize = np.dtype(setup.dtype).itemsize
    for split in SPLITS:
        restore_partial(out, split, resume[split], itemsize)
    partials = {shard_name(s, resume[s]["index"]) + PARTIAL_SUFFIX for s in SPLITS}
    remove_strays(out, {s.name for s in manifest.shards} | partials)
    clear_work(out)
    return {s: ShardWriter(out, s, setup.dtype, shard_tokens, setup.eos_id, **resume[s]) for s in SPLITS}


def _append_part(
    res: UnitTokens, writers: dict[str, ShardWriter], setup: EncodeSetup, threshold: int, dropped: np.ndarray | None
) -> list[ShardInfo]:
    """Copy one unit's part into the shard writers, train and val apart, without the `dropped` documents (ordinals),
    then delete it."""
    finished: list[ShardInfo] = []
    paths = part_paths(setup.spool_dir, res.index)
    dtype = np.dtype(setup.dtype).newbyteorder("<")
    copied = sum(
        copy_split(paths, threshold, s, dtype, lambda a, s=s: finished.extend(writers[s].write(a)), dropped=dropped)
        for s in SPLITS
    )
    expected = res.tokens if dropped is None else sum(split_tokens(paths[1], threshold, dropped).values())
    if copied != expected:
        raise RuntimeError(f"part {paths[0]} holds {copied} tokens, its worker wrote {res.tokens}")
    for path in paths:
        path.unlink()
    return finished


def _commit(
    out: Path,
    manifest: Manifest,
    writers: dict[str, ShardWriter],
    finished: list[ShardInfo],
    next_unit: int,
    complete: bool = False,
) -> Manifest:
    """Make everything up to `next_unit` durable: partials fsynced, then the manifest that counts them."""
    for w in writers.values():
        w.sync()
    resume = {**manifest.source["resume"], "next_unit": next_unit, **{s: w.state() for s, w in writers.items()}}
    return commit_shards(out, manifest, finished, None if complete else resume)


def spool_dir(out: Path) -> str:
    """This run's spool folder: a killed run's straggling workers can only ever write into their own."""
    return str(out / WORK_DIR / str(os.getpid()))
