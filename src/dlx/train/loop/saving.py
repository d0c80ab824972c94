"""When the loop saves a checkpoint: wait for the previous save, verify every shard the run's batches came from, then
start the next save (in the background under checkpoint.async, except the run's last). What a checkpoint holds and how
it is published is `dlx.train.rundir.checkpoint`'s."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from dlx.errors import UserError
from dlx.parallel import distributed
from dlx.train.rundir import checkpoint as ckpt
from dlx.train.rundir import folder

if TYPE_CHECKING:
    from dlx.train.run import Run


def save(run: Run, final: bool = False) -> None:
    """Wait for the previous save, then start this one (`final`: the run's last, which gathers model.safetensors under
    checkpoint.full_weights last); a background save is waited for by the next save or the end of the run. events.jsonl
    gets a `checkpoint` line with `save_s`, the seconds the steps waited for this save (and the previous one's end)."""
    began = time.perf_counter()
    wait_for_save(run)
    verify_data_read(run)
    cfg, progress = run.config.checkpoint, run.progress
    progress.state.loader = run.loader.state_dict()
    progress.state.observers = run.observers.state_dict()
    full_weights = cfg.full_weights == "every" or (cfg.full_weights == "last" and final)
    background = cfg.async_save and not final
    progress.last_save = ckpt.save_checkpoint(
        run.run_dir,
        run.strategy,
        run.scheduler,
        run.precision.scaler,
        progress.state,
        cfg.keep_last,
        full_weights,
        background=background,
    )
    if progress.last_save.future is None:
        wait_for_save(run)
    if run.env.is_main:
        save_s = round(time.perf_counter() - began, 3)
        folder.append_event(run.run_dir, event="checkpoint", step=progress.step, save_s=save_s, background=background)


def verify_data_read(run: Run) -> None:
    """Every shard the run's batches came from matches its manifest checksum, before a checkpoint is published or the
    run ends well: a mismatch is one line naming the shard and the newest checkpoint, taken before it was read. Every
    rank stops together (one collective per checkpoint)."""
    problem = None
    try:
        run.loader.verify_read_shards()
    except UserError as e:
        problem = str(e)
    if distributed.any_rank(problem is not None, run.device):
        newest = run.progress.last_checkpoint or "none was published"
        raise UserError(
            f"{problem or 'another rank read a shard that does not match its manifest (its error names it)'}. This "
            f"run trained on it: no checkpoint is published after that (the newest, {newest}, came before)"
        )


def wait_for_save(run: Run) -> None:
    """Wait for the save still writing, if any; one console line once it is published."""
    pending = run.progress.last_save
    if pending is None or pending.settled:
        return
    run.progress.wait_for_save()
    run.console.print(f"checkpoint step {pending.state.step} saved: {pending.path}")
