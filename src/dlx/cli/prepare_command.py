"""`dlx prepare`: its options, and the hand-off to a one-machine run, a task of a split run, or the merge."""

from __future__ import annotations

import inspect
import os
import typing
from collections.abc import Callable
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Annotated, Any

import typer

from dlx.errors import UserError

CURATION = "Curation (each off unless given)"
Inputs = Annotated[
    list[str] | None,
    typer.Argument(help="Files, folders and globs: .txt .jsonl .json .parquet (also .gz/.zst), source trees."),
]
Out = Annotated[
    str, typer.Option("--out", help="Dataset folder to write (or to resume), or an s3://, gs://, hf:// URL.")
]
Corpus = Annotated[str | None, typer.Option(help="Embedded corpus instead of INPUTS: 'stdlib'.")]
Tokenizer = Annotated[Path | None, typer.Option(help="A tokenizer.json or a folder holding one.")]
TrainTokenizer = Annotated[
    int | None, typer.Option(metavar="VOCAB_SIZE", help="Train a byte-level BPE of this size on the corpus.")
]
TextField = Annotated[
    str | None, typer.Option(help="JSON key / Parquet column of the text (WuDao: content). [default: text]")
]
ValFraction = Annotated[float | None, typer.Option(help="Share of documents held out for validation.")]
ValDocuments = Annotated[int | None, typer.Option(help="Exact number of validation documents.")]
ShardTokens = Annotated[int | None, typer.Option(help="Tokens per shard file (default: 100,000,000).")]
Workers = Annotated[int | None, typer.Option(help="Worker processes (default: all cores).")]
Strict = Annotated[bool, typer.Option("--strict", help="Stop at the first bad input record.")]
Bos = Annotated[
    bool | None,
    typer.Option(
        "--bos/--no-bos",
        help="Put BOS before every document, or not (EOS always ends one). [default: as the tokenizer's own "
        "convention: its tokenizer_config add_bos_token, else its post-processor; none for a trained tokenizer]",
        show_default=False,
    ),
]
Tasks = Annotated[
    str | None,
    typer.Option(
        metavar="N|auto",
        help="Split the work into N tasks (machines) that write parts into --out; `auto`: N from the launcher "
        "(SLURM_ARRAY_TASK_COUNT, WORLD_SIZE). Then run --merge.",
    ),
]
TaskIndex = Annotated[
    int | None,
    typer.Option(help="This task, 0 … N-1 (default: SLURM_ARRAY_TASK_ID, else JOB_COMPLETION_INDEX, else RANK)."),
]
Merge = Annotated[
    bool, typer.Option("--merge", help="Once every task is done: write the shards and manifest into --out.")
]
NoProgress = Annotated[bool, typer.Option("--no-progress", help="No progress bar.")]
Overwrite = Annotated[
    bool,
    typer.Option(
        "--overwrite", help="Replace a dataset already published at an --out URL that this machine did not stage."
    ),
]
Dedup = Annotated[
    str | None,
    typer.Option(
        metavar="exact|near",
        help="Remove duplicates: exact (NFKC, whitespace-collapsed text) or near (exact, then MinHash LSH clusters); "
        "the first in corpus order is kept.",
        rich_help_panel=CURATION,
    ),
]
NearShingle = Annotated[
    int, typer.Option(help="MinHash shingle: characters (CJK), words, code tokens.", rich_help_panel=CURATION)
]
NearBands = Annotated[int, typer.Option(help="MinHash LSH bands.", rich_help_panel=CURATION)]
NearRows = Annotated[int, typer.Option(help="MinHash values per band.", rich_help_panel=CURATION)]
Languages = Annotated[
    str | None,
    typer.Option(help="Keep documents in these languages (py3langid), e.g. zh,en.", rich_help_panel=CURATION),
]
Quality = Annotated[
    str | None,
    typer.Option(
        metavar="default|RULES.yaml",
        help="Quality filters: the default rules, or a YAML file of rules.",
        rich_help_panel=CURATION,
    ),
]
Pii = Annotated[
    str | None, typer.Option(metavar="redact", help="Replace PII by placeholders.", rich_help_panel=CURATION)
]
PiiKinds = Annotated[
    list[str] | None,
    typer.Option(
        "--pii-kinds",
        metavar="prose|code=PII[,PII]",
        help="What --pii redacts in prose or in code, of email, ip, prc_id, phone, secret (default: all in prose; "
        "email and secret in code).",
        rich_help_panel=CURATION,
    ),
]
Kind = Annotated[
    list[str] | None,
    typer.Option(
        "--kind",
        metavar="INPUT=code|prose",
        help="Declare the kind of an input's documents (once per input); the others by their record's lang or path "
        "field, their file's suffix, then detection.",
        rich_help_panel=CURATION,
    ),
]
Decontaminate = Annotated[
    str | None,
    typer.Option(
        metavar="TASK[,TASK]",
        help="Remove documents sharing an n-gram with these eval tasks (as eval.tasks: lm-eval names, YAML files, "
        "dlx_stdlib_next_line).",
        rich_help_panel=CURATION,
    ),
]
DecontaminateNgram = Annotated[
    int, typer.Option(help="Decontamination n-gram (words; CJK characters).", rich_help_panel=CURATION)
]
TaskDir = Annotated[str | None, typer.Option(help="A folder of lm-eval task YAML files.", rich_help_panel=CURATION)]
DryRun = Annotated[
    bool,
    typer.Option(
        "--dry-run",
        help="Run the curation stages; write only curation.md and curation-removed.jsonl.",
        rich_help_panel=CURATION,
    ),
]


