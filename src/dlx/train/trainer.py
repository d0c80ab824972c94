"""The step loop. One optimizer step = `grad_accum` micro-steps of (wait for data, forward, backward), then the
optimizer; each phase is a named span of the PhaseTimer, so every logged record says where the step's time went.

Per step the host waits for the device once, for the loss value: the NaN policy and the spike test
(train.spike_policy, dlx.train.spikes) decide before the update is applied. Under torchrun that wait is one all-reduce
(the `communication` phase) that also agrees on stopping, so every rank takes the same decision. `end_step` does not
wait: the host queues the next step while the device applies the update; the PhaseTimer synchronizes once per logged
window, to read its timings.

What differs between one process, DDP, FSDP and DeepSpeed (gradient sync, the update, checkpoints) is behind
`run.strategy` (dlx.parallel.strategy); the loop is the same for all.
"""

from __future__ import annotations

import gc
import math
import signal
import statistics
from collections.abc import Iterator
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from dlx import faults
from dlx.errors import UserError
from dlx.metrics.logger import read_jsonl
from dlx.metrics.report import write_report
from dlx.metrics.timing import PhaseTimer
from dlx.metrics.verdict import STARTUP_KEY, Hardware, bottleneck_verdict
from dlx.parallel import distributed
from dlx.parallel.heartbeat import RankLost
from dlx.parallel.strategy import Strategy
from dlx.parallel.traits import STRATEGY_TRAITS
from dlx.precision import Precision
from dlx.train import checkpoint as ckpt
from dlx.train import folder
from dlx.train.config import RunConfig
from dlx.train.objective import PLAIN, Objective, training_loss
from dlx.train.observe import report_files
from dlx.train.records import eval_line, evaluate_run, step_fields
from dlx.train.run import Run, build_run
from dlx.train.signals import GracefulStop


class NonFiniteLoss(UserError):
    """The loss became NaN or inf under train.nan_policy: stop."""


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


def pretrain(
    config: RunConfig, name: str = "run", run_dir: Path | None = None, resume: bool | str = False
) -> RunResult:
    """Train as the recipe says, into a new run folder (or continue the newest complete checkpoint with resume; with
    resume "auto", continue when run_dir holds a run, else start one there: rank 0 decides for all)."""
    from dlx import device as dev
    from dlx.train.run import check_optional_features

    check_optional_features(config)
    launched = distributed.env_from_torchrun()
    device = dev.training_device(config.train.device, launched.local_rank, launched.world_size, "train.device")
    needs_group = STRATEGY_TRAITS[config.parallel.strategy].always_grouped
    env = distributed.init_distributed(device, needs_group, config.parallel.timeout_s, config.parallel.tp)
    every_rank_ends = False
    try:
        if resume == "auto":
            resume = distributed.main_decides(lambda: folder.holds_a_run(run_dir))
        with GracefulStop() as stop:
            run = build_run(config, name, run_dir, resume, stop, env, device)
            try:
                train(run, resume)
            except UserError:
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
    except UserError:
        every_rank_ends = True  # raised on every rank alike (main_decides, any_rank, the agreed loss)
        raise
    finally:
        # The wrappers (DDP's reducer, the DeepSpeed engine, the optimizer) hold the process group; freed now, it is
        # destroyed below with its gloo threads joined, not at interpreter exit, where a gloo thread still holding a
        # tensor aborts the rank ("terminate called without an active exception", seen once in CI).
        run = None
        gc.collect()
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
    if resume and run.env.is_main:
        folder.append_event(run.run_dir, event="resume", step=progress.step, checkpoint=progress.last_checkpoint)
    print_header(run)
    run.console.start()
    train_loop(run)
    run.console.stop()
    finish(run)


