"""Preflight: everything knowable before step 1, checked before the run folder is created, so that a run never dies
late on something it could have seen at start (a validation split too small for one batch would otherwise end the
run at its first evaluation, losing every step before it).

Each check, what it proves, and what it costs:
- run folder: it can be created (on --resume: written); the nearest existing folder is writable. A few stat calls.
- dataset: every shard the (complete) manifest lists is present at its exact size; with data.mix, in every source.
  One stat per shard.
- tokenizer: tokenizer.json is the one the shards were made with (SHA-256 against the manifest), in every data.mix
  source; on --resume, the run folder's copy is the same tokenizer by content. Reading tokenizer.json once per dataset
  (once more on --resume). That the data.mix sources share one tokenizer, and that model.init_from's tokenizer is the
  data's, is checked where those are opened (`inspect_dataset`, `resolve_initial_weights`), also before step 1.
- batches: global_batch_size divides; the training data holds one batch (with data.mix, every source one window), and
  grad_accum micro-batches per rank when the run length is in epochs; with eval on, the validation split (of each
  data.mix source: each is evaluated on its own) holds at least one batch per rank. Arithmetic.
- disk: free space for two checkpoints (a save writes the new one beside the previous; a resumed run's checkpoints
  already hold their room: one more), estimated from the parameter
  count, the optimizer and the checkpoint layout (`checkpoint_bytes`). One statvfs.

Shard checksums are not read here (that is `dlx data verify`, or the loader as it maps each shard): reading 40 GB
would take minutes, and every other check takes milliseconds. A failed check raises UserError with one line naming
the problem and the fix; a finding the run can live with (fewer eval batches than eval.batches, room for fewer
checkpoints than keep_last + 1) becomes a note in the header.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dlx.data.loader.windows import count_windows
from dlx.data.prepare.tokenizer import dataset_bos_note
from dlx.data.remote import remote_origin
from dlx.data.shards import TOKENIZER_FILE, Manifest, read_manifest, sha256_file, token_bytes_problems
from dlx.data.tokenizer_identity import same_tokenizer
from dlx.errors import UserError
from dlx.model.stats import ParamFormula
from dlx.parallel.traits import STRATEGY_TRAITS
from dlx.train.build.data import run_sources, source_label
from dlx.train.build.stages import resolve_stages
from dlx.train.build.step_plan import resolve_grad_accum
from dlx.train.config import RunConfig


@dataclass(frozen=True)
class CheckResult:
    name: str
    seconds: float
    found: str
    """What the check established, in a few words."""
    note: str | None = None
    """Something the user should know that does not stop the run."""


@dataclass(frozen=True)
class Dataset:
    label: str
    """How a message names it: `data.path FOLDER` or `data.mix source FOLDER`."""
    folder: Path
    manifest: Manifest
    in_mix: bool = False


def read_datasets(config: RunConfig) -> list[Dataset]:
    """The prepared datasets the run reads (`run_sources`): data.path's, or every data.mix source's; none for
    synthetic data."""
    in_mix = config.data.mix is not None
    return [Dataset(source_label(config, s), s.path, read_manifest(s.path), in_mix=in_mix) for s in run_sources(config)]


@dataclass(frozen=True)
class Preflight:
    checks: tuple[CheckResult, ...]

    def with_check(self, result: CheckResult) -> Preflight:
        return Preflight((*self.checks, result))

    def lines(self) -> list[str]:
        """The header's preflight block: one line in all, then a line per note."""
        total_ms = 1e3 * sum(c.seconds for c in self.checks)
        found = " · ".join(f"{c.name}: {c.found}" for c in self.checks)
        lines = [f"Preflight passed in {total_ms:.1f} ms: {found}"]
        return lines + [f"  note: {c.note}" for c in self.checks if c.note]


