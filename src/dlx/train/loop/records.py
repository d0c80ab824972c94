"""What the trainer logs: each logged step's record (the meter's figures from every rank's mean phase times, and
besides them the loader's epoch, the wall-clock `time` in Unix seconds, the z-loss, the ranks' step-time spread, tokens
per `data.mix` source) and each
evaluation's (each rank its share of the batches, the mean over ranks; validation loss per `data.mix` source).

Per-source figures (data.mix only: the loader's `source_tokens` and the run's `data_info.mixture` say so):
- `source_tokens` in every metrics record: training tokens (input positions) each source has supplied since step 0,
  all ranks together, keyed by source name (`dlx.data.mixture.sources`); they add up to the tokens seen.
- `source_loss` in every eval record: each source's validation loss over `eval.batches` batches of its own val split.
  The record's `loss` is their mean weighted by the mixture's weights: the mixture's expected loss per token.
- `bpb` in every eval record (`source_bpb` per data.mix source): bits per UTF-8 byte of the evaluated targets
  (dlx.data.token_bytes); null where the tokenizer is not byte-level BPE or there is none (synthetic data). With
  data.mix, `bpb` is the weighted mean of the sources' as `loss` is.
- A source read to its end starts its next epoch in a new order; that is said on the console and in events.jsonl.
"""

from __future__ import annotations

import functools
import statistics
import time
from typing import TYPE_CHECKING, Any

import torch

from dlx.data.token_bytes import read_token_bytes
from dlx.metrics.verdict import STARTUP_KEY
from dlx.parallel import distributed
from dlx.train.build.data import build_eval_loaders
from dlx.train.build.objective import training_loss
from dlx.train.loop.eval import bits_per_byte, evaluate, perplexity
from dlx.train.rundir import folder

if TYPE_CHECKING:
    from dlx.train.run import Run


