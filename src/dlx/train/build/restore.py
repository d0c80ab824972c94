"""The run folder at start-up: which folder (new, or the one to resume), the checkpoint a resume restores, and what a
new run's folder holds before step 1 (config.yaml, the tokenizer, where the initial weights came from). `build_run`
(dlx.train.run) calls these; rank 0 takes the decisions that touch the file system. `rewind` takes a running run back
to one of its checkpoints (a spike rollback decides when)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Protocol

import torch

from dlx.atomic import atomic_write_bytes
from dlx.data.shards import TOKENIZER_FILE
from dlx.data.source import BatchSource, DamagedState
from dlx.metrics.logger import MetricsLogger
from dlx.parallel.distributed import DistEnv, main_decides
from dlx.parallel.strategy import Strategy
from dlx.train.build.console import RunConsole
from dlx.train.build.data import DatasetInfo
from dlx.train.build.optim import ScheduledLR
from dlx.train.build.progress import RunProgress
from dlx.train.build.step_plan import StepPlan
from dlx.train.config import CheckpointSection, RunConfig
from dlx.train.recipe import write_resolved
from dlx.train.rundir import checkpoint as ckpt
from dlx.train.rundir import folder
from dlx.train.rundir.runlock import RunLock
from dlx.train.rundir.trained import TrainedSource


def unused_checkpoint_keys(section: CheckpointSection, checkpoint_format: str) -> list[str]:
    """Notes for checkpoint keys the recipe set that this layout's checkpoints do not use."""
    notes = []
    if section.async_save and checkpoint_format != "dcp":
        notes.append(
            f"checkpoint.async applies to sharded (DCP) checkpoints (fsdp, parallel.tp > 1); this run's are in the "
            f"{checkpoint_format} format and are written before training goes on"
        )
    if section.full_weights != "last" and checkpoint_format == "full":  # a resumed run's recipe names every key
        notes.append("checkpoint.full_weights applies to sharded checkpoints; this run's always hold model.safetensors")
    return notes


def resolve_run_dir(config: RunConfig, name: str, run_dir: Path | None, resume: bool) -> Path:
    if not resume:
        return folder.new_run_dir(name, run_dir)
    path = folder.existing_run_dir(name, run_dir)
    folder.check_resume_compatible(folder.saved_config(path), config.resolved())
    return path


def restore(
    run_dir: Path,
    resume: bool,
    loaded: ckpt.LoadedCheckpoint | None,
    strategy: Strategy,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    loader: BatchSource,
    console: RunConsole,
) -> tuple[ckpt.TrainerState, Path | None]:
    """On --resume: the newest complete checkpoint (`find_checkpoint`) into every piece, the loader to its position."""
    if not resume:
        return ckpt.TrainerState(), None
    if loaded is None:
        console.warn(folder.no_checkpoint_note(run_dir))
        return ckpt.TrainerState(), None
    state = ckpt.apply_checkpoint(loaded, strategy, scheduler, strategy.precision.scaler, say=console.warn)
    if state.loader is not None:
        loader.load_state_dict(state.loader, steps_done=state.step)
    console.print(
        f"resuming from {loaded.path} (step {state.step:,}, {state.tokens_seen:,} tokens seen, "
        f"written by {state.world_size} rank(s), {state.format} format)"
    )
    if isinstance(scheduler, ScheduledLR) and scheduler.resume_note:
        console.print(scheduler.resume_note)
    return state, loaded.path


def find_checkpoint(
    run_dir: Path, console: RunConsole, env: DistEnv, loader: BatchSource
) -> ckpt.LoadedCheckpoint | None:
    """Rank 0 picks the newest complete checkpoint whose loader position `loader` takes (setting damaged ones aside);
    the other ranks then read it. A folder whose checkpoints are all damaged is refused (UserError), left as it was."""

    def loader_takes(loaded: ckpt.LoadedCheckpoint) -> None:
        try:
            if loaded.state.loader is not None:
                loader.load_state_dict(loaded.state.loader, steps_done=loaded.state.step)
        except DamagedState as e:
            raise ckpt.DamagedCheckpoint(str(e)) from None

    def find() -> ckpt.LoadedCheckpoint | None:
        return ckpt.find_resumable(
            run_dir, say=console.warn, set_aside=True, refuse_all_damaged=True, accept=loader_takes
        )

    if not env.is_distributed:
        return find()
    path = main_decides(lambda: getattr(find(), "path", None))
    return ckpt.read_checkpoint(path, checksums=False) if path is not None else None  # rank 0 verified them


