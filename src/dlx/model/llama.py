"""The Llama-3 decoder: RMSNorm, real-valued RoPE (`dlx.model.rope`: plain or scaled tables), grouped-query
attention (causal through SDPA or flex_attention, `use_attention`; inside documents with `dlx.model.document_mask`;
a KV cache for `generate`), SwiGLU, and the chunked output loss (`dlx.model.loss`).

Module and parameter names follow Meta's reference code (`tok_embeddings`, `layers.N.attention.wq`, ...). The model
knows nothing of devices or parallelism: those are applied from outside (`dlx.parallel.wrap`, `dlx.parallel.strategy`),
and the attention kernel is chosen outside too (`dlx.train.observers.attention`).

Under autocast the residual stream stays fp32 (under FSDP2 too, whose gathered weights are bf16: the embedding's
output is made fp32 and dlx.parallel.wrap leaves block inputs uncast) and each RMSNorm hands the next matmuls its
output once in the compute dtype (bf16/fp16), where autocast would cast the same fp32 activation once per matmul
(q, k, v; w1, w3). RoPE then rotates q and k in that dtype with tables cast once per forward: against the
rotation in fp32 rounded to bf16 it differs by at most 2 · 2⁻⁷ · max|x| over each head vector (measured 1.33 at
seq 2048; tests/unit/test_model_perf.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from dlx.device import compute_capability_major
from dlx.model.args import ModelArgs
from dlx.model.document_mask import (
    DocumentMask,
    causal_block_mask,
    document_mask,
    masked_attention,
    positions_in_documents,
)
from dlx.model.kv_cache import KVCache
from dlx.model.loss import LossParts, OutputLoss
from dlx.model.rope import apply_rope, rope_tables

AttentionFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, "DocumentMask | None", "str | None"], torch.Tensor]
"""q (B, T, H, D), k and v (B, T, H_kv, D) after RoPE, the forward's `attention_mask`, the SDPA kernel applied
(`Attention.sdpa_kernel`) -> (B, H, T, D)."""

SDPA_HAS_GQA = torch.__version__ >= "2.5"
"""`F.scaled_dot_product_attention(enable_gqa=True)`: kv heads shared by query heads without copying them."""


def compute_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype matmuls on x run in: autocast's where it is on for x's device, else x's own."""
    if torch.is_autocast_enabled(x.device.type):
        return torch.get_autocast_dtype(x.device.type)
    return x.dtype


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalise in float32 whatever the autocast dtype, as Meta's and HF's implementations do; one cast at the end.
        normed = F.rms_norm(x.float(), (x.shape[-1],), self.weight.float(), eps=self.eps)
        return normed.to(compute_dtype(x))


class Attention(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.head_dim = args.head_dim
        self.wq = nn.Linear(args.dim, args.n_heads * args.head_dim, bias=False)
        self.wk = nn.Linear(args.dim, args.kv_heads * args.head_dim, bias=False)
        self.wv = nn.Linear(args.dim, args.kv_heads * args.head_dim, bias=False)
        self.wo = nn.Linear(args.n_heads * args.head_dim, args.dim, bias=False)
        self.sdpa_kernel: str | None = None
        """The SDPA kernel train.attention applied (None: SDPA's own choice); set by `Transformer.use_attention`."""
        self.attend: AttentionFn | None = None
        """Attention from outside for forwards over a slice of a sequence (context parallelism); set by
        `Transformer.use_attention_fn`."""

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        cache: KVCache | None = None,
        start_pos: int = 0,
        mask: DocumentMask | None = None,
        sliced: bool = False,
    ) -> torch.Tensor:
        batch, seq_len, _ = x.shape
        # Head counts come from the shapes: under tensor parallelism each rank holds a slice of the heads.
        q = self.wq(x).view(batch, seq_len, -1, self.head_dim)  # (B, T, local n_heads, head_dim)
        k = self.wk(x).view(batch, seq_len, -1, self.head_dim)  # (B, T, local n_kv_heads, head_dim)
        v = self.wv(x).view(batch, seq_len, -1, self.head_dim)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if cache is not None:
            k, v = cache.update(k, v, start_pos)  # (B, start_pos + T, n_kv_heads, head_dim)
        if sliced and self.attend is not None:
            out = self.attend(q, k, v, mask, self.sdpa_kernel)
        elif mask is not None:  # attention inside documents only (dlx.model.document_mask), GQA in the kernel
            out = masked_attention(*(t.transpose(1, 2) for t in (q, k, v)), mask)
        else:
            out = causal_attention(q, k, v, self.sdpa_kernel)
        out = out.transpose(1, 2).reshape(batch, seq_len, -1)  # (B, T, dim)
        return self.wo(out)


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kernel: str | None = None) -> torch.Tensor:
    """q (B, T, H, D), k and v (B, S, H_kv, D), the queries at the end of the keys -> (B, H, T, D). Grouped-query
    attention: each kv head serves H // H_kv query heads, shared inside SDPA where its fast kernel allows it. `kernel`:
    the SDPA kernel applied (`dlx.device.prefer_sdpa_kernel`), None for SDPA's own choice."""
    causal = _causal_mask_kwargs(q.shape[1], k.shape[1], q.device)
    n_rep = q.shape[2] // k.shape[2]
    gqa = n_rep > 1 and _sdpa_shares_kv_heads(q, masked="attn_mask" in causal, kernel=kernel)
    if n_rep > 1 and not gqa:
        k = k.repeat_interleave(n_rep, dim=2)  # (B, S, H, D)
        v = v.repeat_interleave(n_rep, dim=2)
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # (B, heads, T, D)
    return F.scaled_dot_product_attention(q, k, v, **causal, **({"enable_gqa": True} if gqa else {}))


