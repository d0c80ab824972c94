"""`build_run`: every piece a training run needs, each from its own `build_*` helper (the model and its strategy from
`dlx.train.model_build`), validated before the run folder is created (bad input leaves nothing behind)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from dlx.data.source import BatchSource
from dlx.errors import UserError
from dlx.metrics.logger import EVAL_FILE, METRICS_FILE, MetricsLogger, read_jsonl
from dlx.metrics.meter import ThroughputMeter
from dlx.metrics.timing import PhaseTimer
from dlx.model.llama import Transformer
from dlx.parallel.build import check_strategy_installed
from dlx.parallel.distributed import DistEnv, job_store, main_decides
from dlx.parallel.float8 import check_float8_installed, float8_header
from dlx.parallel.heartbeat import Heartbeat
from dlx.parallel.strategy import Strategy
from dlx.parallel.tensor import check_layout
from dlx.parallel.traits import STRATEGY_TRAITS
from dlx.precision import Precision, build_precision
from dlx.train import checkpoint as ckpt
from dlx.train.attention import AttentionObserver, attention_shape, choose_run_attention
from dlx.train.config import RunConfig
from dlx.train.console import RunConsole
from dlx.train.data import DatasetInfo, build_train_loader, inspect_dataset
from dlx.train.init_from import InitSource, describe_changes
from dlx.train.memory_check import check_memory
from dlx.train.model_build import build_run_strategy, initial_weights, meta_model, resolve_initial_weights
from dlx.train.objective import Objective, build_objective
from dlx.train.observe import bpb_note, build_observers, check_observers, check_wandb_installed
from dlx.train.observer import ObserverList
from dlx.train.optim import build_scheduler
from dlx.train.preflight import Preflight, run_preflight
from dlx.train.restore import create_run_dir, find_checkpoint, resolve_run_dir, restore, unused_checkpoint_keys
from dlx.train.runlock import RunLock
from dlx.train.signals import GracefulStop
from dlx.train.spikes import SpikeGuard
from dlx.train.step_plan import StepPlan, header_lines, plan_steps
from dlx.train.tasks import build_task_evaluation, load_run_tasks


@dataclass
class RunProgress:
    """What happened: where the run stands, what it logged, its checkpoints, and how it ended. The loop and
    `finish` change it; everything else in a `Run` is fixed once `build_run` returns."""

    state: ckpt.TrainerState
    """The step, the tokens seen, the batches skipped, the loader's position: what a checkpoint saves."""
    last_checkpoint: Path | None = None
    """The newest complete checkpoint: this run's latest, or the one it resumed from."""
    last_save: ckpt.PendingSave | None = None
    """The latest save this run started; with checkpoint.async it may still be writing."""
    records: list[dict[str, Any]] = field(default_factory=list)
    resumed_records: int = 0
    """How many of `records` a resumed run read back from metrics.jsonl (this process logged the rest)."""
    eval_records: list[dict[str, Any]] = field(default_factory=list)
    verdict: Any = None
    """The bottleneck verdict, once the run has finished (rank 0)."""
    stopped_early: bool = False
    """A signal reached some rank and all ranks stopped after the same step."""

    @property
    def step(self) -> int:
        """The last optimizer step done (0 before the first)."""
        return self.state.step

    def advance(self, step: int, tokens: int) -> None:
        """Optimizer step `step` is done; it read `tokens` tokens."""
        self.state.step, self.state.tokens_seen = step, self.state.tokens_seen + tokens

    def wait_for_save(self) -> None:
        """Wait for a background save still writing; it is then the last checkpoint."""
        if self.last_save is not None and not self.last_save.settled:
            self.last_checkpoint = self.last_save.wait()