def claim_run_dir(lock: RunLock, resume: bool) -> None:
    """The one place a run takes its folder's writer lock (rank 0), before anything is written there: a resumed
    run's folder exists; a new run's is created for it, and removed again by `release_run_dir` when the run fails to
    build. A second writer starting at the same moment is refused."""
    if not resume:
        lock.path.parent.mkdir(parents=True, exist_ok=True)
    lock.acquire()


@contextlib.contextmanager
def claimed_run_dir(lock: RunLock, resume: bool, loader: BatchSource) -> Iterator[None]:
    """Rank 0 claims the run folder (`claim_run_dir`) for what is built inside; when that fails, the loader's workers
    stop and the claim is given back (`release_run_dir`), so that a run that never started leaves nothing behind."""
    try:
        main_decides(lambda: claim_run_dir(lock, resume))
        yield
    except BaseException:
        loader.close()
        release_run_dir(lock, resume)
        raise


def release_run_dir(lock: RunLock, resume: bool) -> None:
    """The lock, given back after a failed build; a new run's folder goes too when it holds nothing but the lock."""
    folder = lock.path.parent
    if not resume and lock.held and [p.name for p in folder.iterdir()] == [lock.path.name]:
        lock.path.unlink()  # while still held: no other writer can have taken it meanwhile
        lock.release()
        with contextlib.suppress(OSError):  # a writer starting just now made its own lock file there
            folder.rmdir()
        return
    lock.release()


def create_run_dir(config: RunConfig, run_dir: Path, data_info: DatasetInfo, init: TrainedSource | None = None) -> None:
    """config.yaml, the tokenizer (the dataset's, else the initial weights'), where the initial weights came from;
    each file written whole (a reader or an upload sees it complete or absent)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    write_resolved(config, run_dir)
    tokenizer = data_info.tokenizer or (init.tokenizer if init is not None else None)
    if tokenizer is not None:
        atomic_write_bytes(run_dir / TOKENIZER_FILE, Path(tokenizer).read_bytes())  # never seen half-copied
    if init is not None:
        folder.append_event(run_dir, event="init_from", path=init.given, weights=init.weights, kind=init.kind)


def announce_resume(
    config: RunConfig,
    state: ckpt.TrainerState,
    last: Path | None,
    plan: StepPlan,
    strategy: Strategy,
    console: RunConsole,
) -> None:
    """The progress bar from the checkpoint's step, and the resume's warnings (`resume_notes`)."""
    console.progress.update(console.task, completed=state.step)
    for note in resume_notes(config, state, last, plan, strategy.env, strategy.checkpoint_format):
        console.warn(note)


def resume_notes(
    config: RunConfig, state: ckpt.TrainerState, last: Path | None, plan: StepPlan, env: DistEnv, checkpoint_format: str
) -> list[str]:
    """Warnings for a resumed run: a global batch that changed with the number of ranks, and checkpoint keys this
    layout does not use."""
    notes = unused_checkpoint_keys(config.checkpoint, checkpoint_format)
    before, total_batch = plan.micro_batch_size * plan.grad_accum * max(state.world_size // env.tp, 1), plan.total_batch
    if last is None or state.world_size == env.world_size or before == total_batch or config.train.global_batch_size:
        return notes
    changed = (
        f"the checkpoint was written by {state.world_size} rank(s), this run has {env.world_size}: with "
        f"train.grad_accum the global batch goes from {before} to {total_batch} sequences; set "
        f"train.global_batch_size {before} to keep it"
    )
    return [changed, *notes]


class Rewindable(Protocol):
    """What `rewind` moves back: the parts of a built run (`dlx.train.run.Run`) that hold its position."""

    run_dir: Path
    config: RunConfig
    progress: RunProgress
    strategy: Strategy
    scheduler: ScheduledLR
    loader: BatchSource
    logger: MetricsLogger
    console: RunConsole
    env: DistEnv


def rewind(run: Rewindable, checkpoint: Path) -> None:
    """The run back at `checkpoint`: its weights, optimizer, schedule, random generators and loader position; newer
    checkpoints set aside (rank 0, `rundir.checkpoint.set_aside_after`); the records after it marked abandoned."""
    loaded = ckpt.read_checkpoint(checkpoint)
    if run.env.is_main:
        ckpt.set_aside_after(run.run_dir, ckpt.checkpoint_step(checkpoint), run.config.checkpoint.keep_last)
    progress = run.progress
    progress.state = ckpt.apply_checkpoint(
        loaded, run.strategy, run.scheduler, run.strategy.precision.scaler, say=run.console.warn
    )
    run.strategy.zero_grad()
    run.loader.load_state_dict(progress.state.loader, steps_done=progress.step)
    progress.last_checkpoint, progress.last_save = checkpoint, None
    run.logger.mark_abandoned(progress.step)
    for record in progress.records:
        if record.get("step", 0) > progress.step:
            record.setdefault("abandoned", True)
