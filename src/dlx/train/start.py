"""A run's start: what `build_run` checks before it builds anything (the optional packages the recipe needs, the
dataset, the parallel layout, the run folder chosen by rank 0, the preflight checks, the precision and the memory
estimate; bad input stops here with one line, and nothing is left behind), and the start-up header it prints before
step 1 and repeats in report.md."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from dlx.data.source import BatchSource
from dlx.errors import UserError
from dlx.metrics.meter import ThroughputMeter
from dlx.parallel.build import check_strategy_installed
from dlx.parallel.distributed import DistEnv, main_decides
from dlx.parallel.float8 import check_float8_installed, float8_header
from dlx.parallel.strategy import Strategy
from dlx.parallel.tensor import check_layout
from dlx.parallel.traits import STRATEGY_TRAITS
from dlx.precision import Precision, build_precision
from dlx.train.build.data import DatasetInfo, inspect_dataset
from dlx.train.build.memory_check import check_memory
from dlx.train.build.preflight import Preflight, run_preflight
from dlx.train.build.restore import resolve_run_dir
from dlx.train.build.step_plan import StepPlan, header_lines
from dlx.train.config import RunConfig
from dlx.train.init.init_from import describe_changes
from dlx.train.observers.base import ObserverList
from dlx.train.observers.build import bpb_note, check_wandb_installed
from dlx.train.rundir.trained import TrainedSource


@dataclass(frozen=True)
class StartChecks:
    """What the checks found: the dataset, the run folder, what preflight checked, the run's precision."""

    data_info: DatasetInfo
    run_dir: Path
    preflight: Preflight
    precision: Precision


def check_start(
    config: RunConfig, name: str, run_dir: Path | None, resume: bool, env: DistEnv, device: torch.device
) -> StartChecks:
    """Every check in order; rank 0 takes the decisions that touch the file system and every rank gets them (or the
    same one-line error)."""
    data_info = inspect_dataset(config)
    check_layout(config.parallel, env.world_size)
    folder = main_decides(lambda: resolve_run_dir(config, name, run_dir, resume))
    checked = main_decides(lambda: run_preflight(config, folder, resume, env.dp_size))
    owned = STRATEGY_TRAITS[config.parallel.strategy].owns_precision
    precision = build_precision(config.train.precision, device, engine_managed=owned)
    checked = checked.with_check(check_memory(config, device, env, precision.name))
    return StartChecks(data_info, folder, checked, precision)


def check_optional_features(config: RunConfig) -> None:
    """The packages the recipe's strategy, W&B, float8 and TensorBoard need are installed."""
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


def build_header(
    config: RunConfig,
    plan: StepPlan,
    strategy: Strategy,
    device: torch.device,
    meter: ThroughputMeter,
    start: StartChecks,
    observers: ObserverList,
    init: TrainedSource | None,
    loader: BatchSource,
) -> list[str]:
    """The start-up header: the step plan, the model and device, the meter's conventions, what preflight checked,
    the observers' lines, where the initial weights came from, float8, the data order when it is shard blocks, and
    why validation has no bits per byte when it has none."""
    from dlx.device import device_name

    # ds_numel: a ZeRO-3 parameter's full size (its local tensor is empty); a DTensor's numel is already the full one
    trainable = sum(getattr(p, "ds_numel", p.numel()) for p in strategy.model.parameters() if p.requires_grad)
    header = header_lines(plan, trainable, strategy.precision.name, device_name(device)) + meter.header()
    header += strategy_note(config)
    header += start.preflight.lines() if start.preflight else []
    header += observers.header()
    if init is not None:
        header.append(f"initial weights: {init.describe()}")
        changes = describe_changes(init.args(), strategy.model.args)
        if changes:
            header.append(f"changed at init_from: {', '.join(changes)}")
    if config.train.float8:
        header += float8_header(strategy.model, config.train.float8_recipe, device)
    return header + order_notes(loader) + bpb_note(config, start.data_info)


def strategy_note(config: RunConfig) -> list[str]:
    """One line when parallel.strategy auto chose the strategy, saying which and why."""
    parallel = config.parallel
    if parallel.auto_note is None or parallel.auto_note == "one process":
        return []
    return [f"parallel.strategy: {parallel.strategy} (auto: {parallel.auto_note})"]


def order_notes(loader: BatchSource) -> list[str]:
    """One line per dataset in object storage read in shard blocks: larger than data.cache_gb, or in a data.mix than
    its share of it (`TokenLoader.order`, `MixtureLoader.orders`; synthetic data and stages have neither)."""
    orders = getattr(loader, "orders", None) or {"": getattr(loader, "order", "")}
    notes = []
    for name, order in orders.items():
        if order.startswith("shard-blocks-"):
            blocks = order.removeprefix("shard-blocks-")
            what = f"data.mix source {name} is larger than its share of" if name else "the dataset is larger than"
            notes.append(
                f"data order{f' of {name}' if name else ''}: {order} ({what} data.cache_gb: shuffled in blocks of "
                f"{blocks} shards, each shard downloaded about once per epoch)"
            )
    return notes
