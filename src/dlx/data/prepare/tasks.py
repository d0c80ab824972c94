"""One task of a prepare split across machines: encode its share of the work units into parts under DIR/.tasks.

Every task plans the same units from the same inputs and takes consecutive units of about the same bytes
(`units.task_ranges`), then encodes its own with the one-machine run's workers, encoder and counting. Parts are
fsynced and renamed into the task's folder; its state (the next unit, the counts so far) is committed at most every
COMMIT_SECONDS and at the end, so a killed task resumes from its last commit and ends with the very same parts. Runs of
one task index queue on a lock on its folder; tasks of different indexes run anywhere, at any time, in any order.
`merge.merge_tasks` then writes the dataset.
"""

from __future__ import annotations

import itertools
import os
import re
import time
from pathlib import Path
from typing import Any

from dlx.data.pool import make_pool
from dlx.data.prepare.encode import COMMIT_SECONDS
from dlx.data.prepare.encoders import choose_encoder, spread
from dlx.data.prepare.inputs import InputList
from dlx.data.prepare.options import PrepareOptions, build_options
from dlx.data.prepare.outdir import TASKS_DIR, WORK_DIR, clear_work, existing_dataset, locked
from dlx.data.prepare.parts import part_paths, removed_path, signature_path
from dlx.data.prepare.pipeline import measure_inputs
from dlx.data.prepare.progress import PrepareProgress
from dlx.data.prepare.readers import sample_documents
from dlx.data.prepare.scan import CHECK_SAMPLE_CHARS, ScanRule
from dlx.data.prepare.taskdir import (
    PLAN_FORMAT,
    TaskState,
    plan_id,
    publish_plan,
    read_state,
    task_folder,
    write_state,
)
from dlx.data.prepare.tokenizer import TokenizerInfo, read_tokenizer
from dlx.data.prepare.units import choose_unit_bytes, plan_units, task_ranges
from dlx.data.prepare.worker import EncodeSetup, encode_unit, setup_encoder
from dlx.data.shards import token_dtype
from dlx.errors import UserError

_PART_FILE = re.compile(r"^(\d{8})\.(tok|doc|sig|rm)$")


def prepare_task(
    inputs: list[str] | None,
    out: str | Path,
    *,
    tasks: int,
    task_index: int,
    numbered_by: str = "task_index",
    **options: Any,
) -> TaskState | None:
    """`run_task` with the options of `build_options` (a tokenizer among them: no train_tokenizer)."""
    check_task(options.get("tokenizer"), tasks, task_index)
    return run_task(build_options(inputs, **options), Path(out), tasks, task_index, numbered_by)


def check_task(tokenizer: str | Path | None, tasks: int, task_index: int) -> None:
    """A task needs a tokenizer given (training one is a one-machine step that comes first) and an index in range."""
    if tokenizer is None:
        raise UserError(
            "--tasks needs --tokenizer: train one first on a sample, on one machine (`dlx prepare SAMPLE "
            "--train-tokenizer VOCAB --out tok`), then give every task --tokenizer tok"
        )
    if not 0 <= task_index < tasks:
        raise UserError(
            f"--task-index {task_index} is out of range for --tasks {tasks} (the tasks are 0 … {tasks - 1})"
        )


def run_task(opts: PrepareOptions, out: Path, tasks: int, task_index: int, numbered_by: str) -> TaskState | None:
    """Run task `task_index` of `tasks` (see `dlx prepare --help`); its state, or None if `out` is already merged.
    Every task must be given the same inputs and options (refused otherwise). `numbered_by` says where the task
    numbers came from, for the log."""
    assert opts.tokenizer is not None  # check_task
    ui = PrepareProgress(opts.progress)
    inputs_list = measure_inputs(opts, ui)
    opts = opts.sized_for(inputs_list)
    tok = read_tokenizer(opts.tokenizer, opts.add_bos)
    opts = opts.with_bos(tok)
    request = opts.request(inputs_list)
    manifest = existing_dataset(out, request, tok.sha256)  # refuses a folder of other inputs before writing
    if manifest is not None and manifest.complete:
        ui.note(f"{out} is already prepared; nothing to do")
        return None
    if manifest is not None and not (out / TASKS_DIR).exists():
        raise UserError(
            f"--out {out} holds a one-machine prepare that did not finish; rerun it without --tasks, or choose "
            "another --out"
        )
    plan = _plan(opts, inputs_list, request, tok, tasks)
    publish_plan(out, plan, tok.json_text)
    folder = task_folder(out, task_index)
    folder.mkdir(exist_ok=True)
    with locked(folder, ui.note):
        state = read_state(out, task_index, plan) or TaskState(plan_id(plan), task_index, plan["ranges"][task_index][0])
        if state.done:
            ui.note(f"task {task_index} of {tasks} is already done; nothing to do")
        else:
            ui.note(f"task {task_index} of {tasks} (from {numbered_by}) into {out}")
            _encode_share(out, inputs_list, opts, plan, state, tok, ui)
    _report(out, plan, state, ui)
    return state


