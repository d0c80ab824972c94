"""Wrap the model from outside, in one documented order:

    1. activation checkpointing  (each block, or every other block)
    2. torch.compile             (each block, so that recompilation stays local and checkpointing sees compiled code)
    3. FSDP2 / DDP               (last, so that sharding and gradient hooks see the final modules)

DeepSpeed takes the model after steps 1–2 and wraps it in its own engine (`dlx.parallel.build`).
The model module itself contains no distributed code. All of this works on one device too (checkpointing, compile).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

from dlx.device import PRECISION_DTYPES
from dlx.parallel.config import ParallelConfig
from dlx.parallel.distributed import DistEnv


def apply_activation_checkpointing(model: nn.Module, mode: str) -> None:
    """full: recompute every block in backward; selective: every other block (half the saving, a third less recompute).
    checkpoint_wrapper's state-dict hooks strip its prefix, so checkpoints keep the plain parameter names."""
    if mode == "none":
        return
    for index, block in enumerate(model.layers):
        if mode == "full" or index % 2 == 0:
            model.layers[index] = checkpoint_wrapper(block, preserve_rng_state=False)


def apply_compile(model: nn.Module) -> None:
    """Each block, and the loss's per-chunk math (its matmuls are cuBLAS calls either way)."""
    for block in model.layers:
        block.compile()
    model.loss_fn.compile()


def apply_fsdp(model: nn.Module, precision: str, reshard_after_forward: bool) -> None:
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    param_dtype = PRECISION_DTYPES[precision]
    policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)
    for block in model.layers:
        fully_shard(block, mp_policy=policy, reshard_after_forward=reshard_after_forward)
    fully_shard(model, mp_policy=policy, reshard_after_forward=reshard_after_forward)


def apply_ddp(model: nn.Module, device: torch.device) -> nn.Module:
    from torch.nn.parallel import DistributedDataParallel

    device_ids = [device.index] if device.type == "cuda" else None
    return DistributedDataParallel(model, device_ids=device_ids)


def parallelize(
    model: nn.Module, config: ParallelConfig, compile: bool, device: torch.device, env: DistEnv, precision: str
) -> nn.Module:
    """Returns the module to train: the model itself (FSDP2 and none wrap in place) or its DDP wrapper."""
    apply_activation_checkpointing(model, config.activation_checkpointing)
    if compile:
        apply_compile(model)
    if config.strategy == "fsdp":
        apply_fsdp(model, precision, config.reshard_after_forward)
    elif config.strategy == "ddp" and env.is_distributed:
        return apply_ddp(model, device)
    return model
