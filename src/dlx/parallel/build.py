"""`build_strategy`: wrap the model (see `wrap`), build its optimizer and schedule, and for DeepSpeed its engine."""

from __future__ import annotations

import logging
from typing import Any

import torch

from dlx.errors import UserError
from dlx.model.llama import Transformer
from dlx.parallel.distributed import DistEnv
from dlx.parallel.strategy import DDPStrategy, DeepSpeedStrategy, FSDPStrategy, Strategy
from dlx.parallel.wrap import parallelize
from dlx.train.config import RunConfig
from dlx.train.header import StepPlan
from dlx.train.optim import build_optimizer, build_scheduler
from dlx.train.precision import Precision

STRATEGIES = {"none": Strategy, "ddp": DDPStrategy, "fsdp": FSDPStrategy}


def check_strategy_installed(config: RunConfig) -> None:
    """Before anything is written: a strategy whose engine is not installed is one line, not a traceback later."""
    if config.parallel.strategy != "deepspeed":
        return
    try:
        import deepspeed  # noqa: F401
    except ImportError:
        raise UserError(
            "parallel.strategy deepspeed needs DeepSpeed, which is not installed: pip install 'dlx[deepspeed]' "
            "(DS_BUILD_OPS=0 on machines without CUDA), or pick --parallel.strategy ddp or fsdp"
        ) from None


def build_strategy(
    model: Transformer, config: RunConfig, device: torch.device, env: DistEnv, precision: Precision, plan: StepPlan
) -> tuple[Strategy, torch.optim.lr_scheduler.LRScheduler]:
    """The optimizer is built after wrapping, so that under FSDP it holds the sharded parameters."""
    parallel = config.parallel
    train_model = parallelize(model, parallel, config.train.compile, device, env, precision.name)
    optimizer = build_optimizer(model, config.train, device)
    scheduler = build_scheduler(optimizer, config.train, plan.total_steps)  # stepped by the loop, for every strategy
    if parallel.strategy == "deepspeed":
        engine = deepspeed_engine(model, optimizer, config, plan, precision)
        strategy: Strategy = DeepSpeedStrategy(
            model, engine, optimizer, precision, config.train.grad_clip, env, zero_stage=parallel.zero_stage
        )
    else:
        strategy = STRATEGIES[parallel.strategy](model, train_model, optimizer, precision, config.train.grad_clip, env)
    return strategy, scheduler


def deepspeed_config(config: RunConfig, plan: StepPlan, precision: str) -> dict[str, Any]:
    """DeepSpeed's JSON config from the recipe. dlx's own AdamW (or SGD) is the client optimizer, hence
    `zero_allow_untested_optimizer`; mixed precision is DeepSpeed's (bf16/fp16 weights, fp32 master copy)."""
    return {
        "train_micro_batch_size_per_gpu": plan.micro_batch_size,
        "gradient_accumulation_steps": plan.grad_accum,
        "gradient_clipping": config.train.grad_clip,
        "zero_optimization": {"stage": config.parallel.zero_stage},
        "zero_allow_untested_optimizer": True,
        "bf16": {"enabled": precision == "bf16"},
        "fp16": {"enabled": precision == "fp16"},
        "steps_per_print": 1 << 62,
        "wall_clock_breakdown": False,
    }


def deepspeed_engine(
    model: Transformer, optimizer: torch.optim.Optimizer, config: RunConfig, plan: StepPlan, precision: Precision
) -> Any:
    import deepspeed

    deepspeed.utils.logger.setLevel(logging.WARNING)
    engine, *_ = deepspeed.initialize(
        model=model,
        optimizer=optimizer,
        config=deepspeed_config(config, plan, precision.name),
        dist_init_required=False,
    )
    return engine