def _plan(opts: PrepareOptions, inputs: InputList, request: dict, tok: TokenizerInfo, tasks: int) -> dict:
    """What every task must agree on; each task's range is [first unit, end unit, bytes, files]."""
    unit_bytes = choose_unit_bytes(request["bytes"])
    ranges, n_units = task_ranges(plan_units(inputs, unit_bytes), request["bytes"], tasks)
    return {
        "format": PLAN_FORMAT,
        "version": 1,
        "inputs": opts.inputs_record(),
        "request": request,
        "tokenizer": {"sha256": tok.sha256, "vocab_size": tok.vocab_size, "eos_id": tok.eos_id, "bos_id": tok.bos_id},
        "tasks": tasks,
        "unit_bytes": unit_bytes,
        "units": n_units,
        "ranges": ranges,
    }


def _encode_share(
    out: Path,
    inputs: InputList,
    opts: PrepareOptions,
    plan: dict,
    state: TaskState,
    tok: TokenizerInfo,
    ui: PrepareProgress,
) -> None:
    """Encode the task's units from its last commit on, committing its state as parts land in its folder."""
    folder = task_folder(out, state.index)
    _remove_uncommitted(folder, state.next_unit)
    _, end, nbytes, nfiles = plan["ranges"][state.index]
    if state.next_unit < end:
        setup = _setup(folder, inputs, opts, plan, range(state.next_unit, end), tok, ui)
        units = itertools.islice(plan_units(inputs, plan["unit_bytes"]), state.next_unit, end)
        with make_pool(min(opts.workers, end - state.next_unit)) as pool:
            pool.broadcast(setup_encoder, setup)
            ui.start(f"task {state.index}", nbytes, nfiles, show_tokens=True)
            ui.advance(state.counts.nbytes, state.counts.files)
            last_commit = time.monotonic()
            try:
                for res in pool.imap(encode_unit, units, window=2 * pool.n_workers + 2):
                    optional = (signature_path(setup.spool_dir, res.index), removed_path(setup.spool_dir, res.index))
                    for path in (*part_paths(setup.spool_dir, res.index), *optional):
                        if path.exists() or path not in optional:
                            os.replace(path, folder / path.name)
                    state.counts.add(res.counts, setup.rule.keep_smallest)
                    state.tokens, state.next_unit = state.tokens + res.tokens, res.index + 1
                    if time.monotonic() - last_commit >= COMMIT_SECONDS:
                        write_state(out, state)
                        last_commit = time.monotonic()
                    ui.advance(res.counts.nbytes, res.counts.files, res.tokens)
            finally:
                ui.stop()
                clear_work(folder)
    state.done = True
    write_state(out, state)


def _setup(
    folder: Path,
    inputs: InputList,
    opts: PrepareOptions,
    plan: dict,
    share: range,
    tok: TokenizerInfo,
    ui: PrepareProgress,
) -> EncodeSetup:
    """What the workers encode with: the fast path when it matches HF on the share's first documents; durable parts
    written into this run's own spool folder."""
    units = itertools.islice(plan_units(inputs, plan["unit_bytes"]), share.start, share.stop)
    sample = sample_documents(units, opts.text_field, CHECK_SAMPLE_CHARS)
    encoder, why = choose_encoder(tok.json_text, spread(sample, CHECK_SAMPLE_CHARS))
    ui.note(why)
    spools = folder / WORK_DIR / str(os.getpid())
    spools.mkdir(parents=True)
    dtype = token_dtype(tok.vocab_size)
    rule = ScanRule.of(opts, signatures=True)
    return EncodeSetup(tok.json_text, encoder, rule, tok.eos_id, tok.bos_id, dtype, str(spools), True)


def _remove_uncommitted(folder: Path, next_unit: int) -> None:
    """Parts of units after the last commit, temporary files and spools, left by a killed run of this task."""
    clear_work(folder)
    for p in folder.iterdir():
        part = _PART_FILE.match(p.name)
        if (part and int(part.group(1)) >= next_unit) or (p.name.endswith(".tmp") and p.is_file()):
            p.unlink()


def _report(out: Path, plan: dict, state: TaskState, ui: PrepareProgress) -> None:
    first, end = plan["ranges"][state.index][:2]
    done = sum(1 for i in range(plan["tasks"]) if (s := read_state(out, i, plan)) is not None and s.done)
    ui.note(
        f"task {state.index} of {plan['tasks']}: units {first}–{end - 1} of {plan['units']} ({end - first} units, "
        f"{state.tokens:,} tokens, {state.counts.bad} bad records); {done} of {plan['tasks']} tasks done"
        if end > first
        else f"task {state.index} of {plan['tasks']}: no units (the corpus has {plan['units']}); "
        f"{done} of {plan['tasks']} tasks done"
    )
    if done == plan["tasks"]:
        ui.note(f"all {plan['tasks']} tasks are done: run `dlx prepare --merge --out {out}`")