def run_preflight(config: RunConfig, run_dir: Path, resume: bool, world_size: int) -> Preflight:
    """Every check in order; the first failure raises UserError (nothing has been written yet). `world_size`: the
    data-parallel replicas (ranks ÷ parallel.tp), which read different batches."""
    start = time.perf_counter()
    datasets = read_datasets(config)
    read_s = time.perf_counter() - start  # counted as part of the dataset check
    checks: list[tuple[str, Callable[[], tuple[str, str | None]]]] = [
        ("run folder", lambda: check_run_folder(run_dir, resume)),
        ("dataset", lambda: check_dataset(datasets)),
        ("tokenizer", lambda: check_tokenizer(datasets, run_dir, resume)),
        ("batches", lambda: check_batches(config, datasets, world_size)),
        ("disk", lambda: check_disk(config, run_dir, resume)),
    ]
    if config.data.stages:
        checks.insert(4, ("stages", lambda: check_stages(config, datasets, world_size)))
    results = []
    for name, check in checks:
        start = time.perf_counter()
        found, note = check()
        seconds = time.perf_counter() - start + (read_s if name == "dataset" else 0.0)
        results.append(CheckResult(name, seconds, found, note))
    return Preflight(tuple(results))


def existing_ancestor(path: Path) -> Path:
    """`path` itself if it exists, else its nearest existing parent (where a new folder would be created)."""
    path = path.absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def check_run_folder(run_dir: Path, resume: bool) -> tuple[str, str | None]:
    base = existing_ancestor(run_dir)
    if not base.is_dir():
        raise UserError(f"cannot create run folder {run_dir}: {base} is a file; pick another --run-dir")
    if not os.access(base, os.W_OK | os.X_OK):
        raise UserError(f"cannot write run folder {run_dir}: {base} is not writable; pick another --run-dir")
    return ("writable" if resume else f"can be created in {base}"), None


def check_dataset(datasets: list[Dataset]) -> tuple[str, str | None]:
    if not datasets:
        return "synthetic", None
    local = [dataset for dataset in datasets if remote_origin(dataset.folder) is None]
    if not local:
        where = ", ".join(str(remote_origin(dataset.folder)) for dataset in datasets)
        return f"in object storage at {where}: shards fetched and verified as read", None
    for dataset in local:
        itemsize = np.dtype(dataset.manifest.dtype).itemsize
        for shard in dataset.manifest.shards:
            path = dataset.folder / shard.name
            size = path.stat().st_size if path.is_file() else None
            if size != shard.tokens * itemsize:
                state = (
                    "is missing"
                    if size is None
                    else f"has {size:,} bytes, the manifest says {shard.tokens * itemsize:,}"
                )
                raise UserError(
                    f"{dataset.label}: shard {shard.name} {state}; run `dlx data verify {dataset.folder}`, then "
                    "`dlx prepare` again with the same inputs"
                )
    shards = sum(len(d.manifest.shards) for d in local)
    found = f"{shards} shards present at their sizes" + _in_sources(local)
    if len(local) < len(datasets):
        found += f"; {len(datasets) - len(local)} in object storage: shards fetched and verified as read"
    return found, None


def _in_sources(datasets: list[Dataset]) -> str:
    return f" in {len(datasets)} data.mix sources" if len(datasets) > 1 else ""


def check_tokenizer(datasets: list[Dataset], run_dir: Path, resume: bool) -> tuple[str, str | None]:
    if not datasets:
        return "synthetic", None
    for dataset in datasets:
        tokenizer = dataset.folder / TOKENIZER_FILE
        if not tokenizer.is_file():
            raise UserError(f"{dataset.label} has no {TOKENIZER_FILE}; run `dlx prepare` again with the same inputs")
        if sha256_file(tokenizer) != dataset.manifest.tokenizer_sha256:
            raise UserError(
                f"{dataset.label}: {TOKENIZER_FILE} is not the tokenizer its shards were made with (SHA-256 differs "
                f"from the manifest); run `dlx data verify {dataset.folder}` and put the original back or prepare again"
            )
        for problem in token_bytes_problems(dataset.folder, dataset.manifest):
            raise UserError(
                f"{dataset.label}: {problem}; run `dlx data verify {dataset.folder}` and put the original back or "
                "prepare again"
            )
    first = datasets[0]
    run_copy = run_dir / TOKENIZER_FILE
    if resume and run_copy.is_file() and not same_tokenizer(run_copy, first.folder / TOKENIZER_FILE):
        raise UserError(
            f"--resume: {run_copy} is another tokenizer than {first.label}'s: the run was trained on other token "
            "ids; resume with the data the run was started with"
        )
    found = "matches the manifest" if len(datasets) == 1 else "each matches its manifest" + _in_sources(datasets)
    found += " and the run folder's copy" if resume and run_copy.is_file() else ""
    return f"{found}; {dataset_bos_note(first.folder, first.manifest.bos_id)}", None


