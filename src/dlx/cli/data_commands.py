"""`dlx prepare`, `dlx data info`, `dlx data verify`."""

from __future__ import annotations

import functools
import json
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer

from dlx.errors import UserError

data_app = typer.Typer(help="Inspect and check prepared token datasets.", no_args_is_help=True)


def prepare(
    inputs: Annotated[
        list[str] | None,
        typer.Argument(help="Files, folders and globs: .txt .jsonl .json .parquet (also .gz/.zst), source trees."),
    ] = None,
    out: Annotated[Path, typer.Option("--out", help="Dataset folder to write (or to resume).")] = ...,
    corpus: Annotated[str | None, typer.Option(help="Embedded corpus instead of INPUTS: 'stdlib'.")] = None,
    tokenizer: Annotated[Path | None, typer.Option(help="A tokenizer.json or a folder holding one.")] = None,
    train_tokenizer: Annotated[
        int | None, typer.Option(metavar="VOCAB_SIZE", help="Train a byte-level BPE of this size on the corpus.")
    ] = None,
    text_field: Annotated[
        str | None, typer.Option(help="JSON key / Parquet column of the text (WuDao: content). [default: text]")
    ] = None,
    val_fraction: Annotated[float | None, typer.Option(help="Share of documents held out for validation.")] = None,
    val_documents: Annotated[int | None, typer.Option(help="Exact number of validation documents.")] = None,
    shard_tokens: Annotated[int | None, typer.Option(help="Tokens per shard file (default: 100,000,000).")] = None,
    workers: Annotated[int | None, typer.Option(help="Worker processes (default: all cores).")] = None,
    strict: Annotated[bool, typer.Option("--strict", help="Stop at the first bad input record.")] = False,
    bos: Annotated[
        bool | None,
        typer.Option(
            "--bos/--no-bos",
            help="Put BOS before every document, or not (EOS always ends one). [default: as the tokenizer's own "
            "convention: its tokenizer_config add_bos_token, else its post-processor; none for a trained tokenizer]",
            show_default=False,
        ),
    ] = None,
    tasks: Annotated[
        str | None,
        typer.Option(
            metavar="N|auto",
            help="Split the work into N tasks (machines) that write parts into --out; `auto`: N from the launcher "
            "(SLURM_ARRAY_TASK_COUNT, WORLD_SIZE). Then run --merge.",
        ),
    ] = None,
    task_index: Annotated[
        int | None,
        typer.Option(help="This task, 0 … N-1 (default: SLURM_ARRAY_TASK_ID, else JOB_COMPLETION_INDEX, else RANK)."),
    ] = None,
    merge: Annotated[
        bool, typer.Option("--merge", help="Once every task is done: write the shards and manifest into --out.")
    ] = False,
    no_progress: Annotated[bool, typer.Option("--no-progress", help="No progress bar.")] = False,
) -> None:
    """Tokenize a corpus once into memory-mappable shards; rerun the same command to resume after a crash.

    Across machines: run `--tasks N --task-index I` for every I (any order, anywhere, each resumable), then `--merge`;
    the result is byte for byte the one-machine dataset.
    """
    from dlx.data.prepare import merge_tasks
    from dlx.data.prepare.options import build_options, task_slot
    from dlx.data.prepare.pipeline import prepare_from_options
    from dlx.data.prepare.tasks import check_task, run_task

    if val_fraction is not None and val_documents is not None:
        raise UserError("give --val-fraction or --val-documents, not both")
    if merge:
        _refuse_with_merge(
            INPUTS=inputs,
            corpus=corpus,
            tokenizer=tokenizer,
            train_tokenizer=train_tokenizer,
            text_field=text_field,
            val_fraction=val_fraction,
            val_documents=val_documents,
            shard_tokens=shard_tokens,
            strict=strict,
            bos=bos,
            tasks=tasks,
            task_index=task_index,
        )
        merge_tasks(out, workers=workers, progress=not no_progress)
        return
    if train_tokenizer is not None and (tasks is not None or task_index is not None):
        raise UserError(
            "--train-tokenizer runs on one machine: train it first (`dlx prepare SAMPLE --train-tokenizer "
            f"{train_tokenizer} --out tok`), then give every task --tokenizer tok"
        )
    slot = task_slot(tasks, task_index, os.environ)
    if slot is not None:
        check_task(tokenizer, slot.tasks, slot.index)
    given = {"text_field": text_field, "shard_tokens": shard_tokens}  # left out when not given: the defaults hold
    opts = build_options(
        inputs or None,
        corpus=corpus,
        tokenizer=tokenizer,
        train_tokenizer=train_tokenizer,
        val_fraction=val_fraction,
        val_documents=val_documents,
        workers=workers,
        strict=strict,
        add_bos=bos,
        progress=not no_progress,
        **{key: value for key, value in given.items() if value is not None},
    )
    if slot is None:
        prepare_from_options(opts, out)
    else:
        run_task(opts, out, slot.tasks, slot.index, slot.source)