@dataclass(frozen=True)
class PrepareArgs:
    """`dlx prepare`'s options, typed once: the command line's parameters are these fields (`typer_command`), and
    every consumer (the object-storage wrapper, the merge, the options of `dlx.data.prepare`, the curation spec) reads
    them by name."""

    inputs: Inputs = None
    out: Out = ...
    corpus: Corpus = None
    tokenizer: Tokenizer = None
    train_tokenizer: TrainTokenizer = None
    text_field: TextField = None
    val_fraction: ValFraction = None
    val_documents: ValDocuments = None
    shard_tokens: ShardTokens = None
    workers: Workers = None
    strict: Strict = False
    bos: Bos = None
    tasks: Tasks = None
    task_index: TaskIndex = None
    merge: Merge = False
    no_progress: NoProgress = False
    overwrite: Overwrite = False
    dedup: Dedup = None
    near_shingle: NearShingle = 5
    near_bands: NearBands = 14
    near_rows: NearRows = 8
    languages: Languages = None
    quality: Quality = None
    pii: Pii = None
    pii_kinds: PiiKinds = None
    kind: Kind = None
    decontaminate: Decontaminate = None
    decontaminate_ngram: DecontaminateNgram = 13
    task_dir: TaskDir = None
    dry_run: DryRun = False

    @property
    def progress(self) -> bool:
        return not self.no_progress


def prepare(args: PrepareArgs) -> None:
    """Tokenize a corpus once into memory-mappable shards; rerun the same command to resume after a crash.

    Across machines: run `--tasks N --task-index I` for every I (any order, anywhere, each resumable), then `--merge`;
    the result is byte for byte the one-machine dataset.
    """
    if args.val_fraction is not None and args.val_documents is not None:
        raise UserError("give --val-fraction or --val-documents, not both")
    if args.merge:
        from dlx.data.prepare import merge_tasks

        _refuse_merge_options(args)
        merge_tasks(args.out, workers=args.workers, progress=args.progress)
        return
    refuse_train_with_tasks(args.train_tokenizer, args.tasks, args.task_index)
    _run(args)


def typer_command(run: Callable[[PrepareArgs], None]) -> Callable[..., None]:
    """`run` as typer reads a command: one parameter per field of `PrepareArgs`, with its option, in order."""
    hints = typing.get_type_hints(PrepareArgs, include_extras=True)
    kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
    parameters = [
        inspect.Parameter(f.name, kind, default=f.default, annotation=hints[f.name]) for f in fields(PrepareArgs)
    ]

    def command(**options: Any) -> None:
        run(PrepareArgs(**options))

    command.__signature__ = inspect.Signature(parameters)  # type: ignore[attr-defined]
    command.__annotations__ = {p.name: p.annotation for p in parameters}
    command.__doc__, command.__name__ = prepare.__doc__, "prepare"  # the help text: prepare's docstring
    return command


