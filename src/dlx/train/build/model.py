"""The run's model and the strategy around it: shapes on the meta device, the initial weights (train.seed or
model.init_from) that fill each rank's shards, float8 and the recipe's wrapping. `build_run` calls these; benchmarks
and tests build a model or a strategy with them alone, without a run folder."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import torch
from torch import nn

from dlx.errors import UserError
from dlx.model.io import StoredTensor, load_weights
from dlx.model.llama import Transformer
from dlx.parallel import dcp
from dlx.parallel.build import StepShape, build_strategy
from dlx.parallel.distributed import DistEnv, any_rank, main_decides
from dlx.parallel.float8 import apply_float8, gathers_in_float8
from dlx.parallel.materialize import ShardFiller, materialize
from dlx.parallel.strategy import DCP_FOLDER, Strategy
from dlx.precision import Precision
from dlx.train.build.console import RunConsole
from dlx.train.build.data import DatasetInfo
from dlx.train.build.optim import build_optimizer
from dlx.train.build.step_plan import StepPlan
from dlx.train.config import RunConfig
from dlx.train.init.vocab_growth import (
    VOCAB_TENSORS,
    data_extends_weights,
    dataset_tokenizer,
    fill_grown,
    new_token_pieces,
)
from dlx.train.rundir.trained import TrainedSource, resolve_trained


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


def build_model(config: RunConfig, device: torch.device, init: TrainedSource | None = None) -> Transformer:
    """The whole model in this process: the weights every layout starts from (drawn from train.seed), or
    model.init_from's, copied into uninitialised storage on the device (no random init, no second copy)."""
    model = meta_model(config)
    materialize(model, device, config.train.seed, initial_weights(init, device, config))
    return model


def resolve_initial_weights(
    config: RunConfig, data_info: DatasetInfo, restoring: bool, console: RunConsole
) -> TrainedSource | None:
    """model.init_from's folder, checked against the dataset's tokenizer; None without init_from, or when a checkpoint
    is about to be restored (it holds the weights). Rank 0 decides, every rank gets the answer or the same error."""
    if config.model.init_from is None or restoring:
        return None

    def resolve() -> TrainedSource:
        init = config.model.init
        source = init.source if init is not None else resolve_trained(config.model.init_from, "model.init_from")
        source.check()  # every header, shard and shape checked before anything is written
        data_extends_weights(source.tokenizer, data_info.tokenizer, f"data.path {data_info.path}")  # or refused
        return source

    source = main_decides(resolve)
    for note in (*source.notes, bos_difference(source, data_info.tokenizer)):
        if note:
            console.warn(note)
    return source


def initial_weights(init: TrainedSource | None, device: torch.device, config: RunConfig) -> ShardFiller | None:
    """model.init_from's weights as what fills each rank's shards when the model is materialised (each rank reads only
    the rows it holds); a rank that cannot read them stops all ranks with its one line. None: random weights."""
    if init is None:
        return None
    data = dataset_tokenizer(config.data.path, config.data.mix, config.data.cache_dir)  # an extension grows the vocab
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


def load_initial_weights(model: Transformer, source: TrainedSource, data_tokenizer: Path | None = None) -> None:
    """Copy the source's weights into `model`: built by `dlx.model.io.empty_model`, or sharded (DTensor parameters,
    e.g. FSDP2 on the meta device, then `to_empty`), when each rank reads only its own rows. Under torchrun every rank
    reads the same files, which the operating system's page cache holds once. From a checkpoint's DCP shards, each rank
    reads the parts its layout holds (every rank calls this then: the read is collective). When the data's tokenizer
    extends the weights' or the model's vocabulary is larger, the embedding and head grow
    (`dlx.train.init.vocab_growth`)."""
    if source.in_shards:
        try:
            dcp.load_model_weights(model, source.weights / DCP_FOLDER)
        except (RuntimeError, ValueError, KeyError) as e:  # DCP's CheckpointException is a RuntimeError
            raise UserError(
                f"{source.weights}: its DCP shards cannot be read ({str(e).splitlines()[0][:160]}); give another "
                "checkpoint"
            ) from None
        return
    stored = source.stored()
    extends = data_extends_weights(source.tokenizer, data_tokenizer, f"the dataset of {data_tokenizer}")
    if model.args.vocab_size == stored["tok_embeddings.weight"].shape[0] and not extends:
        load_weights(model, stored, str(source.weights))
        return
    load_weights(model, stored, str(source.weights), skip=VOCAB_TENSORS)
    fill_grown(model, stored, *_new_rows(model, stored, source, data_tokenizer if extends else None))


def _new_rows(
    model: Transformer, stored: dict[str, StoredTensor], source: TrainedSource, extended: Path | None
) -> tuple[int, list[list[int]]]:
    """The first id that is not the weights' and each new row's base pieces (none: the mean row); `extended`: the
    data's tokenizer when it extends the weights'."""
    size = model.args.vocab_size
    if source.tokenizer is not None and extended is not None:
        return new_token_pieces(source.tokenizer, extended, size)
    rows = stored["tok_embeddings.weight"].shape[0]
    return rows, [[] for _ in range(size - rows)]


def bos_difference(source: TrainedSource, dataset_tokenizer: Path | None) -> str | None:
    """One line when the data's documents start otherwise than the weights' tokenizer starts a text (its own BOS
    convention, `dlx.data.prepare.tokenizer.bos_by_convention`); None when they agree or either is unknown."""
    if source.tokenizer is None or dataset_tokenizer is None:
        return None
    from dlx.data.prepare.tokenizer import document_bos_id, read_tokenizer

    weights_bos, data_bos = read_tokenizer(source.tokenizer, None).bos_id, document_bos_id(dataset_tokenizer)
    if weights_bos == data_bos:
        return None
    data_side = "puts no BOS before its documents" if data_bos is None else f"starts every document with id {data_bos}"
    weights_side = "adds no BOS" if weights_bos is None else f"starts every text with BOS id {weights_bos}"
    fix = "--no-bos" if weights_bos is None else "--bos"
    return (
        f"note: the data {data_side}, but model.init_from's tokenizer {source.tokenizer} {weights_side}; "
        f"to train as the weights were, prepare the data again with {fix}"
    )


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