@dataclass(frozen=True)
class Run:
    """What was built for a training run (read-only once `build_run` returns), and its `progress`."""

    config: RunConfig
    run_dir: Path
    device: torch.device
    strategy: Strategy
    """What differs between one process, DDP, FSDP and DeepSpeed: gradient sync, the update, checkpoints. It holds
    the model (bare and wrapped), the optimizer, the precision and this rank's place in the world."""
    scheduler: torch.optim.lr_scheduler.LRScheduler
    loader: BatchSource
    """The training batches (`dlx.train.data.build_train_loader`)."""
    plan: StepPlan
    timer: PhaseTimer
    meter: ThroughputMeter
    logger: MetricsLogger
    console: RunConsole
    stop: GracefulStop
    data_info: DatasetInfo
    observers: ObserverList
    """GPU counters, samples, the profiler, W&B (dlx.train.observe): the loop calls them, never one by name."""
    progress: RunProgress
    """What happened: the step, the records, the checkpoints, the verdict."""
    header: list[str] = field(default_factory=list)
    """The start-up header, repeated in report.md."""
    objective: Objective = field(default_factory=Objective)
    """The z-loss (train.z_loss) and document ids for the model (data.document_mask), in the step and in eval."""
    init: InitSource | None = None
    """Where the initial weights came from (model.init_from), when they were loaded."""
    lock: RunLock | None = None
    """The run folder's writer lock, held by rank 0 (dlx.train.runlock)."""
    heartbeat: Heartbeat = field(default_factory=lambda: Heartbeat(None, 0, 1, 0.0))
    """Each rank's step and phase in the job's store: names the rank a failed collective waited for."""
    spikes: SpikeGuard = field(init=False)
    """train.spike_policy: judges each step's loss in the loop; as the last observer, rolls the run back between
    steps (dlx.train.spikes)."""

    def __post_init__(self) -> None:
        spikes = next((o for o in self.observers if isinstance(o, SpikeGuard)), None)
        if spikes is None:
            spikes = SpikeGuard(self)
            self.observers.extend([spikes])
        spikes.run = self  # it restores this run's pieces on a rollback; a `dataclasses.replace` copy keeps the guard
        object.__setattr__(self, "spikes", spikes)  # the Run is frozen once built; this is part of building it

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


def check_optional_features(config: RunConfig) -> None:
    check_strategy_installed(config.parallel)
    check_wandb_installed(config)
    if config.train.float8:
        check_float8_installed()
    if config.log.tensorboard:
        try:
            import torch.utils.tensorboard  # noqa: F401
        except ImportError:
            raise UserError(
                "log.tensorboard is true but tensorboard is missing: pip install 'dlx[tensorboard]'"
            ) from None