def train_loop(run: Run) -> None:
    """Optimizer steps from where the run stands to the plan's last step; stops early on a signal (to any rank)."""
    progress = run.progress
    while progress.step < run.plan.total_steps:  # a spike rollback (dlx.train.spikes) moves the step back
        step = progress.step + 1
        run.beat(step, "forward and backward")
        with run.observers.step(step):  # the profiler over the profile.* steps; nothing otherwise
            loss = accumulate_gradients(
                run.train_model, run.loader, run.plan.grad_accum, run.precision, run.timer, run.strategy, run.objective
            )
            lr = run.scheduler.get_last_lr()[0]
            loss_value, stop_requested = agree_on_step(run, loss)  # NaN policy and stop: the same on every rank
            loss_value *= faults.planted_spike(step)  # test-only, 1.0 unless DLX_FAULT_SPIKE names this step
            apply = math.isfinite(loss_value) and not run.spikes.is_spike(step, loss_value)
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
        run.observers.between_steps(step)  # last: a spike rollback moves the run back to an older checkpoint
    return due and distributed.any_rank(run.stop.requested, run.device)


def accumulate_gradients(
    model: nn.Module,
    batches: Iterator,
    accum: int,
    precision: Precision,
    timer: PhaseTimer,
    strategy: Strategy,
    objective: Objective = PLAIN,
) -> torch.Tensor:
    """`accum` micro-steps; returns the step's mean loss (detached). Each micro-loss is divided by `accum`, so the
    summed gradients equal those of one batch `accum` times larger (the micro-batches have equal sizes). Under DDP
    and FSDP, gradients are synchronised only in the last micro-step's backward (`strategy.gradient_sync`).
    `objective`: document ids for the model, the z-loss weight, and the z-loss term's record (dlx.train.objective)."""
    total = None
    for index in range(accum):
        last = index == accum - 1
        with timer.phase("data_wait"):
            inputs, targets = next(batches)
        with strategy.gradient_sync(last):
            with timer.phase("forward"), precision.autocast():
                extra = objective.model_inputs(inputs)  # document ids, when data.document_mask is on
                parts = training_loss(strategy, model, inputs, targets, objective.z_loss_weight, **extra)
                objective.record_z_loss(parts, accum)  # logged apart, when train.z_loss > 0
            with timer.phase("backward"):
                strategy.backward(parts.loss / accum, last)  # cross-entropy + train.z_loss × z-loss
        loss = parts.cross_entropy / accum  # what is logged and checked: the cross-entropy alone
        total = loss if total is None else total + loss
    return total


def handle_skipped_update(run: Run, step: int, loss_value: float) -> None:
    """The update was not applied: a loss spike (train.spike_policy, already reported) or a non-finite loss."""
    run.strategy.zero_grad()
    if math.isfinite(loss_value):
        run.progress.state.spikes_skipped += 1
        return
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


def log_step(run: Run, step: int, loss: float, lr: float, grad_norm: torch.Tensor | None, timings: dict) -> None:
    """Under torchrun the record holds every rank's mean phase times and the largest peak memory of any rank."""
    names = sorted(timings)
    per_rank = rank_step_times(run, timings)
    timings = dict(zip(names, distributed.all_reduce([timings[n] for n in names], "mean", run.device), strict=True))
    record = run.meter.record(
        step=step, loss=loss, lr=lr, grad_norm=grad_norm, tokens=run.plan.tokens_per_step, timings=timings
    )
    if run.env.is_distributed and record.get("peak_mem_gb") is not None:
        record["peak_mem_gb"] = distributed.all_reduce([record["peak_mem_gb"]], "max", run.device)[0]
    record.update(step_fields(run, step))  # epoch; z_loss and source_tokens when they apply
    record.update(run.timer.spread())  # window_steps, step_s_std: the verdict's confidence
    record.update(run.observers.columns(step))  # GPU counters, profiled steps
    record.update(per_rank)
    progress = run.progress
    if len(progress.records) == progress.resumed_records:
        record[STARTUP_KEY] = True  # this process's compilation and start-up: left out of summaries
    run.logger.log(record)
    run.observers.on_record(record)
    progress.records.append(record)
    run.console.print(run.meter.format_line(record))
    run.console.advance(step, record)


