"""The run's model and the strategy around it: shapes on the meta device, the initial weights (train.seed or
model.init_from) that fill each rank's shards, float8 and the recipe's wrapping. `build_run` calls these; benchmarks
and tests build a model or a strategy with them alone, without a run folder."""

from __future__ import annotations

import random

import numpy as np
import torch
from torch import nn

from dlx.errors import UserError
from dlx.model.llama import Transformer
from dlx.parallel.build import StepShape, build_strategy
from dlx.parallel.distributed import DistEnv, any_rank, main_decides
from dlx.parallel.float8 import apply_float8, gathers_in_float8
from dlx.parallel.materialize import ShardFiller, materialize
from dlx.parallel.strategy import Strategy
from dlx.precision import Precision
from dlx.train.config import RunConfig
from dlx.train.console import RunConsole
from dlx.train.data import DatasetInfo
from dlx.train.init_from import InitSource, bos_difference, check_tokenizer, load_initial_weights, resolve_source
from dlx.train.optim import build_optimizer
from dlx.train.step_plan import StepPlan
from dlx.train.vocab_growth import dataset_tokenizer


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def meta_model(config: RunConfig) -> Transformer:
    """On the meta device: shapes only. `build_run_strategy` shards it, then gives each rank its own shards (drawn
    from train.seed, or read from model.init_from): no rank ever holds the whole model unless it trains it whole."""
    seed_everything(config.train.seed)
    with torch.device("meta"):
        return Transformer(config.model.args)


def build_model(config: RunConfig, device: torch.device, init: InitSource | None = None) -> Transformer:
    """The whole model in this process: the weights every layout starts from (drawn from train.seed), or
    model.init_from's, copied into uninitialised storage on the device (no random init, no second copy)."""
    model = meta_model(config)
    materialize(model, device, config.train.seed, initial_weights(init, device, config))
    return model


def resolve_initial_weights(
    config: RunConfig, data_info: DatasetInfo, restoring: bool, console: RunConsole
) -> InitSource | None:
    """model.init_from's folder, checked against the dataset's tokenizer; None without init_from, or when a checkpoint
    is about to be restored (it holds the weights). Rank 0 decides, every rank gets the answer or the same error."""
    if config.model.init_from is None or restoring:
        return None

    def resolve() -> InitSource:
        source = config.model.init_source or resolve_source(config.model.init_from)
        source.check()  # every header, shard and shape checked before anything is written
        check_tokenizer(source, data_info.tokenizer, data_info.path)
        return source

    source = main_decides(resolve)
    for note in (*source.notes, bos_difference(source, data_info.tokenizer)):
        if note:
            console.warn(note)
    return source


def initial_weights(init: InitSource | None, device: torch.device, config: RunConfig) -> ShardFiller | None:
    """model.init_from's weights as what fills each rank's shards when the model is materialised (each rank reads only
    the rows it holds); a rank that cannot read them stops all ranks with its one line. None: random weights."""
    if init is None:
        return None
    data = dataset_tokenizer(config.data.path, config.data.mix)  # an extension of the weights' grows the vocabulary
    data_tokenizer = data[0] if data is not None else None

    def fill(model: Transformer) -> None:
        error: UserError | None = None
        try:
            load_initial_weights(model, init, data_tokenizer)
        except UserError as e:
            error = e
        if any_rank(error is not None, device):
            raise error or UserError(f"another rank could not read model.init_from {config.model.init_from}")

    return fill


def build_run_strategy(
    model: Transformer,
    config: RunConfig,
    device: torch.device,
    env: DistEnv,
    precision: Precision,
    plan: StepPlan,
    fill: ShardFiller | None = None,
) -> Strategy:
    """The recipe's strategy around the model, with the recipe's optimizer on the wrapped parameters; the meta-device
    model's shards filled by `fill` (model.init_from), else drawn from train.seed."""
    shape = StepShape(plan.micro_batch_size, plan.grad_accum, config.train.grad_clip)

    def make_optimizer(wrapped: nn.Module) -> torch.optim.Optimizer:
        return build_optimizer(wrapped, config.train, device)

    if config.train.float8:  # before any other wrapping
        recipe = config.train.float8_recipe
        apply_float8(model, recipe, device, gathers_in_float8(recipe, config.parallel.strategy))
    seed = config.train.seed
    return build_strategy(
        model, config.parallel, config.train.compile, device, env, precision, make_optimizer, shape, seed, fill
    )