def check_batches(config: RunConfig, datasets: list[Dataset], world_size: int) -> tuple[str, str | None]:
    """The loaders' arithmetic (dlx.data.loader.order, dlx.data.mixture.order): micro-batches per rank and epoch =
    ⌊windows / (world × micro)⌋, the windows of every data.mix source counted together."""
    data, grad_accum = config.data, resolve_grad_accum(config, world_size)
    found = f"grad_accum {grad_accum}"
    if not datasets or data.stages:  # each stage's datasets at its own seq_len: `check_stages`
        return found, None
    per_step = world_size * data.micro_batch_size
    if len(datasets) > 1:
        for dataset in datasets:
            if count_windows(dataset.manifest.split_tokens("train"), data.seq_len) == 0:
                raise UserError(
                    f"{dataset.label} holds {dataset.manifest.split_tokens('train'):,} training tokens, fewer than "
                    f"data.seq_len + 1 = {data.seq_len + 1}; lower data.seq_len, or prepare more data for it"
                )
    train_tokens = sum(d.manifest.split_tokens("train") for d in datasets)
    train = sum(count_windows(d.manifest.split_tokens("train"), data.seq_len) for d in datasets) // per_step
    together = "the data.mix sources together"
    where = "the training split of " + (str(datasets[0].folder) if len(datasets) == 1 else together)
    if train == 0:
        raise UserError(
            f"{where} has {train_tokens:,} tokens, fewer than one batch needs ("
            f"{_batch_tokens(config, world_size)}); lower data.micro_batch_size or data.seq_len, or prepare more data"
        )
    if config.train.max_steps is None and train < grad_accum:
        raise UserError(
            f"the training split has {train} micro-batches per epoch and rank, fewer than train.grad_accum "
            f"({grad_accum}): lower train.grad_accum or data.micro_batch_size, or prepare more data"
        )
    found += f", {train:,} train micro-batches per rank and epoch"
    if not config.eval.every:
        return found, None
    val = min(_val_batches(config, dataset, per_step, world_size) for dataset in datasets)
    note = None
    if val < config.eval.batches:
        note = (
            f"the validation split{' of a data.mix source' if len(datasets) > 1 else ''} holds {val} batch(es) per "
            f"rank, fewer than eval.batches {config.eval.batches}: each evaluation uses those {val}"
        )
        if val < FEW_VAL_BATCHES:
            note += ", so few that its loss is noisy (prepare with a larger --val-fraction or --val-documents)"
    return found + f", {min(val, config.eval.batches)} eval batch(es)" + _in_sources(datasets), note


def check_stages(config: RunConfig, datasets: list[Dataset], world_size: int) -> tuple[str, str | None]:
    """data.stages: every stage's datasets hold a batch of training windows at its seq_len, and with eval on a
    validation batch per rank at its seq_len and micro-batch (evaluation runs at the current stage's)."""
    plan = resolve_stages(config, world_size)
    assert plan is not None
    by_folder = {Path(d.folder).resolve(): d for d in datasets}
    for stage in plan.stages:
        per_step = world_size * stage.micro_batch_size
        for source in stage.sources:
            dataset = by_folder.get(Path(source.path).resolve()) or datasets[0]  # a URL: its mirror, the one dataset
            need = {"train": per_step if stage.kind == "path" else 1, "val": per_step if config.eval.every else 0}
            for split, windows in need.items():
                tokens = dataset.manifest.split_tokens(split)
                if windows and count_windows(tokens, stage.seq_len) < windows:
                    raise UserError(
                        f"data.stages[{stage.index}]: the {split} split of {source.path} holds {tokens:,} tokens, "
                        f"fewer than {windows} window(s) of seq_len {stage.seq_len} + 1 (micro-batch "
                        f"{stage.micro_batch_size}, world size {world_size}); shorten the stage's seq_len or prepare "
                        f"more data{' (or set eval.every 0)' if split == 'val' else ''}"
                    )
    return f"{len(plan.stages)} stages, each source holding a batch at its stage's seq_len", None


