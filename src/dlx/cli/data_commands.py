"""`dlx prepare`, `dlx data info`, `dlx data verify`."""

from __future__ import annotations

import functools
import json
import signal
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Any

import typer

from dlx.cli.prepare_command import PrepareArgs, prepare, typer_command
from dlx.errors import UserError

data_app = typer.Typer(help="Inspect and check prepared token datasets.", no_args_is_help=True)


def through_object_storage(command: Callable[[PrepareArgs], None]) -> Callable[[PrepareArgs], None]:
    """The command with URL inputs downloaded first and an `--out` URL prepared locally, then published (every
    listed file, then the manifest)."""

    @functools.wraps(command)
    def run(args: PrepareArgs) -> None:
        from dlx.data import storage
        from dlx.data.prepare import object_storage

        inputs = object_storage.local_inputs(args.inputs)
        if not storage.is_url(args.out):
            command(replace(args, inputs=inputs))
            return
        if args.tasks or args.task_index is not None or args.merge:
            raise UserError("--tasks and --merge write into a shared folder; give a local --out, then upload it")
        staging = object_storage.out_staging(args.out)
        object_storage.refuse_overwrite(staging, args.out, args.overwrite)
        command(replace(args, out=str(staging), inputs=inputs))
        if args.dry_run:
            print(f"dry run: nothing is published; the report is {staging / 'curation.md'}", file=sys.stderr)
        else:
            print(object_storage.publish(staging, args.out), file=sys.stderr)

    return run


def says_what_it_kept(command: Callable[[PrepareArgs], None]) -> Callable[[PrepareArgs], None]:
    """The command, saying on Ctrl-C or SIGTERM (which prepare raises as KeyboardInterrupt("signal 15")) what --out
    kept and how to continue, then exiting with 128 + the signal number."""

    @functools.wraps(command)
    def run(args: PrepareArgs) -> None:
        try:
            command(args)
        except KeyboardInterrupt as stop:
            number = int(str(stop).split()[-1]) if str(stop).startswith("signal ") else int(signal.SIGINT)
            print(interrupted_note(args.out, signal.Signals(number).name), file=sys.stderr)
            raise typer.Exit(128 + number) from None

    return run


def interrupted_note(given: str, signal_name: str) -> str:
    """What a stopped `dlx prepare` kept in --out (for a URL: in its staging folder, not yet published), and how to
    continue."""
    from dlx.data import storage
    from dlx.data.shards import MANIFEST_FILE, read_manifest

    if storage.is_url(given):
        from dlx.data.prepare.object_storage import out_staging

        out, where = out_staging(given), f"{given} (staged in {out_staging(given)}, not yet published)"
    else:
        out = where = Path(given)
    if not (out / MANIFEST_FILE).is_file():
        return (
            f"stopped by {signal_name} before the first shard was written: {where} holds nothing to keep; run the same "
            "command to start again"
        )
    manifest = read_manifest(out)
    tokens = sum(s.tokens for s in manifest.shards)
    return (
        f"stopped by {signal_name}: {where} keeps {len(manifest.shards)} finished shard(s) ({tokens:,} tokens) and the "
        "position reached; run the same command again to continue from there (the result is byte-identical to an "
        "uninterrupted run)"
    )


