"""Training FLOPs per token, in two stated conventions, counted from the model's shapes.

`dense`   6·N: N counts the weights of every matmul (attention and FFN projections of every layer, and the output
          projection even when tied to the embedding); the embedding lookup and the norms do no matmul and are left out.
          Forward is 2·N FLOPs per token (one multiply and one add per weight), backward twice that: 6·N.
`attention` 6·N + 12·L·H·Q·T: adds the attention matmuls (QKᵀ and A·V, 2·2·H·Q·T per token per layer forward, ×3 with
          backward) for L layers, H query heads, head dim Q, sequence length T. The causal mask halves the useful work,
          but like PaLM and torchtitan we count the full square: it is what dense kernels compute.
Activation recomputation (checkpointing) is not counted: MFU measures useful model FLOPs, not hardware FLOPs.
"""

from __future__ import annotations

from dataclasses import dataclass

from dlx.model.args import ModelArgs
from dlx.model.stats import ParamFormula

CONVENTIONS = {
    "dense": "6·N, N = matmul weights (layers + output projection, embedding lookup excluded)",
    "attention": "6·N + 12·L·H·Q·T (attention scores and values included, full causal square)",
}


def matmul_params(args: ModelArgs) -> int:
    """N: the weights that multiply activations once per token (`dlx.model.stats.ParamFormula.matmul`)."""
    return ParamFormula(args).matmul


@dataclass(frozen=True)
class FlopsPerToken:
    dense: float
    """6·N."""
    attention: float
    """6·N + 12·L·H·Q·T."""

    def get(self, convention: str) -> float:
        return getattr(self, convention)


def training_flops_per_token(args: ModelArgs, seq_len: int) -> FlopsPerToken:
    dense = 6.0 * matmul_params(args)
    attention = 12.0 * args.n_layers * args.n_heads * args.head_dim * seq_len
    return FlopsPerToken(dense=dense, attention=dense + attention)