def build_run(
    config: RunConfig,
    name: str,
    run_dir: Path | None,
    resume: bool,
    stop: GracefulStop,
    env: DistEnv,
    device: torch.device,
) -> Run:
    """Validate, build, restore (on --resume), and only then create the run folder. Rank 0 takes the decisions that
    touch the file system (which folder, which checkpoint) and every rank gets them, or the same one-line error."""
    data_info = inspect_dataset(config)
    check_layout(config.parallel, env.world_size)
    run_dir = main_decides(lambda: resolve_run_dir(config, name, run_dir, resume))
    lock = RunLock(run_dir)
    checked = main_decides(lambda: run_preflight(config, run_dir, resume, env.dp_size))
    precision = build_precision(
        config.train.precision, device, engine_managed=STRATEGY_TRAITS[config.parallel.strategy].owns_precision
    )
    checked = checked.with_check(check_memory(config, device, env, precision.name))
    loader = build_train_loader(config, device, env.dp_rank, env.dp_size)  # the TP ranks of a replica: one batch
    try:
        if resume:
            main_decides(lock.acquire)  # before any write; a new run's folder is locked once it exists (create_run_dir)
        plan = plan_steps(config, loader.batches_per_epoch, loader.windows_per_epoch, env.dp_size, env.tp)
        shape = attention_shape(config, plan.micro_batch_size, env.tp, precision.name)
        attention = main_decides(lambda: choose_run_attention(config, shape, device))  # timed before the model exists
        console = RunConsole(plan.total_steps, 0, config.log.progress, is_main=env.is_main)
        loaded = find_checkpoint(run_dir, console, env) if resume else None
        init = resolve_initial_weights(config, data_info, loaded is not None, console)
        tokenizer = data_info.tokenizer or (init.tokenizer if init is not None else None)
        sampler = check_observers(config, plan.total_steps, tokenizer)
        tasks = load_run_tasks(config.eval, tokenizer, main_decides)  # eval.tasks, checked before step 1
        fill = initial_weights(init, device, config)
        strategy = build_run_strategy(meta_model(config), config, device, env, precision, plan, fill)
        scheduler = build_scheduler(strategy.optimizer, config.train, plan.total_steps)  # stepped by the loop
        state, last = restore(run_dir, resume, loaded, strategy, scheduler, loader, console)
        main_decides(lambda: create_run_dir(config, run_dir, data_info, init, None if resume else lock))
    except BaseException:
        loader.close()
        lock.release()
        raise
    console.progress.update(console.task, completed=state.step)
    before = plan.micro_batch_size * plan.grad_accum * max(state.world_size // env.tp, 1)
    if (
        last is not None
        and state.world_size != env.world_size
        and before != plan.total_batch
        and not config.train.global_batch_size
    ):
        console.warn(
            f"the checkpoint was written by {state.world_size} rank(s), this run has {env.world_size}: with "
            f"train.grad_accum the global batch goes from {before} to {plan.total_batch} sequences; set "
            f"train.global_batch_size {before} to keep it"
        )
    for note in unused_checkpoint_keys(config.checkpoint, strategy.checkpoint_format):
        console.warn(note)
    resume_step = state.step if resume else None
    logger = MetricsLogger(run_dir, config.log.tensorboard, is_main=env.is_main, resume_step=resume_step)
    timer = PhaseTimer(device)
    meter = ThroughputMeter(config.model.args, config.data.seq_len, device, precision.name, env.world_size)
    # A resumed run's report covers the whole run: the records before the checkpoint (the logger kept only those).
    records = read_jsonl(run_dir / METRICS_FILE)
    evals = read_jsonl(run_dir / EVAL_FILE)
    progress = RunProgress(state, last, records=records, resumed_records=len(records), eval_records=evals)
    task_eval = build_task_evaluation(
        tasks, tokenizer, config.eval.tasks_every, strategy.model, precision, env, logger, console, progress
    )
    observers = build_observers(
        config, run_dir, env, device, timer, console, logger, strategy.model, sampler, task_eval
    )
    applied = AttentionObserver(attention, config.data.document_mask, device).apply(strategy.model)
    observers = ObserverList([applied, *observers])  # first: its header line beside the model's
    return Run(
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
        progress=progress,
        header=[
            *build_header(plan, strategy, device, meter, checked, observers, init),
            *(float8_header(strategy.model, config.train.float8_recipe, device) if config.train.float8 else []),
            *bpb_note(config, data_info),
        ],
        objective=build_objective(config.train.z_loss, config.data.document_mask, data_info.eos_id),
        init=init,
        lock=lock,
        heartbeat=Heartbeat(job_store(), env.rank, env.world_size, config.parallel.timeout_s),
    )


def build_header(
    plan: StepPlan,
    strategy: Strategy,
    device: torch.device,
    meter: ThroughputMeter,
    preflight: Preflight | None,
    observers: ObserverList,
    init: InitSource | None,
) -> list[str]:
    """The start-up header: the step plan, the model and device, the meter's conventions, what preflight checked,
    the observers' lines, and where the initial weights came from."""
    from dlx.device import device_name

    # ds_numel: a ZeRO-3 parameter's full size (its local tensor is empty); a DTensor's numel is already the full one
    trainable = sum(getattr(p, "ds_numel", p.numel()) for p in strategy.model.parameters() if p.requires_grad)
    header = header_lines(plan, trainable, strategy.precision.name, device_name(device)) + meter.header()
    header += preflight.lines() if preflight else []
    header += observers.header()
    if init is not None:
        header.append(f"initial weights: {init.describe()}")
        changes = describe_changes(init.args(), strategy.model.args)
        if changes:
            header.append(f"changed at init_from: {', '.join(changes)}")
    return header