def _refuse_with_merge(**given: object) -> None:
    """--merge reads the inputs and options from the tasks' plan: any of them given is a mistake."""
    named = [
        name if name == "INPUTS" else "--" + name.replace("_", "-")
        for name, value in given.items()
        if value not in (None, False, []) or (name == "bos" and value is False)
    ]
    if named:
        raise UserError(
            f"--merge takes the inputs and options from the tasks' plan in --out: drop {', '.join(named)} "
            "(only --out, --workers and --no-progress go with --merge)"
        )


def says_what_it_kept(command: Callable[..., None]) -> Callable[..., None]:
    """The command, saying on Ctrl-C or SIGTERM (which prepare raises as KeyboardInterrupt("signal 15")) what --out
    kept and how to continue, then exiting with 128 + the signal number."""

    @functools.wraps(command)
    def run(**options: Any) -> None:
        try:
            command(**options)
        except KeyboardInterrupt as stop:
            number = int(str(stop).split()[-1]) if str(stop).startswith("signal ") else int(signal.SIGINT)
            print(interrupted_note(options["out"], signal.Signals(number).name), file=sys.stderr)
            raise typer.Exit(128 + number) from None

    return run


def interrupted_note(out: Path, signal_name: str) -> str:
    """What a stopped `dlx prepare` kept in --out, and how to continue."""
    from dlx.data.shards import MANIFEST_FILE, read_manifest

    if not (out / MANIFEST_FILE).is_file():
        return (
            f"stopped by {signal_name} before the first shard was written: {out} holds nothing to keep; run the same "
            "command to start again"
        )
    manifest = read_manifest(out)
    tokens = sum(s.tokens for s in manifest.shards)
    return (
        f"stopped by {signal_name}: {out} keeps {len(manifest.shards)} finished shard(s) ({tokens:,} tokens) and the "
        "position reached; run the same command again to continue from there (the result is byte-identical to an "
        "uninterrupted run)"
    )


@data_app.command("info")
def info(
    folder: Annotated[Path, typer.Argument(help="A prepared dataset folder.")],
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object.")] = False,
) -> None:
    """Tokens, documents, shards, dtype and tokenizer hash of a prepared dataset."""
    from dlx.data.prepare.tokenizer import dataset_bos_note
    from dlx.data.shards import read_manifest

    summary = read_manifest(folder).summary()
    if as_json:
        print(json.dumps(summary, indent=2))
        return
    print(f"{folder}: {dataset_state(folder, summary['complete'])}")
    for key in ("tokens", "documents", "shards"):
        per_split = ", ".join(f"{s} {summary['splits'][s][key]:,}" for s in summary["splits"])
        print(f"  {key:<17} {summary[key]:>15,}  ({per_split})")
    for key in ("dtype", "vocab_size", "eos_id", "bos_id", "tokenizer_sha256"):
        print(f"  {key:<17} {summary[key]}")
    print(f"  {dataset_bos_note(folder, summary['bos_id'])}")


@data_app.command("verify")
def verify(folder: Annotated[Path, typer.Argument(help="A prepared dataset folder.")]) -> None:
    """Check every shard's size and SHA-256 and the tokenizer's hash; exit 1 naming each bad file."""
    from dlx.data.shards import read_manifest, verify_shards

    manifest = read_manifest(folder)
    problems = verify_shards(folder)
    for problem in problems:
        print(f"error: {folder}/{problem}", file=sys.stderr)
    if problems:
        print(f"fix: {REPREPARE}", file=sys.stderr)
        raise typer.Exit(1)
    note = "" if manifest.complete else " (prepare did not finish: rerun it to complete the dataset)"
    print(f"{folder}: {len(manifest.shards)} shards and the tokenizer match the manifest{note}")


REPREPARE = (
    "the dataset cannot be trained on as it is: run `dlx prepare` again with its inputs, tokenizer and options into a "
    "new --out (or restore the damaged files from a copy), then `dlx data verify` that folder"
)


def dataset_state(folder: Path, complete: bool) -> str:
    """`complete`, or what is wrong, from the shards' sizes (a stat each; `dlx data verify` also hashes them)."""
    if not complete:
        return "INCOMPLETE (prepare did not finish)"
    import numpy as np

    from dlx.data.shards import read_manifest

    manifest = read_manifest(folder)
    itemsize = np.dtype(manifest.dtype).itemsize
    wrong = [s.name for s in manifest.shards if _size(folder / s.name) != s.tokens * itemsize]
    if not wrong:
        return "complete"
    names = ", ".join(wrong[:3]) + (f" and {len(wrong) - 3} more" if len(wrong) > 3 else "")
    return f"DAMAGED ({names} missing or not of the size the manifest records; run `dlx data verify {folder}`)"


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return -1


def register(app: typer.Typer) -> None:
    app.command("prepare")(says_what_it_kept(prepare))
    app.add_typer(data_app, name="data")