FEW_VAL_BATCHES = 4
"""Fewer validation batches per rank than this make a noisy evaluation: the header says so."""


def _val_batches(config: RunConfig, dataset: Dataset, per_step: int, world_size: int) -> int:
    """Validation batches per rank in `dataset`; UserError when eval is on and there is not one."""
    val_tokens = dataset.manifest.split_tokens("val")
    val = count_windows(val_tokens, config.data.seq_len) // per_step
    if val == 0:
        raise UserError(
            f"eval.every is {config.eval.every} but the validation split of "
            f"{dataset.label if dataset.in_mix else dataset.folder} has "
            f"{val_tokens:,} tokens, fewer than one batch needs ({_batch_tokens(config, world_size)}); lower "
            "data.micro_batch_size, set eval.every 0, or prepare with a larger validation split (--val-fraction)"
        )
    return val


def _batch_tokens(config: RunConfig, world_size: int) -> str:
    micro, seq_len = config.data.micro_batch_size, config.data.seq_len
    return (
        f"world size {world_size} × data.micro_batch_size {micro} × data.seq_len {seq_len} + 1 = "
        f"{world_size * micro * seq_len + 1:,}"
    )


def checkpoint_bytes(config: RunConfig) -> int:
    """One checkpoint, estimated from the parameter count: the weights in fp32 (4 B per parameter), AdamW's two fp32
    moments (8 B; SGD none). One process and DDP: model.safetensors and train_state.pt. Sharded layouts (FSDP, any
    parallel.tp > 1): DCP shards of weights and moments, plus model.safetensors unless checkpoint.full_weights is never
    (with last, the run's last checkpoint holds it). DeepSpeed: its own files of both beside model.safetensors."""
    params = ParamFormula(config.model.args).total
    optimizer = 8 * params if config.train.optimizer == "adamw" else 0
    checkpoint_format = STRATEGY_TRAITS[config.parallel.strategy].checkpoint_format_for(config.parallel.tp)
    if checkpoint_format == "dcp":
        full = 0 if config.checkpoint.full_weights == "never" else 4 * params
        return 4 * params + optimizer + full
    engine_copy = 4 * params if checkpoint_format == "deepspeed" else 0
    return 4 * params + optimizer + engine_copy


def check_disk(config: RunConfig, run_dir: Path, resume: bool = False) -> tuple[str, str | None]:
    """Free space for the checkpoints the run will add: at the peak of a save keep_last + 1 are on the disk (the new one
    beside the kept ones). A resumed run's checkpoints are on the disk already and need no more room."""
    from dlx.train.rundir.checkpoint import list_checkpoints

    size = checkpoint_bytes(config)
    free = shutil.disk_usage(existing_ancestor(run_dir)).free
    keep_last = config.checkpoint.keep_last
    on_disk = min(len(list_checkpoints(run_dir)), keep_last) if resume else 0
    needed = 1 if on_disk or not config.checkpoint.every else 2  # a save writes the new one beside the previous
    found = f"{needed} checkpoint(s) of ~{_gb(size)} need {_gb(needed * size)}, {_gb(free)} free"
    if free < needed * size:
        raise UserError(
            f"{run_dir} is on a disk with {_gb(free)} free, less than {needed} checkpoint(s) of ~{_gb(size)} need "
            f"({_gb(needed * size)}); free space, or pick another --run-dir"
        )
    keep = keep_last + 1 - on_disk
    note = None
    if config.checkpoint.every and free < keep * size:
        held = f" beside the {on_disk} on the disk" if on_disk else ""
        note = (
            f"the disk has room for {free // size} checkpoints of ~{_gb(size)}, checkpoint.keep_last {keep_last} "
            f"needs {keep}{held} during a save: lower checkpoint.keep_last or free space"
        )
    return found, note


def _gb(n_bytes: float) -> str:
    return f"{n_bytes / 1e9:.3g} GB" if n_bytes >= 1e8 else f"{n_bytes / 1e6:.3g} MB"
