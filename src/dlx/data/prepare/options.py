"""What `prepare` was asked to do, validated once, before anything is read or written."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from dlx.data.curate.spec import CurateSpec
from dlx.data.prepare.inputs import InputList, stdlib_folder
from dlx.errors import UserError

if TYPE_CHECKING:
    from dlx.data.prepare.tokenizer import TokenizerInfo

DEFAULT_VAL_FRACTION = 0.005
VAL_MIN_BYTES = 131_072
"""Without --val-fraction or --val-documents, validation is sized to hold about this much input in expectation (twice
the ≈ 16,000 tokens of two batches of 8 × 1,024 at 4 bytes per token: documents differ in size), up to
MAX_DEFAULT_VAL_FRACTION of a small corpus."""
MAX_DEFAULT_VAL_FRACTION = 0.1
DEFAULT_SHARD_TOKENS = 100_000_000
MIN_TRAINED_VOCAB = 260  # 256 byte tokens + BOS/EOS + at least a couple of merges
CORPORA = ("stdlib",)


@dataclass(frozen=True)
class PrepareOptions:
    """The validated options of one `prepare` run; only the output-shaping ones go into the manifest."""

    inputs: tuple[str, ...]
    """Files, folders and globs, in the order given (empty when `corpus` is set)."""
    corpus: str | None
    """An embedded corpus name (`stdlib`) instead of inputs."""
    tokenizer: Path | None
    """A tokenizer.json, or a folder holding one."""
    train_vocab_size: int | None
    """Train a byte-level BPE with this many tokens instead of loading one."""
    text_field: str
    """The JSON key / Parquet column that holds a document's text."""
    val_fraction: float | None
    """Share of documents held out for validation (ignored when `val_documents` is set)."""
    val_documents: int | None
    """Exact number of documents held out for validation."""
    shard_tokens: int
    """Tokens per shard file (the last shard of each split may be shorter)."""
    workers: int
    """Worker processes; 1 runs everything in this process."""
    strict: bool
    """Stop at the first bad input record instead of skipping it."""
    add_bos: bool | None
    """Put the tokenizer's BOS before every document (EOS always follows every document); None: as the tokenizer's
    own convention says (`dlx.data.prepare.tokenizer.bos_by_convention`), no BOS for a tokenizer dlx trains."""
    progress: bool
    """Show a progress bar on stderr."""
    curate: CurateSpec = dataclasses.field(default_factory=CurateSpec)
    """The curation stages (none by default: the corpus is tokenized as read)."""
    dry_run: bool = False
    """Run the scan and the curation stages, write only the curation report."""
    val_default: bool = False
    """Neither --val-fraction nor --val-documents was given: the split is sized from the inputs (`sized_for`)."""

    def sized_for(self, inputs: InputList) -> PrepareOptions:
        """The default validation split for these inputs: DEFAULT_VAL_FRACTION of the documents, raised for a small
        corpus so that it holds about VAL_MIN_BYTES (at most MAX_DEFAULT_VAL_FRACTION)."""
        if not self.val_default:
            return self
        wanted = VAL_MIN_BYTES / max(inputs.bytes, 1)
        fraction = round(max(DEFAULT_VAL_FRACTION, min(MAX_DEFAULT_VAL_FRACTION, wanted)), 6)
        return dataclasses.replace(self, val_fraction=fraction)

    def with_bos(self, given: TokenizerInfo | None) -> PrepareOptions:
        """These options with add_bos decided: a given tokenizer's answer, else (a tokenizer dlx trains) --bos."""
        return dataclasses.replace(self, add_bos=given.bos_id is not None if given else bool(self.add_bos))

    def inputs_record(self) -> list[str]:
        """The inputs as given, for the manifest's `source.inputs`."""
        return list(self.inputs) if self.inputs else [f"{self.corpus}:{stdlib_folder()}"]

    def request(self, inputs: InputList) -> dict:
        """What the output depends on (options and the measured inputs): a rerun must match it to resume or skip."""
        return {
            **self.output_request(),
            "files": inputs.files,
            "bytes": inputs.bytes,
            "fingerprint": inputs.fingerprint,
        }

    def output_request(self) -> dict:
        """The options that shape the output: a rerun must match them to resume or to skip the work."""
        tokenizer = {"train_vocab_size": self.train_vocab_size} if self.train_vocab_size else {"file": True}
        if self.train_vocab_size and self.curate.active:
            tokenizer["trained_on"] = "curated"  # the documents curation kept, redacted, without duplicates
        val = {"documents": self.val_documents} if self.val_documents is not None else {"fraction": self.val_fraction}
        curation = {"curation": record} if (record := self.curate.record()) else {}
        return {
            "corpus": self.corpus,
            "text_field": self.text_field,
            "val": val,
            "shard_tokens": self.shard_tokens,
            "add_bos": self.add_bos,
            "tokenizer": tokenizer,
        } | curation


