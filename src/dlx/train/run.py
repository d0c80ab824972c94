"""`build_run`: every piece a training run needs, each from its own `build_*` helper, validated before the run folder
is created (bad input leaves nothing behind)."""

from __future__ import annotations

import random
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from dlx.data.shards import TOKENIZER_FILE
from dlx.errors import UserError
from dlx.metrics.logger import EVAL_FILE, METRICS_FILE, MetricsLogger, read_jsonl
from dlx.metrics.meter import ThroughputMeter
from dlx.metrics.timing import PhaseTimer
from dlx.model.llama import Transformer
from dlx.parallel.build import StepShape, build_strategy, check_strategy_installed
from dlx.parallel.distributed import DistEnv, main_decides
from dlx.parallel.strategy import Strategy
from dlx.precision import Precision, build_precision
from dlx.train import checkpoint as ckpt
from dlx.train import folder
from dlx.train.config import RunConfig
from dlx.train.console import RunConsole
from dlx.train.data import DatasetInfo, build_train_loader, inspect_dataset
from dlx.train.header import StepPlan, plan_steps
from dlx.train.optim import build_optimizer, build_scheduler
from dlx.train.preflight import Preflight, run_preflight
from dlx.train.recipe import write_resolved
from dlx.train.signals import GracefulStop


@dataclass
class Run:
    config: RunConfig
    run_dir: Path
    device: torch.device
    precision: Precision
    model: Transformer
    """The bare model (under FSDP: sharded in place); checkpoints and sampling use it."""
    train_model: nn.Module
    """What the step calls: the model after `dlx.parallel.wrap.parallelize` (or the DeepSpeed engine)."""
    strategy: Strategy
    """What differs between one process, DDP, FSDP and DeepSpeed: gradient sync, the update, checkpoints."""
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    loader: Any
    """TokenLoader or SyntheticLoader (dlx.train.data)."""
    plan: StepPlan
    state: ckpt.TrainerState
    timer: PhaseTimer
    meter: ThroughputMeter
    logger: MetricsLogger
    console: RunConsole
    stop: GracefulStop
    data_info: DatasetInfo
    env: DistEnv = field(default_factory=DistEnv)
    """This rank and the world size (rank 0 of 1 without torchrun)."""
    preflight: Preflight | None = None
    """What was checked before step 1 (dlx.train.preflight), printed in the header."""
    last_checkpoint: Path | None = None
    header: list[str] = field(default_factory=list)
    """The start-up header, repeated in report.md."""
    records: list[dict[str, Any]] = field(default_factory=list)
    eval_records: list[dict[str, Any]] = field(default_factory=list)
    verdict: Any = None
    """The bottleneck verdict, once the run has finished (rank 0)."""
    stopped_early: bool = False
    """A signal reached some rank and all ranks stopped after the same step."""

    def close(self) -> None:
        """Stop the loader's workers and flush the logs; safe to call twice."""
        try:
            self.console.stop()
            self.loader.close()
        finally:
            self.logger.close()


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def build_model(config: RunConfig, device: torch.device) -> Transformer:
    """Initialised on the device directly (an 8B model never exists on the host), from train.seed."""
    seed_everything(config.train.seed)
    with torch.device(device):
        model = Transformer(config.model.args)
    return model


def build_run_strategy(
    model: Transformer, config: RunConfig, device: torch.device, env: DistEnv, precision: Precision, plan: StepPlan
) -> Strategy:
    """The recipe's strategy around the model, with the recipe's optimizer on the wrapped parameters."""
    shape = StepShape(plan.micro_batch_size, plan.grad_accum, config.train.grad_clip)

    def make_optimizer(wrapped: nn.Module) -> torch.optim.Optimizer:
        return build_optimizer(wrapped, config.train, device)

    return build_strategy(model, config.parallel, config.train.compile, device, env, precision, make_optimizer, shape)


