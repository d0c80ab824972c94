"""The observers a run has (`dlx.train.observers.base`): the attention kernel (dlx.train.observers.attention), GPU
counters (`log.nvml`), samples (`eval.sample_*`), downstream tasks (`eval.tasks`, dlx.train.observers.tasks), what
torch.compile compiled (`train.compile`, dlx.train.observers.compiles), the
profiler (`profile.*`), Weights & Biases (`log.wandb`) and the spike guard (`train.spike_policy`,
dlx.train.observers.spikes), each an `Observer` around its `dlx.metrics` (or `dlx.evals`) class, which knows nothing of
the loop, all built by `build_observers`.

`check_observers` and `check_wandb_installed` run before the run folder exists (bad input leaves nothing behind).
"""

from __future__ import annotations

import math
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from dlx.data.token_bytes import read_token_bytes
from dlx.errors import UserError
from dlx.metrics.gpu_monitor import RECORD_KEYS, NoGpuCounters, NvmlCounters, open_gpu_counters
from dlx.metrics.logger import MetricsLogger
from dlx.metrics.profiler import ProfileWindow, StepProfiler
from dlx.metrics.records import PROFILED_KEY
from dlx.metrics.timing import PhaseTimer
from dlx.model.attention_kernels import AttentionChoice
from dlx.parallel import distributed
from dlx.parallel.distributed import DistEnv
from dlx.parallel.strategy import Strategy
from dlx.train.build.compile_cache import CompileCache
from dlx.train.build.console import RunConsole
from dlx.train.build.stages import resolve_stages
from dlx.train.config import RunConfig
from dlx.train.observers.attention import AttentionObserver
from dlx.train.observers.base import Observer, ObserverList
from dlx.train.observers.compiles import CompileObserver
from dlx.train.observers.sample import SampleObserver, TrainingSampler, build_sampler
from dlx.train.observers.spikes import SpikeGuard
from dlx.train.observers.stages import StageObserver
from dlx.train.observers.tasks import build_task_evaluation, load_run_tasks

if TYPE_CHECKING:
    from dlx.evals.harness import TaskSet
    from dlx.metrics.wandb_sink import WandbSink
    from dlx.train.build.data import DatasetInfo


def check_observers(
    config: RunConfig, total_steps: int, tokenizer: Path | None
) -> tuple[TrainingSampler | None, TaskSet | None]:
    """The profile window within the run's steps, the sampler (its prompts encoded) and eval.tasks (loaded on rank 0
    first); UserError otherwise."""
    profile = config.profile
    if profile.steps and profile.start + profile.steps - 1 > total_steps:
        raise UserError(
            f"profile.start {profile.start} + profile.steps {profile.steps} run past the run's {total_steps} "
            f"optimizer steps; profile steps {profile.start}..{profile.start + profile.steps - 1} must exist"
        )
    sampler = build_sampler(config.eval, tokenizer, config.data.path)
    return sampler, load_run_tasks(config.eval, tokenizer, distributed.main_decides)


def check_wandb_installed(config: RunConfig) -> None:
    """`log.wandb` without the package or credentials: refused on rank 0 before step 1 (dlx.metrics.wandb_sink)."""
    if config.log.wandb and distributed.env_from_torchrun().is_main:
        from dlx.metrics.wandb_sink import check_wandb

        check_wandb()


def build_observers(
    config: RunConfig,
    run_dir: Path,
    env: DistEnv,
    device: torch.device,
    timer: PhaseTimer,
    console: RunConsole,
    logger: MetricsLogger,
    strategy: Strategy,
    sampler: TrainingSampler | None,
    tasks: TaskSet | None = None,
    tokenizer: Path | None = None,
    attention: AttentionChoice | None = None,
    compile_cache: CompileCache | None = None,
    resumed_at: int = 0,
) -> ObserverList:
    """Every observer of a run, the same on every rank, sorted by `order` (the order of their header lines): the
    attention kernel (applied to the model here), GPU counters, samples, tasks (`tasks` with the run's `tokenizer`),
    the compile account (`compile_cache`: under train.compile), the profiler, W&B, the spike guard. The sampler passes
    its samples, the task evaluation its metrics, on to all of them (W&B)."""
    observers, model = ObserverList(), strategy.model
    applied = [AttentionObserver(attention, config.data.document_mask, device).apply(model)] if attention else []
    gpu = GpuObserver(open_gpu_counters(device, config.log.nvml), env, device)
    samples = [SampleObserver(sampler, model, logger, console, observers.on_sample)] if sampler is not None else []
    evaluation = build_task_evaluation(
        tasks, tokenizer, config.eval.tasks_every, model, strategy.precision, env, logger, console
    )
    if evaluation is not None:
        evaluation.publish = observers.on_tasks
    evaluations = [evaluation] if evaluation is not None else []
    compiles = [CompileObserver(compile_cache, resumed_at)] if compile_cache is not None else []
    profiler = ProfilerObserver(build_profiler(config, run_dir, env, device, timer, console), env.rank)
    wandb = [WandbObserver(open_wandb(config, run_dir, env, console))] if config.log.wandb else []
    plan = resolve_stages(config, env.dp_size)
    stages = [StageObserver(plan)] if plan is not None else []
    every = [*applied, *stages, gpu, *samples, *evaluations, *compiles, profiler, *wandb, SpikeGuard(config.train)]
    observers.extend(every)
    return observers