def default_workers() -> int:
    """All the cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def build_options(
    inputs: list[str] | None,
    *,
    corpus: str | None = None,
    tokenizer: str | Path | None = None,
    train_tokenizer: int | None = None,
    text_field: str = "text",
    val_fraction: float | None = None,
    val_documents: int | None = None,
    shard_tokens: int = DEFAULT_SHARD_TOKENS,
    workers: int | None = None,
    strict: bool = False,
    add_bos: bool | None = None,
    progress: bool = True,
    curate: CurateSpec | None = None,
    dry_run: bool = False,
) -> PrepareOptions:
    """The one place `prepare`'s options get their defaults and are checked (see `dlx prepare --help`); a bad one
    raises UserError naming the option and what is allowed. `val_fraction` None: DEFAULT_VAL_FRACTION unless
    `val_documents` is given; `workers` None: all cores."""
    inputs = list(inputs or [])
    if corpus is not None and corpus not in CORPORA:
        raise UserError(f"--corpus {corpus!r} is unknown; the embedded corpora are: {', '.join(CORPORA)}")
    if bool(inputs) == (corpus is not None):
        raise UserError("give input files/folders/globs or --corpus stdlib (exactly one of the two)")
    if tokenizer is not None and train_tokenizer is not None:
        raise UserError("give --tokenizer PATH or --train-tokenizer VOCAB_SIZE, not both")
    if tokenizer is None and train_tokenizer is None and not dry_run:  # a dry run tokenizes nothing
        raise UserError("give --tokenizer PATH or --train-tokenizer VOCAB_SIZE (exactly one of the two)")
    if train_tokenizer is not None and not MIN_TRAINED_VOCAB <= train_tokenizer <= 2**32:
        raise UserError(f"--train-tokenizer must be between {MIN_TRAINED_VOCAB} and 2**32, got {train_tokenizer}")
    if val_documents is not None and val_documents < 0:
        raise UserError(f"--val-documents must be 0 or more, got {val_documents}")
    defaulted = val_fraction is None and val_documents is None
    if val_documents is None:
        val_fraction = DEFAULT_VAL_FRACTION if val_fraction is None else val_fraction
        if not 0.0 <= val_fraction < 1.0:
            raise UserError(f"--val-fraction must be in [0, 1), got {val_fraction}")
    if shard_tokens < 1:
        raise UserError(f"--shard-tokens must be at least 1, got {shard_tokens}")
    if workers is not None and workers < 1:
        raise UserError(f"--workers must be at least 1, got {workers}")
    if not text_field:
        raise UserError("--text-field must not be empty")
    return PrepareOptions(
        inputs=tuple(inputs),
        corpus=corpus,
        tokenizer=Path(tokenizer) if tokenizer is not None else None,
        train_vocab_size=train_tokenizer,
        text_field=text_field,
        val_fraction=None if val_documents is not None else val_fraction,
        val_documents=val_documents,
        shard_tokens=shard_tokens,
        workers=workers or default_workers(),
        strict=strict,
        add_bos=add_bos,
        progress=progress,
        curate=curate or CurateSpec(),
        dry_run=dry_run,
        val_default=defaulted,
    )


@dataclass(frozen=True)
class TaskSlot:
    """Which share of a prepare split into tasks this process runs."""

    tasks: int
    index: int
    source: str
    """Where the numbers came from, for the log line (`--tasks/--task-index`, `SLURM_ARRAY_TASK_ID`, ...)."""


# (index variable, count variable or None, launcher) in the order they are looked for
LAUNCHERS = (
    ("SLURM_ARRAY_TASK_ID", "SLURM_ARRAY_TASK_COUNT", "a Slurm job array"),
    ("JOB_COMPLETION_INDEX", None, "a Kubernetes indexed Job"),
    ("RANK", "WORLD_SIZE", "torchrun"),
)
AUTO = "auto"


def task_slot(tasks: str | None, task_index: int | None, environ: Mapping[str, str]) -> TaskSlot | None:
    """The task this process runs, None for a one-machine run (neither --tasks nor --task-index given).

    Given either option, what is missing comes from the first launcher found in the environment: a Slurm job array
    (SLURM_ARRAY_TASK_ID, rebased by SLURM_ARRAY_TASK_MIN and _STEP, and SLURM_ARRAY_TASK_COUNT), a Kubernetes
    indexed Job (JOB_COMPLETION_INDEX; its count is --tasks), then torchrun (RANK, WORLD_SIZE). Options beat the
    environment. A plain `dlx prepare` never splits itself, even inside such a job.
    """
    if tasks is None and task_index is None:
        return None
    count = None if tasks in (None, AUTO) else _count(str(tasks), "--tasks")
    launcher = next((entry for entry in LAUNCHERS if entry[0] in environ), None)
    index_from, count_from = f"--task-index {task_index}", f"--tasks {count}"
    if task_index is None:
        if launcher is None:
            raise UserError(
                "no launcher numbers this task: give --task-index I, or run it as a Slurm job array "
                "(SLURM_ARRAY_TASK_ID), a Kubernetes indexed Job (JOB_COMPLETION_INDEX) or under torchrun (RANK)"
            )
        task_index, index_from = _env_index(launcher[0], environ), f"{launcher[0]}={environ[launcher[0]]}"
    if count is None:
        if launcher is None or launcher[1] is None or launcher[1] not in environ:
            where = f"{launcher[0]} is set but no task count" if launcher else "no launcher sets the task count"
            raise UserError(f"{where}: give --tasks N (N tasks, numbered 0 … N-1)")
        count, count_from = _count(environ[launcher[1]], launcher[1]), f"{launcher[1]}={environ[launcher[1]]}"
    if not 0 <= task_index < count:
        raise UserError(
            f"task index {task_index} (from {index_from}) is out of range for {count} tasks (from {count_from}): "
            f"the tasks are 0 … {count - 1}"
        )
    return TaskSlot(count, task_index, f"{index_from}, {count_from}")


def _count(text: str, name: str) -> int:
    try:
        count = int(text)
    except ValueError:
        count = 0
    if count < 1:
        raise UserError(f"{name} must be a whole number of tasks, 1 or more (or `{AUTO}` for --tasks), got {text!r}")
    return count


def _env_index(name: str, environ: Mapping[str, str]) -> int:
    """The task index a launcher set; a Slurm array's IDs are rebased to 0, 1, 2, … by its min and step."""
    try:
        index = int(environ[name])
        if name == "SLURM_ARRAY_TASK_ID":
            offset = index - int(environ.get("SLURM_ARRAY_TASK_MIN", "0"))
            step = int(environ.get("SLURM_ARRAY_TASK_STEP", "1"))
            if offset % step:
                raise ValueError
            index = offset // step
    except ValueError:
        raise UserError(f"{name}={environ[name]!r} is not a task index; give --task-index I") from None
    return index
