"""Context parallelism (`parallel.cp N`): each of N ranks holds 1/N of every sequence; attention gathers the keys and
values of the whole sequence from the N ranks (the method of the Llama 3 paper: with grouped-query attention the
gathered keys and values are n_kv_heads/n_heads of the queries' size).

Load balance for causal attention: the sequence is cut into 2N chunks and rank i holds chunks i and 2N−1−i, so every
rank's queries see the same number of keys in total (an early chunk's few plus a late chunk's many).

    rank i holds     tokens [i·c, (i+1)·c) and [(2N−1−i)·c, (2N−i)·c), c = T / 2N
    RoPE positions   the tokens' own positions in the whole sequence (or in their document, with data.document_mask)
    attention        k, v all-gathered over the cp group (backward: their gradients reduce-scattered, summed), then
                     SDPA of the local queries against every key under a mask: causal on the global positions, and
                     within documents when data.document_mask is on
    loss             each rank's mean over its targets, weighted by N × its counted targets ÷ the sequence's, so that
                     the mean over ranks (what gradient averaging and the logged loss take) is the mean over all
                     targets, exactly, and Σ nats ÷ Σ bytes over ranks stays the bits per byte

The cp ranks of one replica read the same batch (`DistEnv.dp_rank`) and each keeps its part (`ContextParallel.shard`);
their gradients are averaged with the data-parallel ones by DDP or FSDP, whose group spans dp × cp. The model knows
nothing of this: it is given positions, a mask and an attention function (`Transformer.use_attention_fn`).

Own code rather than `torch.distributed.tensor.experimental.context_parallel`: that one rewrites SDPA's CUDA flash,
memory-efficient and cuDNN ops with ring attention, and has no rule for the CPU kernels gloo runs
(`_scaled_dot_product_flash_attention_for_cpu`), nor for a boolean mask (document masks); see BENCHMARKS.md.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from dlx.model.document_mask import positions_in_documents
from dlx.model.llama import causal_attention
from dlx.model.loss import IGNORE_INDEX
from dlx.parallel.config import CP_KERNELS, sequence_problem  # noqa: F401  (checked in the recipe, torch-free)


class _GatherSequence(torch.autograd.Function):
    """All-gather along the sequence dimension (1) over a process group; backward: reduce-scatter (sum) of the
    gathered tensor's gradient, each rank getting its own part's sum over every rank's use of it."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any, size: int) -> torch.Tensor:  # type: ignore[override]
        ctx.group, ctx.size = group, size
        parts = x.movedim(1, 0).contiguous()  # (T_local, B, ...): the collective concatenates along dim 0
        out = parts.new_empty((size * parts.shape[0], *parts.shape[1:]))
        dist.all_gather_into_tensor(out, parts, group=group)
        return out.movedim(0, 1)  # (B, size · T_local, ...)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:  # type: ignore[override]
        whole = grad.movedim(1, 0).contiguous()
        mine = whole.new_empty((whole.shape[0] // ctx.size, *whole.shape[1:]))
        dist.reduce_scatter_tensor(mine, whole, op=dist.ReduceOp.SUM, group=ctx.group)
        return mine.movedim(0, 1), None, None


def gather_sequence(x: torch.Tensor, group: Any, size: int) -> torch.Tensor:
    """x (B, T_local, ...) from each of `size` ranks -> (B, size · T_local, ...) in rank order; autograd-correct."""
    if size == 1:
        return x
    return _GatherSequence.apply(x, group, size)


def held_chunks(rank: int, degree: int) -> tuple[int, int]:
    """The two of 2·degree chunks rank `rank` holds: i and 2·degree − 1 − i."""
    return rank, 2 * degree - 1 - rank


def held_positions(rank: int, degree: int, seq_len: int, device: torch.device) -> torch.Tensor:
    """The positions in the whole sequence of the tokens rank `rank` holds, (seq_len / degree,) int64, in order."""
    chunk = seq_len // (2 * degree)
    starts = [index * chunk for index in held_chunks(rank, degree)]
    return torch.cat([torch.arange(start, start + chunk, device=device) for start in starts])


def gathered_positions(degree: int, seq_len: int, device: torch.device) -> torch.Tensor:
    """The positions of the all-gathered keys, in the order the gather lays them out (rank 0's, rank 1's, ...)."""
    return torch.cat([held_positions(rank, degree, seq_len, device) for rank in range(degree)])


class ContextParallel:
    """This rank's part of the cp group: splits a batch (`shard`) and attends across the group (`attend`)."""

    def __init__(self, degree: int, rank: int, group: Any) -> None:
        self.degree, self.rank, self.group = degree, rank, group

    def shard(
        self, inputs: torch.Tensor, targets: torch.Tensor, model_inputs: dict[str, torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor, dict[str, Any], torch.Tensor]:
        """The whole batch (B, T) -> this rank's tokens and targets (B, T / degree), the model's keyword arguments
        (positions, attention mask) and the loss weight (see the module docstring)."""
        seq_len = inputs.shape[1]
        if seq_len % (2 * self.degree):
            raise ValueError(f"sequence of {seq_len} tokens does not split into {2 * self.degree} equal chunks")
        mine = held_positions(self.rank, self.degree, seq_len, inputs.device)
        keys = gathered_positions(self.degree, seq_len, inputs.device)
        document_ids = model_inputs.get("document_ids")
        causal = mine[:, None] >= keys[None, :]  # (T_local, T)
        if document_ids is not None and bool(document_ids[:, -1].any()):  # a boundary in some row
            positions = positions_in_documents(document_ids)[:, mine]  # (B, T_local)
            same = document_ids[:, mine, None] == document_ids[:, None, keys]  # (B, T_local, T)
            mask: torch.Tensor | None = (same & causal).unsqueeze(1)  # (B, 1, T_local, T)
        else:
            positions = mine
            mask = None if self.degree == 1 else causal[None, None]  # degree 1: the whole sequence in order
        local_targets = targets[:, mine]
        counted = (targets != IGNORE_INDEX).sum().clamp(min=1)
        weight = self.degree * (local_targets != IGNORE_INDEX).sum() / counted
        model_kwargs = {"positions": positions, "attention_mask": mask}
        return inputs[:, mine], local_targets, model_kwargs, weight

    def attend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, kernel: str | None = None
    ) -> torch.Tensor:
        """q (B, T_local, H, D) against the keys and values of the whole sequence, gathered from the cp group ->
        (B, H, T_local, D). Without a mask (degree 1, no document boundary) plain causal attention through the
        applied SDPA `kernel`, as the model's own."""
        k, v = gather_sequence(k, self.group, self.degree), gather_sequence(v, self.group, self.degree)  # (B, T, ...)
        if mask is None:
            return causal_attention(q, k, v, kernel)
        n_rep = q.shape[2] // k.shape[2]
        gqa = n_rep > 1 and q.device.type != "cuda"  # CUDA's masked kernels (efficient, math) take no enable_gqa
        if n_rep > 1 and not gqa:
            k, v = k.repeat_interleave(n_rep, dim=2), v.repeat_interleave(n_rep, dim=2)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # (B, heads, T, D)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, **({"enable_gqa": True} if gqa else {}))


def context_group(rank: int, world_size: int, degree: int, tp: int) -> Any:
    """The process group of the `degree` ranks that share this rank's sequences (same dp and tp index in the
    (dp, cp, tp) grid); every rank creates every group, in the same order, as torch requires. None at degree 1."""
    if degree == 1:
        return None
    mine = None
    for dp_index in range(world_size // (degree * tp)):
        for tp_index in range(tp):
            ranks = [dp_index * degree * tp + c * tp + tp_index for c in range(degree)]
            group = dist.new_group(ranks)
            if rank in ranks:
                mine = group
    return mine


def layout_problem(strategy: str, cp: int, tp: int, dp_replicate: int, world_size: int) -> str | None:
    """What is wrong with parallel.cp, parallel.dp_replicate and the rank count together, as one line; None if
    nothing."""
    if cp > 1 and strategy not in ("ddp", "fsdp", "hsdp"):
        return (
            f"parallel.cp {cp} needs parallel.strategy ddp, fsdp or hsdp (the cp ranks average their gradients "
            f"through it), not {strategy}"
        )
    if cp > 1 and world_size % (cp * tp):
        return (
            f"parallel.cp {cp} × parallel.tp {tp} = {cp * tp} ranks per replica does not divide the {world_size} "
            f"ranks of this run; start a multiple of {cp * tp} ranks or change parallel.cp"
        )
    if strategy == "hsdp" and tp > 1:
        return "parallel.strategy hsdp runs without tensor parallelism: set parallel.tp 1, or use fsdp with tp"
    if strategy == "hsdp" and world_size % dp_replicate:
        return (
            f"parallel.dp_replicate {dp_replicate} does not divide the {world_size} ranks of this run; pick a "
            f"divisor (ranks ÷ dp_replicate shard each replica)"
        )
    return None
