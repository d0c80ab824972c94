"""Tensor parallelism (Megatron-style, through PyTorch's DTensor): the device mesh, the plan, the vocab-parallel loss.

The ranks form a (dp, tp) grid, row-major (`DistEnv`); each row of `tp` ranks holds one model replica split so:

    tok_embeddings           row-parallel over the vocabulary; output sharded over the sequence (reduce-scatter)
    attention_norm, ffn_norm sequence-parallel: each rank normalises T/tp of the tokens
    wq, wk, wv, w1, w3       column-parallel: each rank computes n_heads/tp heads, n_kv_heads/tp kv heads, hidden/tp
    wo, w2                   row-parallel; output reduce-scattered back to the sequence shards
    norm                     sequence-parallel
    output                   column-parallel over the vocabulary: logits stay sharded (B, T, vocab/tp)

Per block this is one all-gather and one reduce-scatter of (B, T, dim) activations before/after attention and the
FFN (the sequence-parallel form of Megatron's two all-reduces). The loss is computed on the vocabulary shards
(`vocab_parallel_loss`); the full logits are never gathered. The model file knows none of this: attention infers
its local head counts from the shapes of its projections.

Data parallelism over the `dp` mesh dimension: FSDP2 shards each replica's parameters across dp (2-D, as torchtitan);
`ddp` with tp > 1 replicates them through FSDP2's hybrid mode with a shard degree of 1 (torch's DistributedDataParallel
does not take DTensor parameters), which all-reduces gradients as DDP does.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from dlx.errors import UserError
from dlx.model.args import ModelArgs
from dlx.parallel.config import ParallelConfig
from dlx.parallel.context import layout_problem
from dlx.parallel.distributed import DistEnv

DP, TP, DP_REPLICATE, DP_SHARD = "dp", "tp", "dp_replicate", "dp_shard"


def divisibility_problem(args: ModelArgs, tp: int, option: str = "parallel.tp") -> str | None:
    """What `tp` must divide for every rank to hold an equal slice; None when all of it does. `option`: how the
    message names the setting (the recipe key, or a command-line option)."""
    sizes = {
        "model.n_heads": args.n_heads,
        "model.n_kv_heads": args.kv_heads,
        "model.vocab_size": args.vocab_size,
        "the FFN hidden size (from model.dim, multiple_of, ffn_dim_multiplier)": args.ffn_hidden_dim,
    }
    for name, size in sizes.items():
        if size % tp:
            return f"{option} {tp} must divide {name} ({size}); pick a tp that does (e.g. 1, 2, 4, 8)"
    return None


def check_layout(parallel: ParallelConfig, world_size: int) -> None:
    """Before anything is built: the rank count fits `parallel.tp`, `parallel.cp`, `parallel.dp_replicate` and the
    strategy. One line otherwise."""
    tp, strategy = parallel.tp, parallel.strategy
    problem = layout_problem(strategy, parallel.cp, tp, parallel.dp_replicate, world_size)
    if problem:
        raise UserError(problem)
    if tp == 1:
        return
    if world_size % tp:
        raise UserError(
            f"parallel.tp {tp} needs a multiple of {tp} ranks and this run has {world_size}; start it with "
            f"torchrun --nproc_per_node {tp} (or a multiple), or lower parallel.tp"
        )
    if strategy == "none" and world_size != tp:
        raise UserError(
            f"parallel.strategy none with parallel.tp {tp} runs on exactly {tp} ranks and this run has {world_size}; "
            f"set parallel.strategy ddp or fsdp for the {world_size // tp} model replicas"
        )


def build_mesh(env: DistEnv, strategy: str, device: torch.device, dp_replicate: int = 1) -> Any:
    """The (dp, tp) mesh; for ddp a (dp_replicate, dp_shard = 1, tp) mesh, FSDP2's hybrid form of replication; for
    hsdp (tp 1) a (dp_replicate, dp_shard) mesh. The dp dimension spans the context-parallel ranks too: they average
    gradients with the replicas. None when tp is 1 otherwise (the data-parallel wrappers then use the whole world)."""
    from torch.distributed.device_mesh import init_device_mesh

    data_ranks = env.world_size // env.tp  # dp × cp
    if strategy == "hsdp":
        shape = (dp_replicate, data_ranks // dp_replicate)
        return init_device_mesh(device.type, shape, mesh_dim_names=(DP_REPLICATE, DP_SHARD))
    if env.tp == 1:
        return None
    if strategy == "ddp":
        return init_device_mesh(device.type, (data_ranks, 1, env.tp), mesh_dim_names=(DP_REPLICATE, DP_SHARD, TP))
    return init_device_mesh(device.type, (data_ranks, env.tp), mesh_dim_names=(DP, TP))


def data_parallel_mesh(mesh: Any) -> Any:
    """The mesh FSDP2 shards (or, for ddp, replicates) over."""
    return mesh[DP_REPLICATE, DP_SHARD] if DP_REPLICATE in mesh.mesh_dim_names else mesh[DP]


def apply_tp(model: nn.Module, mesh: Any) -> None:
    """Parallelise the model's modules in place as the table above says (the tp dimension of `mesh`)."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    tp_mesh = mesh[TP]
    tied = model.output.weight is model.tok_embeddings.weight
    top = {
        "tok_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
        "norm": SequenceParallel(),
        "output": ColwiseParallel(input_layouts=Shard(1), output_layouts=Shard(-1), use_local_output=False),
    }
    parallelize_module(model, tp_mesh, top)
    # Attention takes (x, cos, sin, cache, start_pos, mask): only x is gathered from its sequence shards.
    others = (None,) * (len(inspect.signature(model.layers[0].attention.forward).parameters) - 1)
    attention_inputs = (Shard(1), *others), (Replicate(), *others)
    block = {
        "attention_norm": SequenceParallel(),
        "attention": PrepareModuleInput(input_layouts=attention_inputs[0], desired_input_layouts=attention_inputs[1]),
        "attention.wq": ColwiseParallel(),
        "attention.wk": ColwiseParallel(),
        "attention.wv": ColwiseParallel(),
        "attention.wo": RowwiseParallel(output_layouts=Shard(1)),
        "ffn_norm": SequenceParallel(),
        "feed_forward": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
        "feed_forward.w1": ColwiseParallel(),
        "feed_forward.w2": RowwiseParallel(output_layouts=Shard(1)),
        "feed_forward.w3": ColwiseParallel(),
    }
    for layer in model.layers:
        parallelize_module(layer, tp_mesh, block)
    if tied:  # both are sharded over the vocabulary rows (Shard(0)): one parameter again
        model.output.weight = model.tok_embeddings.weight


