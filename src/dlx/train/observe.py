"""What a run shows besides its step records, hooked into the loop one hop away: samples (`eval.sample_*`), the
profiler (`profile.*`), GPU counters (`log.nvml`) and Weights & Biases (`log.wandb`).

`check_observers` runs before the run folder exists (bad input leaves nothing behind); the rest is built with the
run, called from `log_step`, `between_steps` and `finish`, and closed with it.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from dlx.data.token_bytes import read_token_bytes
from dlx.errors import UserError
from dlx.metrics.gpu_monitor import RECORD_KEYS
from dlx.metrics.profiler import PROFILED_KEY, ProfileWindow, StepProfiler
from dlx.metrics.timing import PhaseTimer
from dlx.parallel import distributed
from dlx.parallel.distributed import DistEnv
from dlx.train.config import RunConfig
from dlx.train.console import RunConsole
from dlx.train.sample import TrainingSampler, build_sampler, sample_during_training

if TYPE_CHECKING:
    from dlx.metrics.wandb_sink import WandbSink
    from dlx.train.run import Run


def check_observers(config: RunConfig, total_steps: int, tokenizer: Path | None) -> TrainingSampler | None:
    """The profile window within the run's steps, and the sampler (its prompts encoded); UserError otherwise."""
    profile = config.profile
    if profile.steps and profile.start + profile.steps - 1 > total_steps:
        raise UserError(
            f"profile.start {profile.start} + profile.steps {profile.steps} run past the run's {total_steps} "
            f"optimizer steps; profile steps {profile.start}..{profile.start + profile.steps - 1} must exist"
        )
    return build_sampler(config.eval, tokenizer, config.data.path)


def check_wandb_installed(config: RunConfig) -> None:
    """`log.wandb` without the package or credentials: refused on rank 0 before step 1 (dlx.metrics.wandb_sink)."""
    if config.log.wandb and distributed.env_from_torchrun().is_main:
        from dlx.metrics.wandb_sink import check_wandb

        check_wandb()


def open_wandb(config: RunConfig, run_dir: Path, env: DistEnv, console: RunConsole) -> WandbSink | None:
    if not (config.log.wandb and env.is_main):
        return None
    from dlx.metrics.wandb_sink import WandbSink

    return WandbSink(run_dir, config.log.wandb_project, config.log.wandb_name, config.resolved(), console.warn)


def build_profiler(
    config: RunConfig, run_dir: Path, env: DistEnv, device: torch.device, timer: PhaseTimer, console: RunConsole
) -> StepProfiler:
    p = config.profile
    window = ProfileWindow(p.start, p.steps, p.with_stack, p.top_ops, p.memory_snapshot)
    return StepProfiler(window, run_dir, env.rank, device, timer, console.print, distributed.barrier)


def observed_columns(run: Run) -> dict[str, Any]:
    """What the step record adds: the GPU counters (mean over ranks; null where any rank had none) and the
    profiled steps of the window. On CUDA under torchrun every rank joins the one collective, counters or not."""
    columns: dict[str, Any] = dict(run.gpu.window())
    if run.env.is_distributed and run.device.type == "cuda":
        values = [columns.get(key) for key in RECORD_KEYS]
        own = [math.nan if value is None else float(value) for value in values]
        mean = distributed.all_reduce(own, "mean", run.device)
        columns = {
            key: None if math.isnan(v) else v for key, v in zip(RECORD_KEYS, mean, strict=True) if key in columns
        }
    profiled = run.profiler.take_profiled_steps()
    if profiled:
        columns[PROFILED_KEY] = profiled
    return columns


def log_samples(run: Run, step: int) -> None:
    """Every rank generates (FSDP and ZeRO-3 forwards gather shards); rank 0 prints and writes samples.jsonl."""
    records = sample_during_training(run.model, run.sampler, step)
    for record in records:
        run.logger.log_sample(record)
        run.console.print(f"sample step {step} | {record['prompt']!r} →\n{record['text']}")


def observer_header(run: Run) -> list[str]:
    """Header lines: how the GPU columns are measured (or why not), where samples and profiles go."""
    lines = [run.gpu.describe()]
    if run.sampler is not None:
        mode = "greedy" if run.sampler.temperature == 0 else f"temperature {run.sampler.temperature:g}"
        lines.append(
            f"Samples: {len(run.sampler.prompts)} prompt(s) every {run.sampler.every} steps, "
            f"{run.sampler.max_new_tokens} tokens, {mode}, seed {run.sampler.seed} -> samples.jsonl"
        )
    lines += run.tasks.header() if run.tasks is not None else []  # observers
    lines += bpb_note(run)
    window = run.profiler.window
    if window.steps:
        lines.append(
            f"Profile: torch.profiler over steps {window.start}..{window.last} -> profile/ (rank {run.env.rank})"
        )
    return lines


def bpb_note(run: Run) -> list[str]:
    """Why validation records have no bits per byte, when they have none."""
    path = run.data_info.path
    if not run.config.eval.every or (path is not None and read_token_bytes(path) is not None):
        return []
    why = "synthetic data has no tokenizer" if path is None else "the tokenizer is not byte-level BPE"
    return [f"Bits per byte: n/a in eval.jsonl ({why})"]


def report_files(run_dir: Path) -> list[Path]:
    """What W&B gets at the end: report.md and its plots."""
    names = ("report.md", "loss.png", "throughput.png", "phases.png", "tasks.png")
    return [run_dir / name for name in names if name != "tasks.png" or (run_dir / name).is_file()]
