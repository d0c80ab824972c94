"""The step loop. One optimizer step = `grad_accum` micro-steps of (wait for data, forward, backward), then the
optimizer; each phase is a named span of the PhaseTimer, so every logged record says where the step's time went.

Per step the host waits for the device once, for the loss value: the NaN policy and the observers' veto (the spike
test, train.spike_policy) decide before the update is applied. Under torchrun that wait is one all-reduce
(the `communication` phase) that also agrees on stopping, so every rank takes the same decision. `end_step` does not
wait: the host queues the next step while the device applies the update; the PhaseTimer synchronizes once per logged
window, to read its timings.

What differs between one process, DDP, FSDP and DeepSpeed (gradient sync, the update, checkpoints) is behind
`run.strategy` (dlx.parallel.strategy); the loop is the same for all.

Here: `pretrain` (the process group around one run), `train`, `train_loop` and what runs between steps. One hop away:
the micro-steps (`accumulate`), an update not applied (`skipped`: a veto, train.nan_policy), the step and eval
records (`records`), checkpoints as the loop takes them (`saving`), and the end of a run (`finish`).
"""

from __future__ import annotations

import gc
import math
import signal
import time
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import torch

from dlx import faults
from dlx.errors import UserError
from dlx.parallel import dcp, distributed
from dlx.parallel.heartbeat import RankLost
from dlx.parallel.traits import STRATEGY_TRAITS
from dlx.train.build.signals import GracefulStop
from dlx.train.config import RunConfig
from dlx.train.loop.accumulate import accumulate_gradients
from dlx.train.loop.finish import finish
from dlx.train.loop.records import log_step, run_eval
from dlx.train.loop.saving import save
from dlx.train.loop.skipped import handle_skipped_update
from dlx.train.run import Run, build_run
from dlx.train.rundir import folder


@dataclass
class RunResult:
    run_dir: Path
    step: int
    records: list[dict[str, Any]]
    eval_records: list[dict[str, Any]]
    verdict: Any
    last_checkpoint: Path | None
    stopped_by: str | None
    """The signal that stopped the run early, or None when it ran to the end."""
    model: torch.nn.Module

    @property
    def exit_code(self) -> int:
        """0 for a finished run; 128 + the signal's number (the shell's convention) for one a signal stopped."""
        if self.stopped_by is None:
            return 0
        return 128 + int(signal.Signals[self.stopped_by])


def pretrain(config: RunConfig, name: str = "run", run_dir: Path | None = None, resume: bool = False) -> RunResult:
    """Train as the recipe says, into a new run folder (or continue the newest complete checkpoint with resume; under
    torchrun rank 0's `resume` is every rank's: `--resume auto` is resolved once, by `dlx.train.launch`)."""
    from dlx import device as dev
    from dlx.train.start import check_optional_features

    check_optional_features(config)
    launched = distributed.env_from_torchrun()
    device = dev.training_device(config.train.device, launched.local_rank, launched.world_size, "train.device")
    needs_group = STRATEGY_TRAITS[config.parallel.strategy].always_grouped
    env = distributed.init_distributed(
        device, needs_group, config.parallel.timeout_s, config.parallel.tp, config.parallel.cp
    )
    every_rank_ends = False
    try:
        resume = distributed.main_decides(lambda: bool(resume))  # the same decision on every rank
        with GracefulStop() as stop:
            run = build_run(config, name, run_dir, resume, stop, env, device)
            try:
                train(run, resume)
            except (UserError, distributed.MainFailed):  # every rank raised it alike: no one rank to name
                raise
            except Exception as e:  # a collective failed (name the rank behind it), or this rank failed on its own
                lost = run.heartbeat.explain(e)
                if lost is not e:
                    raise lost from None
                run.heartbeat.announce_failure(e)  # before the group goes: the peers' collectives then fail
                raise
            finally:
                run.close()
            progress = run.progress
            result = RunResult(
                run.run_dir,
                progress.step,
                progress.records,
                progress.eval_records,
                progress.verdict,
                progress.last_checkpoint,
                stop.signal_name,
                run.model,
            )
        every_rank_ends = True
    except RankLost:
        raise  # a peer is gone or hung: no barrier at teardown
    except (UserError, distributed.MainFailed):
        every_rank_ends = True  # raised on every rank alike (main_decides, any_rank, the agreed loss)
        raise
    finally:
        # The wrappers (DDP's reducer, the DeepSpeed engine, the optimizer) hold the process group; freed now, it is
        # destroyed below with its gloo threads joined, not at interpreter exit, where a gloo thread still holding a
        # tensor aborts the rank ("terminate called without an active exception", seen once in CI).
        run = None
        gc.collect()
        dcp.end_background()
        distributed.teardown(meet=every_rank_ends)
    return result