def rank_step_times(run: Run, timings: dict[str, float]) -> dict[str, float]:
    """Under torchrun: the spread of the ranks' step times without communication (what each rank spent itself; a
    straggler makes the others wait in the all-reduce), for the verdict's straggler line. One collective."""
    if not run.env.is_distributed:
        return {}
    own = [0.0] * run.env.world_size
    own[run.env.rank] = timings["step_s"] - timings.get("communication", 0.0)
    times = distributed.all_reduce(own, "sum", run.device)
    slowest = max(range(len(times)), key=times.__getitem__)
    return {
        "rank_step_s_max": times[slowest],
        "rank_step_s_min": min(times),
        "rank_step_s_median": statistics.median(times),
        "slowest_rank": slowest,
    }


def run_eval(run: Run, step: int) -> None:
    """Each rank evaluates its share of the validation batches (of each data.mix source); the record holds the mean
    over ranks."""
    result = evaluate_run(run)
    record = {"step": step, **result}
    run.logger.log_eval(record)
    run.observers.on_eval(record)
    run.progress.eval_records.append(record)
    run.console.print(eval_line(step, result))


def save(run: Run, final: bool = False) -> None:
    """Wait for the previous save, then start this one (`final`: the run's last, which gathers model.safetensors under
    checkpoint.full_weights last); a background save is waited for by the next save or the end of the run."""
    wait_for_save(run)
    verify_data_read(run)
    cfg, progress = run.config.checkpoint, run.progress
    progress.state.loader = run.loader.state_dict()
    progress.state.spike_window = run.spikes.saved_window()
    full_weights = cfg.full_weights == "every" or (cfg.full_weights == "last" and final)
    progress.last_save = ckpt.save_checkpoint(
        run.run_dir,
        run.strategy,
        run.scheduler,
        run.precision.scaler,
        progress.state,
        cfg.keep_last,
        full_weights,
        background=cfg.async_save and not final,
    )
    if progress.last_save.future is None:
        wait_for_save(run)


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
    run.progress.wait_for_save()


def finish(run: Run) -> None:
    """Last evaluation and checkpoint (or the one an orderly stop needs), the observers' `finish`, then the verdict and
    the report."""
    progress, step = run.progress, run.progress.step
    wait_for_save(run)
    verify_data_read(run)
    this_step = ckpt.checkpoint_dir(run.run_dir, step).name
    at_step = progress.last_checkpoint is not None and progress.last_checkpoint.name == this_step
    last = progress.last_save
    lacks_weights = last is not None and not last.state.full_weights and run.config.checkpoint.full_weights == "last"
    if step > 0 and not (at_step and not lacks_weights):
        save(run, final=True)
    if progress.stopped_early:
        if run.env.is_main:
            folder.append_event(run.run_dir, event="stopped", step=step, signal=run.stop.signal_name)
        run.console.warn(
            f"stopped by {run.stop.signal_name} after step {step}; checkpoint {progress.last_checkpoint}; "
            f"continue with --resume --run-dir {run.run_dir}"
        )
    elif run.config.eval.every and not (progress.eval_records and progress.eval_records[-1]["step"] == step):
        run_eval(run, step)
    run.observers.finish(step)
    if progress.records and run.env.is_main:
        report(run, step)
    run.console.print(f"run folder: {run.run_dir} (report.md, metrics.jsonl, checkpoints/)")


def report(run: Run, step: int) -> None:
    """Rank 0: the bottleneck verdict, report.md and its plots, then the observers' `on_report` (W&B)."""
    progress = run.progress
    progress.verdict = bottleneck_verdict(progress.records, hardware=hardware(run))
    run.console.print(str(progress.verdict))
    weights = {source.name: source.weight for source in run.data_info.sources}  # data.path: one source
    records, evals = progress.records, progress.eval_records
    events = read_jsonl(run.run_dir / folder.EVENTS_FILE)  # resumes, loss spikes, rollbacks, skipped batches, stops
    write_report(run.run_dir, records, progress.verdict, run.header, evals, source_weights=weights, events=events)
    run.observers.on_report(step, progress.verdict, report_files(run.run_dir))


def hardware(run: Run) -> Hardware:
    from dlx.device import supports_native_bf16

    return Hardware(run.device.type, run.precision.name, supports_native_bf16(run.device))


def print_header(run: Run) -> None:
    for line in run.header:
        run.console.print(line)
    run.console.print(f"run folder: {run.run_dir}")
