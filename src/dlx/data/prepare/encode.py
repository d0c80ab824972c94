"""The second pass: workers tokenize units into spools, the parent appends them to shards in unit order.

After each unit the parent fsyncs the partial shards and rewrites the manifest with the resume state (the next unit
and each split's committed partial length). A run killed at any moment restarts from that state: it cuts the
partials back, re-tokenizes the units after the last commit and appends the very same tokens.
"""

from __future__ import annotations

import itertools
import os
import time
from pathlib import Path

import numpy as np

from dlx.data.pool import InlinePool, WorkerPool
from dlx.data.prepare.inputs import InputFile
from dlx.data.prepare.outdir import WORK_DIR, clear_work, remove_strays
from dlx.data.prepare.progress import PrepareProgress
from dlx.data.prepare.units import plan_units
from dlx.data.prepare.worker import SPLITS, EncodeSetup, UnitTokens, encode_unit, setup_encoder, spool_path
from dlx.data.prepare.writer import ShardWriter, restore_partial
from dlx.data.shards import Manifest, ShardInfo, write_manifest

COPY_TOKENS = 1 << 22
COMMIT_SECONDS = 1.0  # commit at least this often (and whenever a shard is finished)


def initial_resume_state(unit_bytes: int) -> dict:
    return {"next_unit": 0, "unit_bytes": unit_bytes, **{s: {"index": 0, "tokens": 0, "documents": 0} for s in SPLITS}}


def encode_corpus(
    pool: InlinePool | WorkerPool,
    out: Path,
    files: list[InputFile],
    manifest: Manifest,
    setup: EncodeSetup,
    shard_tokens: int,
    ui: PrepareProgress,
) -> Manifest:
    """Tokenize every unit not yet committed into `out`; return the completed manifest."""
    resume = manifest.source["resume"]
    writers = _restore_writers(out, manifest, setup, shard_tokens)
    os.makedirs(setup.spool_dir, exist_ok=True)
    pool.broadcast(setup_encoder, setup)
    units = plan_units(files, resume["unit_bytes"])
    done = list(itertools.islice(units, resume["next_unit"]))
    ui.start("encode", sum(f.size for f in files), len(files), show_tokens=True)
    ui.advance(sum(u.nbytes for u in done), sum(u.files_completed for u in done))
    last_commit, next_unit = time.monotonic(), resume["next_unit"]
    try:
        for res in pool.imap(encode_unit, units, window=2 * pool.n_workers + 2):
            finished = _append_spools(res, writers, setup)
            next_unit = res.index + 1
            if finished or time.monotonic() - last_commit >= COMMIT_SECONDS:
                manifest = _commit(out, manifest, writers, finished, next_unit)
                last_commit = time.monotonic()
            ui.advance(res.nbytes, res.files, sum(res.tokens.values()))
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
    remove_strays(out, manifest, {s: resume[s]["index"] for s in SPLITS})
    clear_work(out)
    return {s: ShardWriter(out, s, setup.dtype, shard_tokens, setup.eos_id, **resume[s]) for s in SPLITS}


def _append_spools(res: UnitTokens, writers: dict[str, ShardWriter], setup: EncodeSetup) -> list[ShardInfo]:
    """Copy one unit's spools into the shard writers, then delete them."""
    finished = []
    dtype = np.dtype(setup.dtype).newbyteorder("<")
    for split in SPLITS:
        path = spool_path(setup.spool_dir, res.index, split)
        if not res.tokens[split]:
            continue
        copied = 0
        with open(path, "rb") as f:
            # f.read + frombuffer, not np.fromfile(f): a Ctrl-C inside fromfile's file-object path surfaced as a
            # TypeError ("expected str, bytes or os.PathLike") instead of KeyboardInterrupt
            while (block := np.frombuffer(f.read(COPY_TOKENS * dtype.itemsize), dtype=dtype)).size:
                finished += writers[split].write(block)
                copied += block.size
        if copied != res.tokens[split]:
            raise RuntimeError(f"spool {path} holds {copied} tokens, its worker wrote {res.tokens[split]}")
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
    shards = sorted([*manifest.shards, *finished], key=lambda s: (SPLITS.index(s.split), s.name))
    source = {k: v for k, v in manifest.source.items() if k != "resume"}
    if not complete:
        source["resume"] = {
            **manifest.source["resume"],
            "next_unit": next_unit,
            **{s: w.state() for s, w in writers.items()},
        }
    manifest = manifest.model_copy(update={"shards": shards, "source": source, "complete": complete})
    write_manifest(out, manifest)
    return manifest


def spool_dir(out: Path) -> str:
    """This run's spool folder: a killed run's straggling workers can only ever write into their own."""
    return str(out / WORK_DIR / str(os.getpid()))
