"""`build_run`: every piece a training run needs, each from its own `build_*` helper (the checks before anything is
built from `dlx.train.start`, the model and its strategy from `dlx.train.build.model`, the observers from
`dlx.train.observers.build`), validated before the run folder is written (bad input leaves nothing behind)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from dlx.data.source import BatchSource
from dlx.metrics.logger import MetricsLogger
from dlx.metrics.meter import ThroughputMeter
from dlx.metrics.timing import PhaseTimer
from dlx.model.llama import Transformer
from dlx.parallel.distributed import DistEnv, job_store, main_decides
from dlx.parallel.heartbeat import Heartbeat
from dlx.parallel.strategy import Strategy
from dlx.precision import Precision
from dlx.train.build.compile_cache import CompileCache, compile_key, open_compile_cache
from dlx.train.build.console import RunConsole
from dlx.train.build.data import DatasetInfo, build_train_loader
from dlx.train.build.model import build_run_strategy, initial_weights, meta_model, resolve_initial_weights
from dlx.train.build.objective import Objective, build_objective
from dlx.train.build.optim import ScheduledLR, build_scheduler
from dlx.train.build.progress import RunProgress, read_progress
from dlx.train.build.restore import announce_resume, claimed_run_dir, create_run_dir, find_checkpoint, restore
from dlx.train.build.signals import GracefulStop
from dlx.train.build.stages import StagePlan, resolve_stages
from dlx.train.build.step_plan import StepPlan, plan_steps
from dlx.train.config import RunConfig
from dlx.train.observers.attention import choose_for_run
from dlx.train.observers.base import ObserverList
from dlx.train.observers.build import build_observers, check_observers
from dlx.train.rundir.runlock import RunLock
from dlx.train.rundir.trained import TrainedSource
from dlx.train.start import build_header, check_start


@dataclass(frozen=True)
class Run:
    """What was built for a training run (read-only once `build_run` returns), and its `progress`."""

    config: RunConfig
    run_dir: Path
    device: torch.device
    strategy: Strategy
    """What differs between one process, DDP, FSDP and DeepSpeed: gradient sync, the update, checkpoints. It holds
    the model (bare and wrapped), the optimizer, the precision and this rank's place in the world."""
    scheduler: ScheduledLR
    loader: BatchSource
    """The training batches (`dlx.train.build.data.build_train_loader`)."""
    plan: StepPlan
    timer: PhaseTimer
    meter: ThroughputMeter
    logger: MetricsLogger
    console: RunConsole
    stop: GracefulStop
    data_info: DatasetInfo
    observers: ObserverList
    """Attention, GPU counters, samples, tasks, the profiler, W&B, the spike guard (dlx.train.observers.build): the loop
    calls them, never one by name; each was attached to this run (`RunView`) once it was built."""
    progress: RunProgress
    """What happened: the step, the records, the checkpoints, the verdict."""
    header: list[str] = field(default_factory=list)
    """The start-up header, repeated in report.md."""
    objective: Objective = field(default_factory=Objective)
    """The z-loss (train.z_loss) and document ids for the model (data.document_mask), in the step and in eval."""
    init: TrainedSource | None = None
    """Where the run's starting weights came from, when it started from trained ones (not its checkpoint)."""
    lock: RunLock | None = None
    """The run folder's writer lock, held by rank 0 (dlx.train.rundir.runlock)."""
    heartbeat: Heartbeat = field(default_factory=lambda: Heartbeat(None, 0, 1, 0.0))
    """Each rank's step and phase in the job's store: names the rank a failed collective waited for."""
    stages: StagePlan | None = None
    """data.stages resolved (`dlx.train.build.stages`): each stage's steps, data, shape and RoPE; None without."""

    @property
    def model(self) -> Transformer:
        """The bare model (under FSDP: sharded in place); checkpoints and sampling use it."""
        return self.strategy.model

    @property
    def train_model(self) -> nn.Module:
        """What the step calls: the model after `dlx.parallel.wrap.parallelize` (or the DeepSpeed engine)."""
        return self.strategy.train_model

    @property
    def precision(self) -> Precision:
        return self.strategy.precision

    @property
    def env(self) -> DistEnv:
        """This rank and the world size (rank 0 of 1 without torchrun)."""
        return self.strategy.env

    def beat(self, step: int, phase: str) -> None:
        """This rank reached `phase` of `step` (dlx.parallel.heartbeat); rank 0 keeps its writer lock fresh."""
        self.heartbeat.beat(step, phase)
        if self.lock is not None:
            self.lock.refresh()

    def close(self) -> None:
        """Abandon an unfinished save, stop the loader's workers, close the observers (GPU sampler, a profile cut
        short, W&B), flush the logs; safe to call twice."""
        try:
            self.heartbeat.close()
            if self.progress.last_save is not None:
                self.progress.last_save.abandon()
            self.console.stop()
            self.loader.close()
        finally:
            try:
                self.observers.close()
            finally:
                self.logger.close()
                if self.lock is not None:
                    self.lock.release()


