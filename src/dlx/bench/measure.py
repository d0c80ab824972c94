"""One point of `dlx bench`, measured as `dlx pretrain` trains: the same recipe validation and the same builders
(model, precision, strategy with its optimizer, loader, the attention kernel train.attention auto picks), the loop's
own `accumulate_gradients` and the strategy's `optimizer_step`, its PhaseTimer phases and its ThroughputMeter.
`dlx.bench.sweep` calls `measure_point` for each point, `dlx tune` (`dlx.bench.tune.search`) `measure_config` for each
layout.

A point is: `warmup` untimed optimizer steps (kernel selection, allocator growth, torch.compile), then the peak-memory
counter is reset and `steps` timed steps follow as one PhaseTimer window: phase times are averaged over them, and the
host waits for the device once per step (the loss value), as in the loop. With `compile`, Dynamo is reset before each
point, so each compiled point runs the static-shape kernels `dlx pretrain` would compile for its shape, not the dynamic
ones Dynamo switches to after the first shape change in a process. What the step loop does besides (the learning-rate
schedule, logging, the NaN policy) is left out: microseconds per step. On CUDA, NVML's GPU counters
(dlx.metrics.gpu_monitor) cover the timed steps.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch
from torch import nn

from dlx import device as dev
from dlx.bench.points import BenchPoint, BenchSetup
from dlx.metrics.compiles import CompileLog
from dlx.metrics.gpu_monitor import open_gpu_counters
from dlx.metrics.meter import ThroughputMeter
from dlx.metrics.timing import PhaseTimer
from dlx.model.presets import resolve_model_args
from dlx.parallel.distributed import env_from_torchrun, main_decides
from dlx.parallel.strategy import Strategy
from dlx.parallel.traits import STRATEGY_TRAITS
from dlx.precision import Precision, build_precision
from dlx.train.build.compile_cache import compile_key, open_compile_cache
from dlx.train.build.data import build_train_loader
from dlx.train.build.model import build_run_strategy, meta_model
from dlx.train.build.objective import build_objective, training_loss
from dlx.train.build.step_plan import plan_steps
from dlx.train.config import RunConfig, build_config
from dlx.train.loop.accumulate import accumulate_gradients
from dlx.train.loop.eval import evaluate
from dlx.train.observers.attention import AttentionObserver, attention_shape, choose_run_attention


def point_config(setup: BenchSetup, point: BenchPoint) -> RunConfig:
    """The recipe `dlx pretrain` would run for this point; max_seq_len is raised when the point needs a longer one."""
    model: dict[str, Any] = {"preset": setup.model}
    if point.seq_len > resolve_model_args(setup.model).max_seq_len:
        model["max_seq_len"] = point.seq_len
    train = {
        "max_steps": setup.warmup + setup.steps,
        "grad_accum": point.grad_accum,
        "precision": point.precision,
        "device": str(setup.device),
        "compile": setup.compile,
        **({"attention": "default"} if setup.cp > 1 else {}),  # SDPA with a mask: what cp attends through
    }
    data = {
        "path": setup.data,
        "seq_len": point.seq_len,
        "micro_batch_size": point.micro_batch,
        "document_mask": setup.document_mask,
    }
    parallel = {
        "strategy": setup.strategy,
        "tp": setup.tp,
        "cp": setup.cp,
        "cp_path": setup.cp_path,
        "dp_replicate": setup.dp_replicate,
    }
    log = {"progress": False}
    return build_config({"model": model, "data": data, "train": train, "log": log, "parallel": parallel})


def measure_point(setup: BenchSetup, point: BenchPoint) -> dict[str, Any]:
    """The ThroughputMeter record of the timed steps' mean (tokens/s, phase seconds, TFLOPS, MFU, peak memory)."""
    return measure_config(point_config(setup, point), setup.device, setup.warmup, setup.steps)