def train(run: Run, resume: bool) -> None:
    progress = run.progress
    if resume and progress.step >= run.plan.total_steps:
        run.console.print(
            f"run {run.run_dir} already finished at step {progress.step:,} of {run.plan.total_steps:,}: trained "
            "nothing (raise train.max_steps to train further)"
        )
        return
    if run.env.is_main:  # startup_s: from the process's start to its first step (goodput counts it lost)
        startup_s = round(time.time() - psutil.Process().create_time(), 3)
        where = {"checkpoint": progress.last_checkpoint} if resume else {}
        kind = "resume" if resume else "start"
        folder.append_event(run.run_dir, event=kind, step=progress.step, **where, startup_s=startup_s)
    print_header(run)
    if run.config.checkpoint.async_save:
        run.strategy.start_background_saves()
    run.console.start()
    train_loop(run)
    run.console.stop()
    finish(run)


def train_loop(run: Run) -> None:
    """Optimizer steps from where the run stands to the plan's last step; stops early on a signal (to any rank)."""
    progress = run.progress
    while progress.step < run.plan.total_steps:  # an observer (a spike rollback) may move the step back
        step = progress.step + 1
        run.beat(step, "forward and backward")
        with run.observers.step(step):  # the profiler over the profile.* steps; nothing otherwise
            loss = accumulate_gradients(
                run.train_model,
                run.loader,
                run.plan.grad_accum_at(step),
                run.precision,
                run.timer,
                run.strategy,
                run.objective,
            )
            lr = run.scheduler.get_last_lr()[0]
            loss_value, stop_requested = agree_on_step(run, loss)  # NaN policy and stop: the same on every rank
            loss_value *= faults.planted_spike(step)  # test-only, 1.0 unless DLX_FAULT_SPIKE names this step
            apply = math.isfinite(loss_value) and not run.observers.veto_update(step, loss_value)
            with run.timer.phase("optimizer"):
                grad_norm = run.strategy.optimizer_step() if apply else None
                run.scheduler.step()
            run.timer.end_step()
        run.progress.advance(step, run.plan.tokens_per_step)
        if grad_norm is None:
            handle_skipped_update(run, step, loss_value)
        if step % run.config.log.every == 0 or step in (1, run.plan.total_steps):  # step 1: the starting loss
            log_step(run, step, loss_value, lr, grad_norm, run.timer.window())
        else:
            run.console.advance(step, None, loss_value)
        run.beat(step, "between steps")
        stopped_between = between_steps(run, step)
        if stop_requested or stopped_between:
            run.progress.stopped_early = True
            name_the_stop(run)
            break


def agree_on_step(run: Run, loss: torch.Tensor) -> tuple[float, bool]:
    """The step's loss (mean over ranks) and whether any rank was asked to stop. One process: `.item()`, the step's
    one wait for the device. Under torchrun: one all-reduce of both, timed as `communication`."""
    if not run.env.is_distributed:
        with run.timer.phase("optimizer"):
            return loss.item(), run.stop.requested
    run.beat(run.progress.step + 1, "loss all-reduce")
    with run.timer.phase("communication"):
        loss_sum, stops = distributed.all_reduce_tensor([loss, float(run.stop.requested)], "sum", loss.device)
    return loss_sum / run.env.world_size, stops > 0


def name_the_stop(run: Run) -> None:
    """Every rank stops at the same step, whichever rank the signal reached; they agree on its name too (one collective,
    once), so that every rank reports it and exits with 128 + its number."""
    own = signal.Signals[run.stop.signal_name].value if run.stop.signal_name else 0
    agreed = int(distributed.all_reduce([float(own)], "max", run.device)[0])
    if not run.stop.signal_name and agreed:
        run.stop.signal_name = signal.Signals(agreed).name


def between_steps(run: Run, step: int) -> bool:
    """Evaluation, checkpoints and the observers' work (samples, tasks, a spike rollback) when due, with the step clock
    paused: they are not step time. Returns whether a stop was requested (on any rank) while they ran, so that a
    signal during an evaluation stops here."""
    cfg, last_save = run.config, run.progress.last_save
    due_eval = cfg.eval.every and step % cfg.eval.every == 0
    due_save = cfg.checkpoint.every and step % cfg.checkpoint.every == 0
    if last_save is not None and run.env.is_main:
        last_save.poll()  # a background save becomes a checkpoint as soon as it is complete
    due = bool(due_eval or due_save or run.observers.due(step))
    with run.timer.paused() if due else nullcontext():
        if due_eval:
            run_eval(run, step)
        if due_save:
            save(run, final=step == run.plan.total_steps)
        run.observers.between_steps(step)  # last: an observer may move the run back to an older checkpoint
    return due and distributed.any_rank(run.stop.requested, run.device)


def print_header(run: Run) -> None:
    for line in run.header:
        run.console.print(line)
    run.console.print(f"run folder: {run.run_dir}")
