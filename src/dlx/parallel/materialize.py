"""From the meta device to real weights, one shard at a time: no rank ever holds the whole model.

The model is built on the meta device (shapes only), tensor- and data-parallelised there, and only then given storage:
each rank allocates its own shards (`to_empty`) and fills them, parameter by parameter, in the model's registration
order. A parameter is filled from either

- the model's own initialisation rule (`Transformer.init_parameter_`), drawn for the whole parameter from one
  generator seeded with `train.seed`, of which the rank keeps its slice; or
- a `ShardFiller` (continued pretraining, `model.init_from`), which fills every parameter's local shard from stored
  weights, reading only the rows this rank holds (`local_region` says which).

Reproducible means: for a fixed seed and device type, every layout (one process, any tp and dp, FSDP, DDP or none)
starts from bitwise the same weights: those `Transformer.init_weights` draws for the whole model on that device from
a generator seeded with the seed (CUDA and CPU generators differ: a GPU run starts elsewhere than a CPU run). The
price is that each rank draws every parameter in full once, one parameter at a time, so the peak is the largest
parameter (the embedding) on top of the rank's shards: time, not memory.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from dlx.model.llama import Transformer

ShardFiller = Callable[[Transformer], None]
"""Fills the local shard of every parameter of a materialised (sharded or whole) model from stored weights."""

WRAPPER_PREFIXES = ("_checkpoint_wrapped_module.", "_orig_mod.")
"""What activation checkpointing and torch.compile insert into parameter names."""


def on_meta(model: nn.Module) -> bool:
    return any(p.is_meta for p in model.parameters())


def allocate(model: nn.Module, device: torch.device) -> None:
    """Uninitialised storage for each rank's shards. FSDP2 modules do it themselves (`to_empty`). Otherwise every meta
    parameter is replaced by a new one of the same layout, shared ones (tied embeddings) once: `to_empty` swaps a
    tensor-parallel DTensor's contents in place, after which gradient hooks registered on it no longer fire."""
    from torch.distributed.fsdp import FSDPModule

    if isinstance(model, FSDPModule):
        model.to_empty(device=device)
        return
    made: dict[int, nn.Parameter] = {}
    for module in model.modules():
        for name, param in list(module._parameters.items()):
            if param is None or not param.is_meta:
                continue
            if id(param) not in made:
                made[id(param)] = nn.Parameter(_empty_like(param, device), requires_grad=param.requires_grad)
            module._parameters[name] = made[id(param)]


def _empty_like(param: torch.Tensor, device: torch.device) -> torch.Tensor:
    if not hasattr(param, "device_mesh"):
        return torch.empty_like(param, device=device)
    from torch.distributed.tensor import DTensor

    local = torch.empty(param.to_local().shape, dtype=param.dtype, device=device)
    return DTensor.from_local(local, param.device_mesh, param.placements, shape=param.shape, stride=param.stride())


def canonical_name(name: str) -> str:
    """The parameter's name in the bare model (and in checkpoints)."""
    for prefix in WRAPPER_PREFIXES:
        name = name.replace(prefix, "")
    return name


def local_region(param: torch.Tensor) -> tuple[slice, ...]:
    """Which part of the full parameter this rank holds: FSDP and TP shards are each one contiguous block."""
    if not hasattr(param, "device_mesh"):
        return tuple(slice(0, size) for size in param.shape)
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    shape, offset = compute_local_shape_and_global_offset(param.shape, param.device_mesh, param.placements)
    return tuple(slice(start, start + size) for start, size in zip(offset, shape, strict=True))


@torch.no_grad()
def materialize(model: Transformer, device: torch.device, seed: int, fill: ShardFiller | None = None) -> None:
    """Give a meta-device model (wrapped or not) its storage on `device` and fill each rank's shards: from `fill`,
    else by the model's initialisation rule from `seed`."""
    allocate(model, device)
    model.init_rope(device)  # derived buffers, not parameters
    if fill is not None:
        fill(model)
        return
    generator = torch.Generator(device).manual_seed(seed)
    for name, param in model.named_parameters():
        local = param.to_local() if hasattr(param, "to_local") else param
        full = torch.empty(param.shape, dtype=param.dtype, device=device)
        model.init_parameter_(canonical_name(name), full, generator)
        local.copy_(full[local_region(param)])
