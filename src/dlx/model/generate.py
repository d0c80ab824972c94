"""Autoregressive sampling with a KV cache: greedy, temperature, top-k and top-p."""

from __future__ import annotations

from contextlib import AbstractContextManager

import torch

from dlx.model.kv_cache import KVCache


def run_eagerly() -> AbstractContextManager[None]:
    """Compiled blocks run their eager code inside: generation and lm-eval's requests change shape from call to call
    (each prompt, each cached position), and a compile per shape costs more than it saves. The training step's and
    validation's graphs are untouched."""
    return torch.compiler.set_stance("force_eager")


def sample_next(
    logits: torch.Tensor,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """logits (B, vocab) -> token ids (B,). temperature 0 is greedy."""
    if temperature <= 0:
        return logits.argmax(dim=-1)
    logits = logits.float() / temperature
    if top_k is not None and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
        # Drop a token when the tokens ranked above it already hold top_p of the mass; the best token always stays.
        drop_sorted = (cumulative - sorted_logits.softmax(dim=-1)) >= top_p
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    probs = logits.softmax(dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


@torch.no_grad()
def generate(
    model,
    prompt: torch.Tensor,
    max_new_tokens: int,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    eos_id: int | None = None,
    use_cache: bool = True,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """prompt (B, T) -> (B, T + n) with n <= max_new_tokens; stops early once every row has produced eos_id."""
    args = model.args
    total = min(prompt.shape[1] + max_new_tokens, args.max_seq_len)
    dtype = next(model.parameters()).dtype
    caches = None
    if use_cache:
        caches = [
            KVCache(prompt.shape[0], total, args.kv_heads, args.head_dim, dtype, prompt.device)
            for _ in range(args.n_layers)
        ]
    tokens, pos = prompt, 0
    finished = torch.zeros(prompt.shape[0], dtype=torch.bool, device=prompt.device)
    with run_eagerly():
        while tokens.shape[1] < total:
            if use_cache:
                logits = model(tokens[:, pos:], caches, start_pos=pos)
                pos = tokens.shape[1]
            else:
                logits = model(tokens)
            next_token = sample_next(logits[:, -1], temperature, top_k, top_p, generator)
            if eos_id is not None:
                next_token = torch.where(finished, torch.full_like(next_token, eos_id), next_token)
                finished |= next_token == eos_id
            tokens = torch.cat([tokens, next_token[:, None]], dim=1)
            if eos_id is not None and bool(finished.all()):
                break
    return tokens