def _sdpa_shares_kv_heads(q: torch.Tensor, masked: bool, kernel: str | None = None) -> bool:
    """Whether SDPA's `enable_gqa` keeps its fast kernel here. It runs in the flash kernels (CPU; CUDA bf16/fp16 from
    sm80, no mask) and the math one; PyTorch's CUDA memory-efficient kernel does not take it and would fall back to
    math, which stores the T×T scores, or, chosen alone (train.attention efficient), refuse the call. There k and v
    are repeated instead. `kernel` is passed in, not read from SDPA's flags: Dynamo cannot trace reading them."""
    if not SDPA_HAS_GQA:
        return False
    if q.device.type != "cuda":
        return True
    half = q.dtype in (torch.bfloat16, torch.float16)
    return half and not masked and kernel != "efficient" and compute_capability_major(q.device) >= 8


def _causal_mask_kwargs(n_queries: int, n_keys: int, device: torch.device) -> dict:
    """Causal attention for queries that sit at the end of the key sequence (prefill, decoding, training)."""
    if n_queries == n_keys:
        return {"is_causal": True}
    if n_queries == 1:
        return {}  # one new token attends to every cached key
    offset = n_keys - n_queries
    mask = torch.ones(n_queries, n_keys, dtype=torch.bool, device=device).tril(diagonal=offset)
    return {"attn_mask": mask}


class FeedForward(nn.Module):
    """SwiGLU: w2(silu(w1 x) * w3 x)."""

    def __init__(self, dim: int, hidden_dim: int):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden_dim, bias=False)
        self.w2 = nn.Linear(hidden_dim, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden_dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class TransformerBlock(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.attention = Attention(args)
        self.feed_forward = FeedForward(args.dim, args.ffn_hidden_dim)
        self.attention_norm = RMSNorm(args.dim, args.norm_eps)
        self.ffn_norm = RMSNorm(args.dim, args.norm_eps)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        cache: KVCache | None = None,
        start_pos: int = 0,
        mask: DocumentMask | None = None,
        sliced: bool = False,
    ) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x), cos, sin, cache, start_pos, mask, sliced)
        return h + self.feed_forward(self.ffn_norm(h))


