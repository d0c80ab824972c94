"""Wrap the model from outside, in one documented order (torchtitan's):

    1. tensor parallelism        (parallel.tp > 1: `dlx.parallel.tensor`; first, so that its plan names the model's
                                  own modules and the later steps see the parallelised blocks)
    2. activation checkpointing  (each block, or every other block)
    3. torch.compile             (each block, so that recompilation stays local and checkpointing sees compiled code)
    4. FSDP2                     (fsdp; hsdp on its (replicate, shard) mesh; ddp with tp > 1: sharding and gradient
                                  hooks see the final modules)
    5. materialise               (a meta-device model gets each rank's shards only: `dlx.parallel.materialize`)
    6. DDP                       (ddp with tp 1: it broadcasts rank 0's weights, so they must exist)

DeepSpeed takes the model after steps 2, 3 and 5 and wraps it in its own engine (`dlx.parallel.build`).
The model module itself contains no distributed code. All of this works on one device too (checkpointing, compile).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

from dlx.device import PRECISION_DTYPES
from dlx.parallel.config import ParallelConfig
from dlx.parallel.distributed import DistEnv
from dlx.parallel.materialize import ShardFiller, materialize, on_meta
from dlx.parallel.tensor import TP, apply_tp, data_parallel_mesh, keep_embedding_gradient_sharded


def apply_activation_checkpointing(model: nn.Module, mode: str) -> None:
    """full: recompute every block in backward; selective: every other block (half the saving, a third less recompute).
    checkpoint_wrapper's state-dict hooks strip its prefix, so checkpoints keep the plain parameter names."""
    if mode == "none":
        return
    for index, block in enumerate(model.layers):
        if mode == "full" or index % 2 == 0:
            model.layers[index] = checkpoint_wrapper(block, preserve_rng_state=False)


def apply_compile(model: nn.Module) -> None:
    """Each block as one graph (`fullgraph=True`: a graph break is an error, not a silent split into eager pieces),
    and the loss's per-chunk math (its matmuls are cuBLAS calls either way)."""
    for block in model.layers:
        block.compile(fullgraph=True)
    model.loss_fn.compile()


def apply_fsdp(model: nn.Module, precision: str, reshard_after_forward: bool, mesh: Any = None) -> None:
    """FSDP2 per block and at the root, over `mesh` (its data-parallel dimensions) or, without one, the whole world.
    Weights are gathered in the compute dtype, gradients reduced and accumulated in fp32 (sharded, and unsharded
    across micro-steps without sync). Block inputs are not cast (`cast_forward_inputs=False`): the residual stream
    stays fp32 between blocks, as without FSDP (dlx.model.llama); autocast casts each matmul's input."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    param_dtype = PRECISION_DTYPES[precision]
    policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32, cast_forward_inputs=False)
    dp_mesh = data_parallel_mesh(mesh) if mesh is not None else None
    for block in model.layers:
        fully_shard(block, mesh=dp_mesh, mp_policy=policy, reshard_after_forward=reshard_after_forward)
    fully_shard(model, mesh=dp_mesh, mp_policy=policy, reshard_after_forward=reshard_after_forward)


def apply_ddp(model: nn.Module, device: torch.device) -> nn.Module:
    from torch.nn.parallel import DistributedDataParallel

    device_ids = [device.index] if device.type == "cuda" else None
    return DistributedDataParallel(model, device_ids=device_ids)


def parallelize(
    model: nn.Module,
    config: ParallelConfig,
    compile: bool,
    device: torch.device,
    env: DistEnv,
    precision: str,
    mesh: Any = None,
    seed: int = 0,
    fill: ShardFiller | None = None,
) -> nn.Module:
    """Returns the module to train: the model itself (TP, FSDP2 and none wrap in place) or its DDP wrapper.
    `mesh`: the (dp, tp) device mesh when parallel.tp > 1, the (replicate, shard) one under hsdp. A model on the
    meta device is materialised after sharding
    (its shards filled by `fill`, else drawn from `seed`: see `dlx.parallel.materialize`)."""
    if mesh is not None and TP in mesh.mesh_dim_names:
        apply_tp(model, mesh)
    apply_activation_checkpointing(model, config.activation_checkpointing)
    if compile:
        apply_compile(model)
    sharded = config.strategy in ("fsdp", "hsdp")
    if sharded or (config.strategy == "ddp" and mesh is not None):
        # ddp with tp > 1: FSDP2 over a (dp, 1) hybrid mesh replicates the weights and all-reduces the gradients
        reshard = config.reshard_after_forward and sharded
        apply_fsdp(model, precision, reshard, mesh)
    if on_meta(model):
        materialize(model, device, seed, fill)
    if mesh is not None and config.strategy == "none":
        keep_embedding_gradient_sharded(model)
    if config.strategy == "ddp" and mesh is None and env.is_distributed:
        return apply_ddp(model, device)
    return model
