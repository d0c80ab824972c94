"""Preflight's memory check: `dlx plan`'s estimate (`dlx.metrics.estimate`) for the run's layout against the memory the
device has free, before anything is built, so that a run that cannot fit is refused in one line instead of swapping
or dying at step 1.

What is compared, per rank: the estimate of weights, gradients, optimizer state, activations and the loss's buffers
for this run's model, micro-batch, sequence length, precision, strategy, tensor parallelism and activation
checkpointing, against the free memory of this rank's GPU (the smallest over the ranks, so that every rank takes the
same decision), or on a CPU the memory available now (psutil) shared by the ranks on this host. The estimate is the
peak of live tensors; allocator slack, the CUDA context and the loader's workers are not in it. On a CPU glibc's heaps
keep freed blocks below its mmap threshold, so the process grows 14-46 % more than its tensors (BENCHMARKS.md,
Memory estimate): a run within that margin of the available memory passes the check with a warning on its memory
line (it may swap). The refusal names the largest micro-batch that fits, or activation checkpointing, or sharding;
`train.skip_memory_check` runs anyway.
"""

from __future__ import annotations

import os
import time
from dataclasses import replace

import torch

from dlx import device as dev
from dlx.errors import UserError
from dlx.metrics.estimate import TrainingShape, max_micro_batch, plan_memory
from dlx.parallel.distributed import DistEnv, all_reduce
from dlx.train.build.preflight import CheckResult
from dlx.train.build.stages import resolve_stages
from dlx.train.config import RunConfig

CPU_HEAP_GROWTH = 0.46
"""The most a CPU run's resident memory grew beyond its live tensors in bench_memory_estimate (14-46 %): free memory
within it is a warning on the memory line, not a refusal, since the growth depends on allocation history."""


def run_shape(config: RunConfig, device: torch.device, world_size: int, precision: str) -> TrainingShape:
    """The run's layout in `dlx plan`'s words."""
    data = config.data
    return TrainingShape.of(
        config.parallel,
        seq_len=data.seq_len,
        micro_batch=data.micro_batch_size,
        precision=precision,
        world_size=world_size,
        device_type=device.type,
        attention=config.train.attention,
        document_mask=data.document_mask,
    )


def largest_stage_shape(config: RunConfig, shape: TrainingShape, dp_size: int) -> tuple[TrainingShape, str]:
    """With data.stages, the shape of the stage whose estimate is largest, and ` (stage i, seq_len N)` to say so."""
    plan = resolve_stages(config, dp_size)
    if plan is None:
        return shape, ""
    shapes = [(replace(shape, seq_len=s.seq_len, micro_batch=s.micro_batch_size), s) for s in plan.stages]
    largest, stage = max(shapes, key=lambda pair: plan_memory(config.model.args, pair[0]).total_gb)
    return largest, f" at its largest stage (stage {stage.index}, seq_len {stage.seq_len:,})"


def free_memory_gb(device: torch.device) -> float:
    """This rank's share of free memory: the GPU's free memory, or a CPU's available memory ÷ the ranks on this host."""
    if device.type == "cuda":
        return dev.free_gpu_memory_gb(device)
    return dev.available_memory_gb() / int(os.environ.get("LOCAL_WORLD_SIZE", "1"))


def check_memory(config: RunConfig, device: torch.device, env: DistEnv, precision: str) -> CheckResult:
    """Preflight's `memory` line; UserError (the same on every rank) when the estimate exceeds the free memory."""
    start = time.perf_counter()
    if device.type not in ("cuda", "cpu"):
        return CheckResult("memory", 0.0, f"not estimated on {device.type}")
    args = config.model.args
    shape, stage = largest_stage_shape(config, run_shape(config, device, env.world_size, precision), env.dp_size)
    need = plan_memory(args, shape).total_gb
    free = -all_reduce([-free_memory_gb(device)], "max", device)[0]  # the smallest over the ranks
    found = f"~{need:.3g} GB estimated per rank{stage}, {free:.3g} GB free"
    if need > free and not config.train.skip_memory_check:
        raise UserError(
            f"this run needs ~{need:.3g} GB per rank by `dlx plan`'s estimate but {free:.3g} GB is free on "
            f"{'the GPU' if device.type == 'cuda' else 'this host'}; {what_fits(args, shape, free)}, or set "
            "train.skip_memory_check true to run anyway"
        )
    note = "train.skip_memory_check: running although the estimate exceeds the free memory" if need > free else None
    if device.type == "cpu" and need <= free < need * (1 + CPU_HEAP_GROWTH):
        note = (
            f"{free:.3g} GB free is within the {CPU_HEAP_GROWTH:.0%} a CPU process grows beyond its tensors "
            "(glibc's heaps, BENCHMARKS.md Memory estimate): this run may swap"
        )
    return CheckResult("memory", time.perf_counter() - start, found, note)


def what_fits(args, shape: TrainingShape, free_gb: float) -> str:
    """The nearest change that fits: a smaller micro-batch, activation checkpointing, or sharding."""
    micro = max_micro_batch(args, shape, free_gb, limit=shape.micro_batch)
    if micro:
        return f"data.micro_batch_size {micro} fits (raise train.grad_accum to keep the batch)"
    if shape.activation_checkpointing != "full":
        micro = max_micro_batch(args, replace(shape, activation_checkpointing="full"), free_gb, limit=shape.micro_batch)
        if micro:
            return f"parallel.activation_checkpointing full with data.micro_batch_size {micro} fits"
    return (
        "not even micro-batch 1 with activation checkpointing fits: shard the model over more devices "
        "(parallel.strategy fsdp), shorten data.seq_len, or pick a smaller model"
    )