class Transformer(nn.Module):
    """tokens (B, T) -> logits (B, T, vocab_size)."""

    def __init__(self, args: ModelArgs):
        super().__init__()
        self.args = args
        self.tok_embeddings = nn.Embedding(args.vocab_size, args.dim)
        self.layers = nn.ModuleList(TransformerBlock(args) for _ in range(args.n_layers))
        self.norm = RMSNorm(args.dim, args.norm_eps)
        self.output = nn.Linear(args.dim, args.vocab_size, bias=False)
        if args.tie_embeddings:
            self.output.weight = self.tok_embeddings.weight
        self.loss_fn = OutputLoss()
        """Hidden states and targets -> the loss, without whole-batch logits (dlx.model.loss); set from outside."""
        self.causal_kernel = "sdpa"
        """Causal attention without a KV cache through `sdpa` (whichever SDPA kernel is enabled) or `flex`
        (flex_attention with a causal block mask); set from outside (train.attention, dlx.model.attention_kernels)."""
        # RoPE tables are derived, not learned: never saved in checkpoints, rebuilt by `init_rope` after a meta init.
        self.init_rope(self.tok_embeddings.weight.device)
        if self.tok_embeddings.weight.device.type != "meta":
            self.init_weights()

    def use_attention(self, kernel: str | None) -> None:
        """Causal attention through `kernel` (train.attention's choice: flex, an SDPA kernel, or None for SDPA's own
        choice); the SDPA kernel itself is applied by `dlx.device.prefer_sdpa_kernel`, this tells each layer which it
        is, so that it hands SDPA kv heads the kernel takes (`causal_attention`)."""
        self.causal_kernel = "flex" if kernel == "flex" else "sdpa"
        for module in self.modules():
            if isinstance(module, Attention):
                module.sdpa_kernel = None if kernel == "flex" else kernel

    def use_attention_fn(self, attend: AttentionFn | None) -> None:
        """Every layer's attention through `attend` (None: the model's own) in forwards given `positions`, the slices
        of longer sequences; any other forward (generation, lm-eval requests) attends as the model alone does.
        Context parallelism gives one that gathers keys and values across ranks (dlx.parallel.context)."""
        for module in self.modules():
            if isinstance(module, Attention):
                module.attend = attend

    def init_rope(self, device: torch.device | str) -> None:
        cos, sin = rope_tables(self.args, device)  # (max_seq_len, head_dim) each
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    @torch.no_grad()
    def set_rope(self, rope_theta: float, rope_scaling: Any) -> None:
        """RoPE with another base or scaling from the next forward on: `args` and the tables, rewritten in place
        (same shape and dtype, so a compiled forward keeps its graph). Idempotent."""
        self.args = ModelArgs.model_validate(
            {**self.args.model_dump(), "rope_theta": rope_theta, "rope_scaling": rope_scaling}
        )
        cos, sin = rope_tables(self.args, self.rope_cos.device)
        self.rope_cos.copy_(cos)
        self.rope_sin.copy_(sin)

    @torch.no_grad()
    def init_weights(self, generator: torch.Generator | None = None) -> None:
        """Every parameter by `init_parameter_`, in registration order."""
        for name, param in self.named_parameters():
            self.init_parameter_(name, param, generator)

    @torch.no_grad()
    def init_parameter_(self, name: str, tensor: torch.Tensor, generator: torch.Generator | None = None) -> None:
        """Fill `tensor` as parameter `name` starts: ones for norms, Normal(0, 0.02) for embeddings and projections,
        scaled by 1/sqrt(2·n_layers) for the residual outputs (wo, w2)."""
        std = 0.02
        if tensor.ndim == 1:
            nn.init.ones_(tensor)
        elif name.endswith(("wo.weight", "w2.weight")):
            nn.init.normal_(tensor, std=std / (2 * self.args.n_layers) ** 0.5, generator=generator)
        else:
            nn.init.normal_(tensor, std=std, generator=generator)

    def forward(
        self,
        tokens: torch.Tensor,
        caches: list[KVCache] | None = None,
        start_pos: int = 0,
        document_ids: torch.Tensor | None = None,
        *,
        targets: torch.Tensor | None = None,
        z_loss: float = 0.0,
        positions: torch.Tensor | None = None,
        attention_mask: DocumentMask | None = None,
    ) -> torch.Tensor | LossParts:
        """tokens (B, T) -> logits (B, T, vocab_size); with targets (B, T): the next-token loss (`LossParts`, z-loss
        weighted by `z_loss`) computed chunk by chunk from the hidden states, no whole-batch logits made.
        `document_ids` (B, T): attend only within equal ids, positions restarting at each (no KV cache with it).
        `positions` (T,) or (B, T) and `attention_mask`: each token's RoPE position and the mask handed to every
        layer's attention, given instead of derived (a slice of a longer sequence: context parallelism)."""
        seq_len = tokens.shape[1]
        if start_pos + seq_len > self.args.max_seq_len:
            raise ValueError(f"sequence of {start_pos + seq_len} tokens exceeds max_seq_len={self.args.max_seq_len}")
        cos = self.rope_cos[start_pos : start_pos + seq_len]  # (T, head_dim)
        sin = self.rope_sin[start_pos : start_pos + seq_len]
        mask = attention_mask
        if positions is not None:
            cos, sin = self.rope_cos[positions], self.rope_sin[positions]  # (T or B × T, head_dim)
        elif document_ids is not None:
            if caches is not None:
                raise ValueError("document_ids cannot be combined with a KV cache")
            mask = document_mask(document_ids)  # None: one document per row, plain causal attention is exact
            if mask is not None:
                positions = positions_in_documents(document_ids)  # (B, T)
                cos, sin = self.rope_cos[positions], self.rope_sin[positions]  # (B, T, head_dim)
        if mask is None and self.causal_kernel == "flex" and caches is None and positions is None:
            mask = causal_block_mask(seq_len, tokens.device)  # plain causal attention, through flex_attention
        h = self.tok_embeddings(tokens)  # (B, T, dim)
        if torch.is_autocast_enabled(h.device.type):
            h = h.float()  # the residual stream in fp32, also where FSDP2 gathered the embedding in bf16
        cos, sin = cos.to(compute_dtype(h)), sin.to(compute_dtype(h))  # cast once per forward, not per layer
        sliced = positions is not None  # the layers attend through `use_attention_fn`'s function
        for i, layer in enumerate(self.layers):
            h = layer(h, cos, sin, caches[i] if caches is not None else None, start_pos, mask, sliced)
        h = self.norm(h)  # (B, T, dim) in the compute dtype
        if targets is None:
            return self.output(h)  # (B, T, vocab_size)
        return self.loss_fn(h, self.output, targets, z_loss)

    @torch.no_grad()
    def generate(self, prompt: torch.Tensor, max_new_tokens: int, **sampling) -> torch.Tensor:
        """Continue `prompt` (B, T) by `max_new_tokens` with a KV cache; see `dlx.model.generate.generate`."""
        from dlx.model.generate import generate

        return generate(self, prompt, max_new_tokens, **sampling)