def keep_embedding_gradient_sharded(model: nn.Module) -> None:
    """DTensor computes the row-parallel embedding's gradient whole (replicated) on every TP rank: it has no
    vocabulary-sharded embedding backward. Without FSDP (which reduce-scatters gradients itself) keep only this rank's
    rows of it as soon as it is accumulated (a local slice, no communication), so that what waits for the optimizer
    is vocab/tp rows; the whole gradient remains a transient of vocab × dim values during backward. Registered on the
    materialised parameter (`to_empty` and re-allocation drop hooks)."""
    model.tok_embeddings.weight.register_post_accumulate_grad_hook(_reshard_gradient)


def _reshard_gradient(param: Any) -> None:
    if param.grad is not None and param.grad.placements != param.placements:
        param.grad = param.grad.redistribute(param.device_mesh, param.placements)


def vocab_parallel_loss(logits: Any, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy of logits sharded over the vocabulary (a DTensor (B, T, vocab), Shard(-1) on the
    TP mesh) against targets (B, T), in fp32. Each rank reduces its vocabulary slice to a max and a sum of exponentials
    per token and the TP ranks all-reduce those (torch's `loss_parallel`), so the full logits are never gathered.
    Returns a plain scalar tensor, equal on every TP rank; its backward must run inside `loss_context` as well."""
    with loss_context(True):
        loss = F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())  # a replicated DTensor
    return loss.to_local()


def loss_context(vocab_parallel: bool) -> Any:
    """torch's `loss_parallel` when the logits are vocabulary-sharded, else nothing."""
    import contextlib

    if not vocab_parallel:
        return contextlib.nullcontext()
    from torch.distributed.tensor.parallel import loss_parallel

    return loss_parallel()
