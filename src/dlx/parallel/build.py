"""`build_strategy`: wrap the model (see `wrap`), build its optimizer on the wrapped parameters, and for DeepSpeed its
engine. Takes plain values, not the recipe: the training package assembles the run and calls this."""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from dlx.errors import UserError
from dlx.model.llama import Transformer
from dlx.parallel.config import ParallelConfig
from dlx.parallel.context import ContextParallel, context_group
from dlx.parallel.distributed import DistEnv
from dlx.parallel.materialize import ShardFiller
from dlx.parallel.strategy import DDPStrategy, DeepSpeedStrategy, FSDPStrategy, HSDPStrategy, Strategy
from dlx.parallel.tensor import build_mesh
from dlx.parallel.traits import STRATEGY_TRAITS
from dlx.parallel.wrap import parallelize
from dlx.precision import Precision

STRATEGIES = {"none": Strategy, "ddp": DDPStrategy, "fsdp": FSDPStrategy, "hsdp": HSDPStrategy}


@dataclass(frozen=True)
class StepShape:
    """What DeepSpeed's engine needs to know of one optimizer step."""

    micro_batch_size: int
    grad_accum: int
    grad_clip: float


def check_strategy_installed(parallel: ParallelConfig) -> None:
    """Before anything is written: a strategy whose engine is not installed is one line, not a traceback later."""
    package = STRATEGY_TRAITS[parallel.strategy].package
    if package is None:
        return
    try:
        importlib.import_module(package)
    except ImportError:
        raise UserError(
            "parallel.strategy deepspeed needs DeepSpeed, which is not installed: pip install 'dlx[deepspeed]' "
            "(DS_BUILD_OPS=0 on machines without CUDA), or pick --parallel.strategy ddp or fsdp"
        ) from None


def build_strategy(
    model: Transformer,
    parallel: ParallelConfig,
    compile: bool,
    device: torch.device,
    env: DistEnv,
    precision: Precision,
    make_optimizer: Callable[[nn.Module], torch.optim.Optimizer],
    shape: StepShape,
    seed: int = 0,
    fill: ShardFiller | None = None,
) -> Strategy:
    """The optimizer is built after wrapping, so that under FSDP and TP it holds the sharded parameters. A model on
    the meta device gets its weights during wrapping, each rank only its shards (filled by `fill`, else from `seed`)."""
    mesh = build_mesh(env, parallel.strategy, device, parallel.dp_replicate)
    context = build_context(parallel, env)
    if context is not None:  # before compile and wrapping: the blocks are compiled with it
        model.use_attention_fn(context.attend)
    train_model = parallelize(model, parallel, compile, device, env, precision.name, mesh, seed, fill)
    optimizer = make_optimizer(model)
    if parallel.strategy == "deepspeed":
        engine = deepspeed_engine(model, optimizer, deepspeed_config(parallel, shape, precision.name))
        return DeepSpeedStrategy(
            model, engine, optimizer, precision, shape.grad_clip, env, zero_stage=parallel.zero_stage
        )
    strategy = STRATEGIES[parallel.strategy](model, train_model, optimizer, precision, shape.grad_clip, env)
    strategy.context = context
    return strategy


def build_context(parallel: ParallelConfig, env: DistEnv) -> ContextParallel | None:
    """This rank's place in its context-parallel group; None when neither parallel.cp > 1 nor parallel.cp_path."""
    if parallel.cp == 1 and not parallel.cp_path:
        return None
    group = context_group(env.rank, env.world_size, parallel.cp, env.tp)
    return ContextParallel(parallel.cp, env.cp_rank, group)


def deepspeed_config(parallel: ParallelConfig, shape: StepShape, precision: str) -> dict[str, Any]:
    """DeepSpeed's JSON config from the recipe. dlx's own AdamW (or SGD) is the client optimizer, hence
    `zero_allow_untested_optimizer`; mixed precision is DeepSpeed's (bf16/fp16 weights, fp32 master copy)."""
    return {
        "train_micro_batch_size_per_gpu": shape.micro_batch_size,
        "gradient_accumulation_steps": shape.grad_accum,
        "gradient_clipping": shape.grad_clip,
        "zero_optimization": {"stage": parallel.zero_stage},
        "zero_allow_untested_optimizer": True,
        "bf16": {"enabled": precision == "bf16"},
        "fp16": {"enabled": precision == "fp16"},
        "steps_per_print": 1 << 62,
        "wall_clock_breakdown": False,
    }


def deepspeed_engine(model: Transformer, optimizer: torch.optim.Optimizer, config: dict[str, Any]) -> Any:
    import deepspeed

    deepspeed.utils.logger.setLevel(logging.WARNING)
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=config, dist_init_required=False)
    return engine
