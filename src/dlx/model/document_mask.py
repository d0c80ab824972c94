"""Attention that stays inside documents, from per-token document ids (B, T): token j attends to token i only when
i ≤ j and both belong to the same document. The model takes the ids as they come; where they come from (eos_id
boundaries in packed windows) is the trainer's business.

Positions restart at 0 at every document's start. RoPE is relative, so inside one document the attention scores are
the same whatever the offset in exact arithmetic; restarting makes a packed document compute what it computes alone
(and what generation, which starts at position 0, sees), with the rotation angles as small as they can be.

Kernels, both PyTorch's own:
- CUDA: `flex_attention` with a `BlockMask`, both compiled: blocks wholly outside every document are skipped. The same
  path runs plain causal attention when train.attention is flex (`causal_block_mask`).
- elsewhere: `scaled_dot_product_attention` with a boolean mask (B, 1, T, T); for a batch without any boundary, plain
  causal SDPA (the same result; a mask makes the kernel visit the blocks above the diagonal too).
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import BlockMask, create_block_mask, flex_attention

DocumentMask = torch.Tensor | BlockMask
"""A boolean (B, 1, T, T) mask for SDPA, or a BlockMask for flex_attention."""


def positions_in_documents(document_ids: torch.Tensor) -> torch.Tensor:
    """Position of each token within its document, (B, T) int64: 0 where the id changes (and at the window's start)."""
    _, seq_len = document_ids.shape
    index = torch.arange(seq_len, device=document_ids.device).expand_as(document_ids)
    starts = torch.ones_like(document_ids, dtype=torch.bool)
    starts[:, 1:] = document_ids[:, 1:] != document_ids[:, :-1]
    last_start = torch.where(starts, index, torch.zeros_like(index)).cummax(dim=1).values
    return index - last_start


def uses_flex(device: torch.device) -> bool:
    """flex_attention where its compiled kernels run (CUDA); SDPA with a boolean mask elsewhere."""
    return device.type == "cuda"


def document_mask(document_ids: torch.Tensor) -> DocumentMask | None:
    """The mask for `masked_attention`, built once per forward and shared by every layer; on the SDPA path None when
    no row holds a document boundary, for plain causal attention is then the same thing and skips the blocks above
    the diagonal, which a mask cannot (document ids count from 0 along each row, so the last id says it)."""
    if uses_flex(document_ids.device):
        return _block_mask(document_ids)
    if not bool(document_ids[:, -1].any()):
        return None
    same_document = document_ids[:, :, None] == document_ids[:, None, :]  # (B, T, T)
    return same_document.tril().unsqueeze(1)  # (B, 1, T, T): causal as well


def _block_mask(document_ids: torch.Tensor) -> BlockMask:
    batch, seq_len = document_ids.shape

    def same_document_causal(b, h, q_idx, kv_idx):
        return (q_idx >= kv_idx) & (document_ids[b, q_idx] == document_ids[b, kv_idx])

    make = _compiled(create_block_mask) if document_ids.device.type == "cuda" else create_block_mask
    return make(same_document_causal, batch, None, seq_len, seq_len, device=document_ids.device)


@functools.lru_cache(maxsize=8)
def causal_block_mask(seq_len: int, device: torch.device) -> BlockMask:
    """The causal BlockMask of a (seq_len × seq_len) attention, for every batch row and head: one per length and
    device, built once (outside the compiled blocks, which take it as an input)."""

    def causal(b, h, q_idx, kv_idx):
        return q_idx >= kv_idx

    make = _compiled(create_block_mask) if device.type == "cuda" else create_block_mask
    return make(causal, None, None, seq_len, seq_len, device=device)


def masked_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: DocumentMask) -> torch.Tensor:
    """q (B, H, T, D), k and v (B, H_kv, T, D) with H a multiple of H_kv → (B, H, T, D)."""
    gqa = q.shape[1] != k.shape[1]
    if isinstance(mask, BlockMask):
        if torch.compiler.is_compiling() or q.device.type != "cuda":  # inside a compiled block: traced into its graph
            return flex_attention(q, k, v, block_mask=mask, enable_gqa=gqa)
        with torch._dynamo.config.patch(fail_on_recompile_limit_hit=True):  # an error, never eager's unfused kernel
            return _compiled(flex_attention)(q, k, v, block_mask=mask, enable_gqa=gqa)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=gqa)


@functools.cache
def _compiled(function):
    """flex_attention and create_block_mask are fused kernels only when compiled (torch.compile inlines them when the
    model is compiled too). A new batch's mask is a new closure over new ids of the same shape: no recompile
    (tests/integration/test_compile.py)."""
    return torch.compile(function, dynamic=False, fullgraph=True)
