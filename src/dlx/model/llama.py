"""The Llama-3 decoder: RMSNorm, real-valued RoPE, grouped-query attention through SDPA, SwiGLU.

Module and parameter names follow Meta's reference code (`tok_embeddings`, `layers.N.attention.wq`, ...). The model
knows nothing of devices, precision or parallelism: those are applied from outside (see `dlx.train`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from dlx.model.args import ModelArgs
from dlx.model.kv_cache import KVCache
from dlx.model.rope import apply_rope, rope_tables


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalise in float32 whatever the autocast dtype, as Meta's and HF's implementations do.
        normed = F.rms_norm(x.float(), (x.shape[-1],), eps=self.eps).type_as(x)
        return normed * self.weight


class Attention(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = args.n_heads, args.kv_heads, args.head_dim
        self.wq = nn.Linear(args.dim, args.n_heads * args.head_dim, bias=False)
        self.wk = nn.Linear(args.dim, args.kv_heads * args.head_dim, bias=False)
        self.wv = nn.Linear(args.dim, args.kv_heads * args.head_dim, bias=False)
        self.wo = nn.Linear(args.n_heads * args.head_dim, args.dim, bias=False)

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache: KVCache | None = None, start_pos: int = 0
    ) -> torch.Tensor:
        batch, seq_len, _ = x.shape
        q = self.wq(x).view(batch, seq_len, self.n_heads, self.head_dim)
        k = self.wk(x).view(batch, seq_len, self.n_kv_heads, self.head_dim)
        v = self.wv(x).view(batch, seq_len, self.n_kv_heads, self.head_dim)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if cache is not None:
            k, v = cache.update(k, v, start_pos)  # (B, start_pos + T, n_kv_heads, head_dim)
        # Grouped-query attention: each kv head serves n_heads // n_kv_heads query heads.
        n_rep = self.n_heads // self.n_kv_heads
        if n_rep > 1:
            k = k.repeat_interleave(n_rep, dim=2)
            v = v.repeat_interleave(n_rep, dim=2)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # (B, heads, T, head_dim)
        out = F.scaled_dot_product_attention(q, k, v, **_causal_mask_kwargs(seq_len, k.shape[2], q.device))
        out = out.transpose(1, 2).reshape(batch, seq_len, -1)  # (B, T, dim)
        return self.wo(out)


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
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache: KVCache | None = None, start_pos: int = 0
    ) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x), cos, sin, cache, start_pos)
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
        # RoPE tables are derived, not learned: never saved in checkpoints, rebuilt by `init_rope` after a meta init.
        self.init_rope(self.tok_embeddings.weight.device)
        if self.tok_embeddings.weight.device.type != "meta":
            self.init_weights()

    def init_rope(self, device: torch.device | str) -> None:
        cos, sin = rope_tables(self.args, device)  # (max_seq_len, head_dim) each
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    @torch.no_grad()
    def init_weights(self, std: float = 0.02) -> None:
        """Normal(0, std) for embeddings and projections, scaled by 1/sqrt(2·n_layers) for the residual outputs."""
        residual_std = std / (2 * self.args.n_layers) ** 0.5
        for name, param in self.named_parameters():
            if param.ndim == 1:
                nn.init.ones_(param)
            elif name.endswith(("wo.weight", "w2.weight")):
                nn.init.normal_(param, std=residual_std)
            else:
                nn.init.normal_(param, std=std)

    def forward(self, tokens: torch.Tensor, caches: list[KVCache] | None = None, start_pos: int = 0) -> torch.Tensor:
        seq_len = tokens.shape[1]
        if start_pos + seq_len > self.args.max_seq_len:
            raise ValueError(f"sequence of {start_pos + seq_len} tokens exceeds max_seq_len={self.args.max_seq_len}")
        cos = self.rope_cos[start_pos : start_pos + seq_len]
        sin = self.rope_sin[start_pos : start_pos + seq_len]
        h = self.tok_embeddings(tokens)  # (B, T, dim)
        for i, layer in enumerate(self.layers):
            h = layer(h, cos, sin, caches[i] if caches is not None else None, start_pos)
        return self.output(self.norm(h))  # (B, T, vocab_size)

    @torch.no_grad()
    def generate(self, prompt: torch.Tensor, max_new_tokens: int, **sampling) -> torch.Tensor:
        """Continue `prompt` (B, T) by `max_new_tokens` with a KV cache; see `dlx.model.generate.generate`."""
        from dlx.model.generate import generate

        return generate(self, prompt, max_new_tokens, **sampling)
