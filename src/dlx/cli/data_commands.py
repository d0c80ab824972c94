"""`dlx prepare`, `dlx data info`, `dlx data verify`."""

from __future__ import annotations

import functools
import json
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer

from dlx.cli.prepare_command import prepare
from dlx.errors import UserError

data_app = typer.Typer(help="Inspect and check prepared token datasets.", no_args_is_help=True)


def through_object_storage(command: Callable[..., None]) -> Callable[..., None]:
    """The command with URL inputs downloaded first and an `--out` URL prepared locally, then published (shards, then
    the manifest); local paths pass through as Paths."""

    @functools.wraps(command)
    def run(**options: Any) -> None:
        from dlx.data import storage
        from dlx.data.prepare import object_storage

        out = options["out"]
        if storage.is_url(out) and (options["tasks"] or options["task_index"] is not None or options["merge"]):
            raise UserError("--tasks and --merge write into a shared folder; give a local --out, then upload it")
        staging = object_storage.out_staging(out) if storage.is_url(out) else Path(out)
        command(**{**options, "out": staging, "inputs": object_storage.local_inputs(options["inputs"])})
        if storage.is_url(out):
            object_storage.publish(staging, out)

    return run


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


def interrupted_note(out: Path | str, signal_name: str) -> str:
    """What a stopped `dlx prepare` kept in --out, and how to continue."""
    from dlx.data.shards import MANIFEST_FILE, read_manifest

    out = Path(out)
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
    """Tokens, documents, shards, dtype and tokenizer hash of a prepared dataset; what curation removed."""
    from dlx.data.curate.audit import summarise_file
    from dlx.data.curate.report import removed_lines, summarise, summary_lines
    from dlx.data.prepare.curation import REMOVED_FILE
    from dlx.data.prepare.tokenizer import dataset_bos_note
    from dlx.data.shards import read_manifest

    manifest = read_manifest(folder)
    summary = manifest.summary()
    params = manifest.source.get("request", {}).get("curation")
    counts = manifest.source.get("scan", {}).get("curation")
    removed = summarise_file(folder / REMOVED_FILE) if params else None
    if as_json:
        curation = {"curation": summarise(params, counts) | {"removed_file": removed}} if params else {}
        print(json.dumps(summary | curation, indent=2))
        return
    print(f"{folder}: {dataset_state(folder, summary['complete'])}")
    for key in ("tokens", "documents", "shards"):
        per_split = ", ".join(f"{s} {summary['splits'][s][key]:,}" for s in summary["splits"])
        print(f"  {key:<17} {summary[key]:>15,}  ({per_split})")
    for key in ("dtype", "vocab_size", "eos_id", "bos_id", "tokenizer_sha256"):
        print(f"  {key:<17} {summary[key]}")
    print(f"  {dataset_bos_note(folder, summary['bos_id'])}")
    if params:
        print("\n".join(summary_lines(params, counts or {}) + removed_lines(folder / REMOVED_FILE, removed)))


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
    app.command("prepare")(says_what_it_kept(through_object_storage(prepare)))
    app.add_typer(data_app, name="data")