def log_step(run: Run, step: int, loss: float, lr: float, grad_norm: torch.Tensor | None, timings: dict) -> None:
    """Under torchrun the record holds every rank's mean phase times and the largest peak memory of any rank."""
    names = sorted(timings)
    per_rank = rank_step_times(run, timings)
    timings = dict(zip(names, distributed.all_reduce([timings[n] for n in names], "mean", run.device), strict=True))
    seq_len, tokens = run.plan.shape_at(step).seq_len, run.plan.tokens_per_step
    record = run.meter.record(
        step=step, loss=loss, lr=lr, grad_norm=grad_norm, tokens=tokens, timings=timings, seq_len=seq_len
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


def step_fields(run: Run, step: int) -> dict[str, Any]:
    """The fields a metrics record adds to the meter's: `epoch`, `time` (wall-clock, Unix seconds), and `z_loss` and
    `source_tokens` when they apply."""
    fields: dict[str, Any] = {"epoch": run.loader.epoch, "time": round(time.time(), 3)}
    z = run.objective.step_z_loss()
    if z is not None:
        fields["z_loss"] = distributed.all_reduce([float(z)], "mean", run.device)[0]
    tokens = run.loader.source_tokens()
    if tokens:
        fields["source_tokens"] = tokens
    note_new_source_epochs(run, step)
    return fields


def note_new_source_epochs(run: Run, step: int) -> None:
    for name, epoch in run.loader.new_source_epochs():
        run.console.print(
            f"data.mix: source {name} was read to its end by step {step}; it is read again in a new order "
            f"(its epoch {epoch}, counting from 0)"
        )
        if run.env.is_main:
            folder.append_event(run.run_dir, event="source_epoch", step=step, source=name, epoch=epoch)


def run_eval(run: Run, step: int) -> None:
    """Each rank evaluates its share of the validation batches (of each data.mix source); the record holds the mean
    over ranks."""
    result = evaluate_run(run)
    record = {"step": step, **result}
    run.logger.log_eval(record)
    run.observers.on_eval(record)
    run.progress.eval_records.append(record)
    run.console.print(eval_line(step, result))


def evaluate_run(run: Run) -> dict[str, Any]:
    """{"loss", "perplexity", "bpb", "batches", "eval_s"} over the validation split of each source, `loss` and `bpb`
    (bits per byte; None without a byte table) their means weighted by the sources' weights; with data.mix also
    `source_loss` and `source_bpb`, each source's. Under torchrun the mean over ranks."""
    config, env = run.config, run.env
    loaders = build_eval_loaders(config, run.device, env.dp_rank, env.dp_size, stage_step=run.progress.step)
    results, loss_fn = {}, functools.partial(training_loss, run.strategy)
    table = byte_table(run)
    try:
        for name, loader in loaders.items():
            inputs = run.objective.model_inputs
            results[name] = evaluate(run.model, loader, config.eval.batches, run.precision, inputs, loss_fn, table)
    finally:
        for loader in loaders.values():
            loader.close()
    losses, bpbs = mean_over_ranks(run, list(results.values()))
    weights = source_weights(run)
    source_loss, source_bpb = (dict(zip(results, values, strict=True)) for values in (losses, bpbs))
    loss, bpb = weighted_mean(weights, source_loss), weighted_mean(weights, source_bpb)
    result = {
        "loss": loss,
        "perplexity": perplexity(loss),
        "bpb": bpb,
        "batches": sum(r["batches"] for r in results.values()),
        "eval_s": sum(r["eval_s"] for r in results.values()),
    }
    if run.data_info.mixture:
        result.update(source_loss=source_loss, source_bpb=source_bpb)
    return result


def source_weights(run: Run) -> dict[str, float]:
    """Each source's weight in the validation `loss`: data.mix's, or with data.stages the current stage's (0 for a
    source it does not read); synthetic data is one unnamed stream."""
    weights = {s.name: s.weight for s in run.data_info.sources} or {"": 1.0}
    if run.stages is None or not run.data_info.sources:
        return weights
    requested = run.stages.at(run.progress.step).weights
    return {name: requested.get(name, 0.0) for name in weights}


def byte_table(run: Run) -> torch.Tensor | None:
    """Bytes per token id of the dataset's tokenizer on the device (data.mix: one tokenizer for all sources)."""
    if run.data_info.path is None:
        return None
    table = read_token_bytes(run.data_info.path)
    return None if table is None else torch.from_numpy(table).long().to(run.device)


def mean_over_ranks(run: Run, results: list[dict[str, Any]]) -> tuple[list[float], list[float | None]]:
    """Each source's loss (the mean over ranks) and bits per byte (Σ nats ÷ Σ bytes, all ranks together)."""
    losses = [r["loss"] for r in results]
    sums = [value for r in results for value in (r.get("nats", 0.0), r.get("target_bytes", 0.0))]
    if run.env.is_distributed:
        losses = distributed.all_reduce(losses, "mean", run.device)
        sums = distributed.all_reduce(sums, "sum", run.device)
    return losses, [bits_per_byte(sums[2 * i], sums[2 * i + 1]) for i in range(len(results))]


def weighted_mean(weights: dict[str, float], values: dict[str, float | None]) -> float | None:
    """The mean of the sources' values weighted by the mixture's weights (one source: its value); None when any is
    None."""
    if any(value is None for value in values.values()):
        return None
    return sum(weights[name] * value for name, value in values.items()) / sum(weights.values())  # type: ignore[operator]


def eval_line(step: int, result: dict[str, Any]) -> str:
    bpb = "" if result.get("bpb") is None else f" | bpb {result['bpb']:.4f}"
    line = (
        f"eval step {step} | loss {result['loss']:.4f} | perplexity {result['perplexity']:.2f}{bpb} "
        f"| {result['batches']} batches in {result['eval_s']:.1f} s"
    )
    if "source_loss" in result:
        line += " | " + ", ".join(f"{name} {loss:.4f}" for name, loss in result["source_loss"].items())
    return line