@data_app.command("info")
def info(
    dataset: Annotated[str, typer.Argument(help="A prepared dataset: a folder or a URL (s3://, gs://, hf://).")],
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object.")] = False,
) -> None:
    """Tokens, documents, shards, files, dtype and tokenizer hash of a prepared dataset; what curation removed."""
    from dlx.data import storage
    from dlx.data.curate.audit import summarise_file
    from dlx.data.curate.report import removed_lines, summarise, summary_lines
    from dlx.data.prepare.curation import REMOVED_FILE
    from dlx.data.prepare.tokenizer import dataset_bos_note

    folder, manifest, problems = _open_dataset(dataset, hash_files=False)
    summary = manifest.summary()
    params = manifest.source.get("request", {}).get("curation")
    counts = manifest.source.get("scan", {}).get("curation")
    if params and storage.is_url(dataset) and (entry := manifest.listed(REMOVED_FILE)) is not None:
        from dlx.data.remote import fetch_listed

        fetch_listed(dataset, folder, entry, "dataset")  # the audit trail, into the mirror beside the manifest
    removed = summarise_file(folder / REMOVED_FILE) if params else None
    if as_json:
        curation = {"curation": summarise(params, counts) | {"removed_file": removed}} if params else {}
        print(json.dumps(summary | curation, indent=2))
        return
    print(f"{dataset}: {dataset_state(dataset, manifest.complete, problems)}")
    for key in ("tokens", "documents", "shards"):
        per_split = ", ".join(f"{s} {summary['splits'][s][key]:,}" for s in summary["splits"])
        print(f"  {key:<17} {summary[key]:>15,}  ({per_split})")
    print(f"  {'files':<17} {len(manifest.dataset_files()):>15,}  ({', '.join(summary['files'])} and the shards)")
    print(f"  {'bytes':<17} {summary['bytes']:>15,}")
    for key in ("dtype", "vocab_size", "eos_id", "bos_id", "tokenizer_sha256"):
        print(f"  {key:<17} {summary[key]}")
    print(f"  {dataset_bos_note(folder, summary['bos_id'])}")
    if params:
        print("\n".join(summary_lines(params, counts or {}) + removed_lines(folder / REMOVED_FILE, removed)))


@data_app.command("verify")
def verify(
    dataset: Annotated[str, typer.Argument(help="A prepared dataset: a folder or a URL (s3://, gs://, hf://).")],
) -> None:
    """Check the size and SHA-256 of every file the manifest lists; exit 1 naming each bad file."""
    _, manifest, problems = _open_dataset(dataset, hash_files=True)
    for problem in problems:
        print(f"error: {dataset.rstrip('/')}/{problem}", file=sys.stderr)
    if problems:
        print(f"fix: {REPREPARE}", file=sys.stderr)
        raise typer.Exit(1)
    note = "" if manifest.complete else " (prepare did not finish: rerun it to complete the dataset)"
    files = len(manifest.dataset_files())
    print(f"{dataset}: {files} files ({len(manifest.shards)} shards) match the manifest{note}")


def _open_dataset(dataset: str, hash_files: bool) -> tuple[Path, Any, list[str]]:
    """(a local folder holding the dataset's manifest and tokenizer, its manifest, the problems of its files): a URL
    is read in the bucket (its tokenizer through the dataset mirror); `hash_files` False checks sizes only."""
    from dlx.data import storage
    from dlx.data.shards import read_manifest, verify_shards

    if storage.is_url(dataset):
        from dlx.data.remote import mirror_dataset, read_remote_manifest, remote_problems

        _, manifest = read_remote_manifest(dataset, "dataset")
        folder = mirror_dataset(dataset, "", key="dataset")
        return folder, manifest, remote_problems(dataset, manifest, hash_files)
    folder = Path(dataset)
    manifest = read_manifest(folder)
    return folder, manifest, verify_shards(folder, hash_files)


REPREPARE = (
    "the dataset cannot be trained on as it is: run `dlx prepare` again with its inputs, tokenizer and options into a "
    "new --out (or restore the damaged files from a copy), then `dlx data verify` that folder"
)


def dataset_state(dataset: str, complete: bool, problems: list[str]) -> str:
    """`complete`, or what is wrong, from the files' sizes (`dlx data verify` also hashes them)."""
    if not complete:
        return "INCOMPLETE (prepare did not finish)"
    if not problems:
        return "complete"
    names = [problem.split(":")[0] for problem in problems]
    listed = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
    return f"DAMAGED ({listed} missing or not of the size the manifest records; run `dlx data verify {dataset}`)"


def register(app: typer.Typer) -> None:
    app.command("prepare")(typer_command(says_what_it_kept(through_object_storage(prepare))))
    app.add_typer(data_app, name="data")
