"""One point of `dlx bench`, measured as `dlx pretrain` trains: the same recipe validation, model, precision, optimizer
and loader builders, the trainer's own `accumulate_gradients`, its PhaseTimer phases and its ThroughputMeter.

A point is: `warmup` untimed optimizer steps (kernel selection, allocator growth, torch.compile), then the peak-memory
counter is reset and `steps` timed steps follow; phase times are averaged over them. What the step loop does besides
(the learning-rate schedule, logging, the NaN policy) is left out: microseconds per step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from dlx import device as dev
from dlx.bench.points import BenchPoint
from dlx.metrics.meter import ThroughputMeter
from dlx.metrics.timing import PhaseTimer
from dlx.model.presets import resolve_model_args
from dlx.parallel.distributed import DistEnv
from dlx.parallel.wrap import parallelize
from dlx.train.config import SYNTHETIC, RunConfig, build_config
from dlx.train.data import build_train_loader
from dlx.train.optim import build_optimizer
from dlx.train.precision import Precision, build_precision
from dlx.train.run import build_model
from dlx.train.trainer import TimingWindow, accumulate_gradients


@dataclass(frozen=True)
class BenchSetup:
    """What stays fixed across a sweep."""

    model: str
    """A preset name or a YAML/JSON file of ModelArgs."""
    device: torch.device
    data: str = SYNTHETIC
    """`synthetic`, or a dataset folder written by `dlx prepare`."""
    compile: bool = False
    """torch.compile each block, as `train.compile` does."""
    steps: int = 5
    """Timed optimizer steps per point."""
    warmup: int = 2
    """Untimed optimizer steps before them."""


def point_config(setup: BenchSetup, point: BenchPoint) -> RunConfig:
    """The recipe `dlx pretrain` would run for this point; max_seq_len is raised when the point needs a longer one."""
    model: dict[str, Any] = {"preset": setup.model}
    if point.seq_len > resolve_model_args(setup.model).max_seq_len:
        model["max_seq_len"] = point.seq_len
    return build_config(
        {
            "model": model,
            "data": {"path": setup.data, "seq_len": point.seq_len, "micro_batch_size": point.micro_batch},
            "train": {
                "max_steps": setup.warmup + setup.steps,
                "grad_accum": point.grad_accum,
                "precision": point.precision,
                "device": str(setup.device),
                "compile": setup.compile,
            },
            "log": {"progress": False},
        }
    )


def measure_point(setup: BenchSetup, point: BenchPoint) -> dict[str, Any]:
    """The ThroughputMeter record of the timed steps' mean (tokens/s, phase seconds, TFLOPS, MFU, peak memory)."""
    config = point_config(setup, point)
    device = setup.device
    model = build_model(config, device)
    precision = build_precision(point.precision, device)
    train_model = parallelize(model, config.parallel, config.train.compile, device, DistEnv(), precision.name)
    optimizer = build_optimizer(model, config.train, device)
    loader = build_train_loader(config, device)
    try:
        step = _step_runner(train_model, loader, optimizer, precision, point.grad_accum, config.train.grad_clip)
        warmup_timer = PhaseTimer(device)
        for _ in range(setup.warmup):
            step(warmup_timer)
            warmup_timer.end_step()
        dev.reset_peak_memory(device)
        timer, window = PhaseTimer(device), TimingWindow()  # a fresh clock: the first timed step starts at its data
        for _ in range(setup.steps):
            loss = step(timer)
            window.add(timer.end_step())
    finally:
        loader.close()
    meter = ThroughputMeter(config.model.args, point.seq_len, device, precision.name)
    return meter.record(
        step=setup.steps, loss=loss, lr=None, grad_norm=None, tokens=point.tokens_per_step, timings=window.mean()
    )


def _step_runner(
    model: torch.nn.Module,
    loader: Any,
    optimizer: torch.optim.Optimizer,
    precision: Precision,
    grad_accum: int,
    grad_clip: float,
):
    """One optimizer step as the trainer takes it: accumulate, then (in the optimizer phase) wait for the loss, unscale,
    clip, update and clear the gradients. Returns the step's loss."""
    params = [p for group in optimizer.param_groups for p in group["params"]]

    def step(timer: PhaseTimer) -> float:
        loss = accumulate_gradients(model, loader, grad_accum, precision, timer)
        with timer.phase("optimizer"):
            loss_value = loss.item()
            precision.unscale_(optimizer)
            if grad_clip > 0:
                torch.nn.utils.clip_grad_norm_(params, grad_clip)
            precision.step(optimizer)
            optimizer.zero_grad(set_to_none=True)
        return loss_value

    return step