def measure_config(
    config: RunConfig, device: torch.device, warmup: int, steps: int, eval_batches: int = 0
) -> dict[str, Any]:
    """One recipe's layout measured as `dlx pretrain` trains it: `warmup` untimed steps, then `steps` timed ones; the
    ThroughputMeter record of their mean plus the fixed-cost shares, and what the run costs besides its steps
    (`first_step_s`, the first warm-up step's wall time; with `eval_batches`, `eval_batch_s` and, compiled,
    `eval_compile_s`; compiled, `warm_first_step_s`, see `warm_restart`). Under train.compile the layout compiles into
    the compile cache `dlx pretrain` reads (`dlx.train.build.compile_cache`). The process group, when the strategy
    needs one, is the caller's (`dlx bench` and `dlx tune` set it up)."""
    if config.train.compile:  # a fresh start: Dynamo would otherwise turn dynamic after the previous point's shape
        torch._dynamo.reset()
    if device.type == "cpu":  # the peak counts this layout's memory, not what the heap kept from the previous one
        dev.trim_cpu_heap()
    env = replace(env_from_torchrun(), tp=config.parallel.tp, cp=config.parallel.cp)  # the caller set up the group
    engine_managed = STRATEGY_TRAITS[config.parallel.strategy].owns_precision
    precision = build_precision(config.train.precision, device, engine_managed)
    loader = build_train_loader(config, device, env.dp_rank, env.dp_size)
    attention: AttentionObserver | None = None
    try:
        plan = plan_steps(config, loader.batches_per_epoch, loader.windows_per_epoch, env.dp_size, env.tp)
        shape = attention_shape(config, plan.micro_batch_size, env.tp, precision.name)
        choice = main_decides(lambda: choose_run_attention(config, shape, device))  # train.attention, as pretrain
        strategy = build_run_strategy(meta_model(config), config, device, env, precision, plan)
        attention = AttentionObserver(choice, config.data.document_mask, device).apply(strategy.model)
        objective = build_objective(0.0, config.data.document_mask, loader.eos_id)

        def step(timer: PhaseTimer) -> float:
            model = strategy.train_model
            loss = accumulate_gradients(model, loader, plan.grad_accum, precision, timer, strategy, objective)
            with timer.phase("optimizer"):  # the loop's one wait for the device, then the real update
                loss_value = loss.item()
                strategy.optimizer_step()
            return loss_value

        key = compile_key(config, plan.micro_batch_size, precision.name, device)
        cache = open_compile_cache(key) if config.train.compile else None
        warmup_timer, extra = PhaseTimer(device), {}
        for index in range(warmup):
            began = time.perf_counter()
            step(warmup_timer)
            warmup_timer.end_step()
            if index == 0:
                dev.synchronize(device)
                extra["first_step_s"] = time.perf_counter() - began
                if cache is not None and env.is_main:  # a later run of this layout starts warm
                    cache.mark_warm(extra["first_step_s"])
        dev.synchronize(device)  # the warm-up's last update belongs to the warm-up
        dev.reset_peak_memory(device)
        timings, gpu_columns, loss = timed_steps(step, steps, device)
        meter = ThroughputMeter(config.model.args, config.data.seq_len, device, precision.name, env.world_size)
        record = meter.record(
            step=steps,
            loss=loss,
            lr=None,
            grad_norm=None,
            tokens=plan.tokens_per_step,  # every replica's: tokens/s counts all ranks, TFLOPS per rank
            timings=timings,
        )
        cast_s = weight_cast_seconds(strategy.model, precision, device) * plan.grad_accum
        evaluation = functools.partial(time_evaluation, strategy, loader, precision, objective)
        if eval_batches:
            extra.update(evaluation(eval_batches, "eval"))
        if config.train.compile:
            extra.update(warm_restart(lambda: step(PhaseTimer(device)), device, evaluation if eval_batches else None))
    finally:
        loader.close()
        if attention is not None:
            attention.close()  # SDPA's flags as before the point
    return {**record, **gpu_columns, **fixed_cost_shares(record, cast_s), **extra}


def time_evaluation(
    strategy: Strategy, loader: Any, precision: Precision, objective: Any, batches: int, name: str
) -> dict[str, float]:
    """`batches` validation batches (the loader's, of the training shape) through the loop's `evaluate`:
    `{name}_batch_s`, the seconds per batch without compiling, and `{name}_compile_s`, what compiling took."""
    log = CompileLog()
    result = evaluate(
        strategy.model, loader, batches, precision, objective.model_inputs, functools.partial(training_loss, strategy)
    )
    compile_s = sum(c.seconds for c in log.take())
    return {f"{name}_batch_s": max(result["eval_s"] - compile_s, 0.0) / batches, f"{name}_compile_s": compile_s}


def warm_restart(
    step: Callable[[], float], device: torch.device, evaluation: Callable[[int, str], dict[str, float]] | None
) -> dict[str, float]:
    """A compiled layout's first step again after Dynamo is reset, its graphs now in the compile cache, as a later
    `dlx pretrain` of the layout starts (`warm_first_step_s`); and one validation batch the same way
    (`warm_eval_compile_s`)."""
    torch._dynamo.reset()
    dev.synchronize(device)
    began = time.perf_counter()
    step()
    dev.synchronize(device)
    warm = {"warm_first_step_s": time.perf_counter() - began}
    if evaluation is not None:
        warm["warm_eval_compile_s"] = evaluation(1, "warm_eval")["warm_eval_compile_s"]
    return warm


def timed_steps(
    step: Callable[[PhaseTimer], float], steps: int, device: torch.device
) -> tuple[dict[str, float], dict[str, Any], float]:
    """`steps` steps as one PhaseTimer window, NVML's counters over them: (mean timings, GPU columns, last loss)."""
    timer = PhaseTimer(device)  # a fresh clock: the first timed step starts at its data
    gpu = open_gpu_counters(device)  # NVML over the timed steps alone (no GPU keys on a CPU)
    try:
        for _ in range(steps):
            loss = step(timer)
            timer.end_step()
        timings = timer.window()  # the window's one wait: the timed steps have finished on the device
        return timings, gpu.window(), loss
    finally:
        gpu.close()


def fixed_cost_shares(record: dict[str, Any], weight_cast_s: float) -> dict[str, float]:
    """The step's costs that do not grow with the tokens of a micro-batch, as percentages of the step: the optimizer
    phase (clipping, AdamW, zero_grad and, on one process, the wait for the loss value) and autocast's weight casts
    (once per micro-step: each forward is its own autocast region)."""
    return {
        "optimizer_pct": 100 * record["optimizer_s"] / record["step_s"],
        "weight_cast_pct": 100 * weight_cast_s / record["step_s"],
    }


def weight_cast_seconds(model: nn.Module, precision: Precision, device: torch.device, repeats: int = 3) -> float:
    """Seconds to cast every matmul weight to the autocast dtype once, as autocast does in each forward (the output
    weight included: the loss casts it); 0 in fp32, where nothing is cast."""
    if precision.name == "fp32" or precision.engine_managed:
        return 0.0
    dtype = dev.PRECISION_DTYPES[precision.name]
    weights = list({id(m.weight): m.weight for m in model.modules() if isinstance(m, nn.Linear)}.values())
    with torch.no_grad():
        dev.synchronize(device)
        start = time.perf_counter()
        for _ in range(repeats):
            for weight in weights:
                weight.to(dtype)
        dev.synchronize(device)
    return (time.perf_counter() - start) / repeats