def build_compile_cache(config: RunConfig, plan: StepPlan, precision: str, device: torch.device) -> CompileCache | None:
    """Under train.compile: the compile cache for this model and shape, set for this process before step 1."""
    if not config.train.compile:
        return None
    return open_compile_cache(compile_key(config, plan.micro_batch_size, precision, device))


def build_run(
    config: RunConfig,
    name: str,
    run_dir: Path | None,
    resume: bool,
    stop: GracefulStop,
    env: DistEnv,
    device: torch.device,
) -> Run:
    """Check (`check_start`), build, restore (on --resume), and only then write the run folder; rank 0 decides what
    touches the file system. The observers get their saved state and the built run (`attach`)."""
    start = check_start(config, name, run_dir, resume, env, device)
    run_dir, data_info, precision = start.run_dir, start.data_info, start.precision
    loader = build_train_loader(config, device, env.dp_rank, env.dp_size)  # the TP ranks of a replica: one batch
    lock = RunLock(run_dir)
    with claimed_run_dir(lock, resume, loader):  # before anything is written there; given back if building fails
        stages = resolve_stages(config, env.dp_size)
        shapes = stages.shapes() if stages is not None else ()
        plan = plan_steps(config, loader.batches_per_epoch, loader.windows_per_epoch, env.dp_size, env.tp, shapes)
        attention = choose_for_run(config, plan.micro_batch_size, env, precision.name, device)
        console = RunConsole(plan.total_steps, 0, config.log.progress, is_main=env.is_main)
        loaded = find_checkpoint(run_dir, console, env, loader) if resume else None
        init = resolve_initial_weights(config, data_info, loaded is not None, console)
        tokenizer = data_info.tokenizer or (init.tokenizer if init is not None else None)
        sampler, tasks = check_observers(config, plan.total_steps, tokenizer)  # eval.sample_*, eval.tasks, profile.*
        fill = initial_weights(init, device, config)
        strategy = build_run_strategy(meta_model(config), config, device, env, precision, plan, fill)
        scheduler = build_scheduler(strategy.optimizer, config.train, plan.total_steps)  # stepped by the loop
        state, last = restore(run_dir, resume, loaded, strategy, scheduler, loader, console)
        main_decides(lambda: create_run_dir(config, run_dir, data_info, init))
    announce_resume(config, state, last, plan, strategy, console)
    logger = MetricsLogger(run_dir, config.log.tensorboard, env.is_main, resume_step=state.step if resume else None)
    timer = PhaseTimer(device)
    meter = ThroughputMeter(config.model.args, config.data.seq_len, device, precision.name, env.world_size)
    observers = build_observers(
        config,
        run_dir,
        env,
        device,
        timer,
        console,
        logger,
        strategy,
        sampler,
        tasks,
        tokenizer,
        attention,
        build_compile_cache(config, plan, precision.name, device),
        state.step if resume else 0,
    )
    run = Run(
        config=config,
        run_dir=run_dir,
        device=device,
        strategy=strategy,
        scheduler=scheduler,
        loader=loader,
        plan=plan,
        timer=timer,
        meter=meter,
        logger=logger,
        console=console,
        stop=stop,
        data_info=data_info,
        observers=observers,
        progress=read_progress(run_dir, state, last),
        header=build_header(config, plan, strategy, device, meter, start, observers, init, loader),
        objective=build_objective(config.train.z_loss, config.data.document_mask, data_info.eos_id),
        init=init,
        lock=lock,
        heartbeat=Heartbeat(job_store(), env.rank, env.world_size, config.parallel.timeout_s),
        stages=stages,
    )
    observers.load_state_dict(state.observers)
    observers.attach(run)
    return run