def _refuse_merge_options(args: PrepareArgs) -> None:
    keep = {"out", "workers", "no_progress", "merge", "near_shingle", "near_bands", "near_rows", "decontaminate_ngram"}
    named = {("INPUTS" if f.name == "inputs" else f.name): getattr(args, f.name) for f in fields(args)}
    refuse_with_merge(**{name: value for name, value in named.items() if name not in keep})


def _run(args: PrepareArgs) -> None:
    """A one-machine run, or one task of a split run."""
    from dlx.data.prepare.options import build_options, task_slot
    from dlx.data.prepare.pipeline import prepare_from_options
    from dlx.data.prepare.tasks import check_task, run_task

    slot = task_slot(args.tasks, args.task_index, os.environ)
    if slot is not None:
        check_task(args.tokenizer, slot.tasks, slot.index)
        if args.dry_run:
            raise UserError("--dry-run runs on one machine: drop --tasks/--task-index")
    defaults = {k: getattr(args, k) for k in ("text_field", "shard_tokens") if getattr(args, k) is not None}
    opts = build_options(
        args.inputs or None,
        corpus=args.corpus,
        tokenizer=args.tokenizer,
        train_tokenizer=args.train_tokenizer,
        val_fraction=args.val_fraction,
        val_documents=args.val_documents,
        workers=args.workers,
        strict=args.strict,
        add_bos=args.bos,
        progress=args.progress,
        curate=curate_spec(args),
        dry_run=args.dry_run,
        **defaults,
    )
    if slot is None:
        prepare_from_options(opts, Path(args.out))
    else:
        run_task(opts, Path(args.out), slot.tasks, slot.index, slot.source)


def curate_spec(args: PrepareArgs) -> Any:
    """The CurateSpec of the curation options (the eval tasks resolved and rendered here, above the data layer)."""
    from dlx.data.curate.spec import build_spec, parse_assignments

    task_texts = None
    if args.decontaminate:
        from dlx.evals.task_documents import task_documents

        names = [n.strip() for n in args.decontaminate.split(",") if n.strip()]
        task_texts = task_documents(names, args.task_dir)
    kinds = parse_assignments(args.kind or [], "--kind")
    if bad := next((name for name, values in kinds.items() if len(values) != 1), None):
        raise UserError(f"--kind {bad}=...: give one kind, code or prose")
    return build_spec(
        dedup=args.dedup,
        shingle=args.near_shingle,
        bands=args.near_bands,
        rows=args.near_rows,
        languages=[c.strip() for c in args.languages.split(",") if c.strip()] if args.languages else None,
        quality=True if args.quality == "default" else args.quality,
        pii=args.pii,
        task_texts=task_texts,
        decontaminate_ngram=args.decontaminate_ngram,
        sources=source_labels(args.inputs or [], args.corpus),
        input_kinds={name: values[0] for name, values in kinds.items()},
        pii_kinds=parse_assignments(args.pii_kinds or [], "--pii-kinds"),
    )


def source_labels(inputs: list[str], corpus: str | None) -> list[tuple[str, str]]:
    """(label, absolute path prefix) per input: a glob's prefix is the folder before its first wildcard."""
    if corpus:
        return [(corpus, "/")]
    labels = []
    for given in inputs:
        static = given.split("*")[0].split("?")[0].split("[")[0]
        prefix = os.path.abspath(static if static == given else os.path.dirname(static) or ".")
        labels.append((given, prefix))
    return labels


def refuse_train_with_tasks(train_tokenizer: int | None, tasks: str | None, task_index: int | None) -> None:
    if train_tokenizer is not None and (tasks is not None or task_index is not None):
        raise UserError(
            "--train-tokenizer runs on one machine: train it first (`dlx prepare SAMPLE --train-tokenizer "
            f"{train_tokenizer} --out tok`), then give every task --tokenizer tok"
        )


def refuse_with_merge(**given: object) -> None:
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