def open_wandb(config: RunConfig, run_dir: Path, env: DistEnv, console: RunConsole) -> WandbSink | None:
    """Rank 0's W&B run; None on the other ranks and without `log.wandb`."""
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


class GpuObserver(Observer):
    """NVML's GPU counters per record (mean over ranks; null where any rank had none), or the header's reason why
    there are none. On CUDA under torchrun every rank joins the one collective, counters or not."""

    order = 10

    def __init__(self, counters: NvmlCounters | NoGpuCounters, env: DistEnv, device: torch.device) -> None:
        self.counters, self.env, self.device = counters, env, device

    def header(self) -> list[str]:
        return [self.counters.describe()]

    def columns(self, step: int) -> dict[str, Any]:
        columns: dict[str, Any] = dict(self.counters.window())
        if not (self.env.is_distributed and self.device.type == "cuda"):
            return columns
        own = [math.nan if columns.get(key) is None else float(columns[key]) for key in RECORD_KEYS]
        mean = distributed.all_reduce(own, "mean", self.device)
        return {key: None if math.isnan(v) else v for key, v in zip(RECORD_KEYS, mean, strict=True) if key in columns}

    def close(self) -> None:
        self.counters.close()


class ProfilerObserver(Observer):
    """torch.profiler around the `profile.*` steps (nothing outside them); each record names the profiled steps
    it covers."""

    order = 40

    def __init__(self, profiler: StepProfiler, rank: int) -> None:
        self.profiler, self.rank = profiler, rank

    def header(self) -> list[str]:
        window = self.profiler.window
        if not window.steps:
            return []
        return [f"Profile: torch.profiler over steps {window.start}..{window.last} -> profile/ (rank {self.rank})"]

    def step(self, step: int) -> AbstractContextManager[Any]:
        return self.profiler.step(step)

    def columns(self, step: int) -> dict[str, Any]:
        profiled = self.profiler.take_profiled_steps()
        return {PROFILED_KEY: profiled} if profiled else {}

    def close(self) -> None:
        self.profiler.close()


class WandbObserver(Observer):
    """Every record, evaluation and sample to W&B as it is logged, and the verdict, report.md and plots at the end;
    `sink` is None on the ranks other than 0."""

    def __init__(self, sink: WandbSink | None) -> None:
        self.sink = sink

    def on_record(self, record: dict[str, Any]) -> None:
        if self.sink is not None:
            self.sink.log("train", record)

    def on_eval(self, record: dict[str, Any]) -> None:
        if self.sink is not None:
            self.sink.log("eval", record)

    def on_sample(self, record: dict[str, Any]) -> None:
        if self.sink is not None:
            self.sink.log_sample(record)

    def on_tasks(self, record: dict[str, Any]) -> None:
        if self.sink is not None:
            self.sink.log("tasks", record)

    def on_report(self, step: int, verdict: Any, files: list[Path]) -> None:
        if self.sink is not None:
            self.sink.finish_run(step, verdict, files)

    def close(self) -> None:
        if self.sink is not None:
            self.sink.close()


def bpb_note(config: RunConfig, data_info: DatasetInfo) -> list[str]:
    """Why validation records have no bits per byte, when they have none."""
    path = data_info.path
    if not config.eval.every or (path is not None and read_token_bytes(path) is not None):
        return []
    why = "synthetic data has no tokenizer" if path is None else "the tokenizer is not byte-level BPE"
    return [f"Bits per byte: n/a in eval.jsonl ({why})"]


def report_files(run_dir: Path) -> list[Path]:
    """What the observers get at the end: report.md and its plots (tasks.png with eval.tasks)."""
    names = ("report.md", "loss.png", "throughput.png", "phases.png", "tasks.png")
    return [run_dir / name for name in names if name != "tasks.png" or (run_dir / name).is_file()]
