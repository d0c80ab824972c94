"""A step whose update was not applied: an observer's veto (a loss spike, train.spike_policy: the spike guard judged,
reported and counted it) or a non-finite loss (train.nan_policy: `skip` drops the batch and goes on, `stop` ends the
run naming what to resume).
Every rank reads the same agreed loss (`dlx.train.loop.trainer.agree_on_step`), so every rank takes the same branch."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from dlx.errors import UserError
from dlx.train.rundir import folder

if TYPE_CHECKING:
    from dlx.train.run import Run


class NonFiniteLoss(UserError):
    """The loss became NaN or inf under train.nan_policy: stop."""


def handle_skipped_update(run: Run, step: int, loss_value: float) -> None:
    """The update was not applied: an observer's veto (already reported) or a non-finite loss."""
    run.strategy.zero_grad()
    if not math.isfinite(loss_value):
        handle_non_finite(run, step, loss_value)


def handle_non_finite(run: Run, step: int, loss_value: float) -> None:
    """`skip`: drop the batch and go on; `stop`: end the run, naming what to resume."""
    policy = run.config.train.nan_policy
    if run.env.is_main:
        folder.append_event(run.run_dir, event="non_finite_loss", step=step, loss=str(loss_value), action=policy)
    if policy == "skip":
        run.progress.state.nan_skipped += 1
        run.console.warn(f"step {step}: loss is {loss_value}; batch skipped (train.nan_policy: skip)")
        return
    last = run.progress.last_checkpoint or "none (no checkpoint was saved yet)"
    raise NonFiniteLoss(
        f"loss is {loss_value} at step {step}; last good checkpoint: {last}. Lower train.lr or raise "
        "train.warmup_ratio and resume with --resume, or set train.nan_policy skip"
    )
