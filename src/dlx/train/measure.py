"""One point of `dlx bench`, measured as `dlx pretrain` trains: the same recipe validation and the same builders
(model, precision, strategy with its optimizer, loader), the loop's own `accumulate_gradients` and the strategy's
`optimizer_step`, its PhaseTimer phases and its ThroughputMeter. `dlx.bench.sweep` calls `measure_point` for each point.

A point is: `warmup` untimed optimizer steps (kernel selection, allocator growth, torch.compile), then the peak-memory
counter is reset and `steps` timed steps follow; phase times are averaged over them. What the step loop does besides
(the learning-rate schedule, logging, the NaN policy) is left out: microseconds per step. On CUDA, NVML's GPU
counters (dlx.metrics.gpu_monitor) cover the timed steps.
"""

from __future__ import annotations

from typing import Any

from dlx import device as dev
from dlx.bench.points import BenchPoint, BenchSetup
from dlx.metrics.gpu_monitor import open_gpu_counters
from dlx.metrics.meter import ThroughputMeter
from dlx.metrics.timing import PhaseTimer
from dlx.model.presets import resolve_model_args
from dlx.parallel.distributed import DistEnv
from dlx.precision import build_precision
from dlx.train.config import RunConfig, build_config
from dlx.train.data import build_train_loader
from dlx.train.run import build_model, build_run_strategy
from dlx.train.step_plan import plan_steps
from dlx.train.trainer import TimingWindow, accumulate_gradients


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
    }
    data = {"path": setup.data, "seq_len": point.seq_len, "micro_batch_size": point.micro_batch}
    return build_config({"model": model, "data": data, "train": train, "log": {"progress": False}})


def measure_point(setup: BenchSetup, point: BenchPoint) -> dict[str, Any]:
    """The ThroughputMeter record of the timed steps' mean (tokens/s, phase seconds, TFLOPS, MFU, peak memory)."""
    config = point_config(setup, point)
    device, env = setup.device, DistEnv()
    precision = build_precision(point.precision, device)
    loader = build_train_loader(config, device)
    try:
        plan = plan_steps(config, loader.batches_per_epoch, loader.windows_per_epoch, env.world_size)
        strategy = build_run_strategy(build_model(config, device), config, device, env, precision, plan)

        def step(timer: PhaseTimer) -> float:
            loss = accumulate_gradients(strategy.train_model, loader, plan.grad_accum, precision, timer, strategy)
            with timer.phase("optimizer"):  # the loop's one wait for the device, then the real update
                loss_value = loss.item()
                strategy.optimizer_step()
            return loss_value

        warmup_timer = PhaseTimer(device)
        for _ in range(setup.warmup):
            step(warmup_timer)
            warmup_timer.end_step()
        dev.reset_peak_memory(device)
        timer, window = PhaseTimer(device), TimingWindow()  # a fresh clock: the first timed step starts at its data
        gpu = open_gpu_counters(device)  # NVML over the timed steps alone (no GPU keys on a CPU)
        try:
            for _ in range(setup.steps):
                loss = step(timer)
                window.add(timer.end_step())
            gpu_columns = gpu.window()
        finally:
            gpu.close()
    finally:
        loader.close()
    meter = ThroughputMeter(config.model.args, point.seq_len, device, precision.name)
    timings = window.mean()
    record = meter.record(
        step=setup.steps, loss=loss, lr=None, grad_norm=None, tokens=point.tokens_per_step, timings=timings
    )
    return {**record, **gpu_columns}