def resolve_run_dir(config: RunConfig, name: str, run_dir: Path | None, resume: bool) -> Path:
    if not resume:
        return folder.new_run_dir(name, run_dir)
    path = folder.existing_run_dir(name, run_dir)
    folder.check_resume_compatible(folder.saved_config(path), config.resolved())
    return path


def check_optional_features(config: RunConfig) -> None:
    check_strategy_installed(config.parallel)
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
    run_dir = main_decides(lambda: resolve_run_dir(config, name, run_dir, resume))
    checked = main_decides(lambda: run_preflight(config, run_dir, resume, env.world_size))
    precision = build_precision(config.train.precision, device, engine_managed=config.parallel.strategy == "deepspeed")
    loader = build_train_loader(config, device, env.rank, env.world_size)
    try:
        plan = plan_steps(config, loader.batches_per_epoch, loader.windows_per_epoch, env.world_size)
        model = build_model(config, device)
        strategy = build_run_strategy(model, config, device, env, precision, plan)
        scheduler = build_scheduler(strategy.optimizer, config.train, plan.total_steps)  # stepped by the loop
        console = RunConsole(plan.total_steps, 0, config.log.progress, is_main=env.is_main)
        state, last = restore(run_dir, resume, strategy, scheduler, loader, console)
        main_decides(lambda: create_run_dir(config, run_dir, data_info))
    except BaseException:
        loader.close()
        raise
    console.progress.update(console.task, completed=state.step)
    logger = MetricsLogger(
        run_dir, config.log.tensorboard, is_main=env.is_main, resume_step=state.step if resume else None
    )
    return Run(
        config=config,
        run_dir=run_dir,
        device=device,
        precision=precision,
        model=model,
        train_model=strategy.train_model,
        strategy=strategy,
        optimizer=strategy.optimizer,
        scheduler=scheduler,
        loader=loader,
        plan=plan,
        state=state,
        timer=PhaseTimer(device),
        meter=ThroughputMeter(config.model.args, config.data.seq_len, device, precision.name, env.world_size),
        logger=logger,
        console=console,
        stop=stop,
        data_info=data_info,
        env=env,
        preflight=checked,
        last_checkpoint=last,
        # A resumed run's report covers the whole run: the records before the checkpoint (the logger kept only those).
        records=read_jsonl(run_dir / METRICS_FILE),
        eval_records=read_jsonl(run_dir / EVAL_FILE),
    )


def restore(
    run_dir: Path,
    resume: bool,
    strategy: Strategy,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    loader: Any,
    console: RunConsole,
) -> tuple[ckpt.TrainerState, Path | None]:
    """On --resume: the newest complete checkpoint into every piece, the loader to its position."""
    if not resume:
        return ckpt.TrainerState(), None
    loaded = find_checkpoint(run_dir, console, strategy.env)
    if loaded is None:
        console.warn(folder.no_checkpoint_note(run_dir))
        return ckpt.TrainerState(), None
    state = ckpt.apply_checkpoint(loaded, strategy, scheduler, strategy.precision.scaler)
    if state.loader is not None:
        loader.load_state_dict(state.loader)
    console.print(
        f"resuming from {loaded.path} (step {state.step:,}, {state.tokens_seen:,} tokens seen, "
        f"written by {state.world_size} rank(s), {state.format} format)"
    )
    return state, loaded.path


def find_checkpoint(run_dir: Path, console: RunConsole, env: DistEnv) -> ckpt.LoadedCheckpoint | None:
    """Rank 0 picks the newest complete checkpoint (setting damaged ones aside); the other ranks then read it."""
    if not env.is_distributed:
        return ckpt.find_resumable(run_dir, say=console.warn, set_aside=True)
    path = main_decides(lambda: getattr(ckpt.find_resumable(run_dir, say=console.warn, set_aside=True), "path", None))
    return ckpt.read_checkpoint(path) if path is not None else None


def create_run_dir(config: RunConfig, run_dir: Path, data_info: DatasetInfo) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    write_resolved(config, run_dir)
    if data_info.tokenizer is not None:
        shutil.copyfile(data_info.tokenizer, run_dir / TOKENIZER_FILE)
