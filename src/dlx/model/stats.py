"""Parameter counts: the one formula from a model's shape (`ParamFormula`, what the planner and the FLOPs count read),
and the real module's count on the meta device (`model_stats`, so that an 8B model costs no memory); a test holds the
two equal.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import TYPE_CHECKING

from dlx.model.args import ModelArgs

if TYPE_CHECKING:
    from torch import nn

    from dlx.model.llama import Transformer


@dataclass(frozen=True)
class ParamStats:
    trainable: int
    untrainable: int
    embedding: int
    """Parameters of the token embedding (a lookup, no FLOPs). A tied output projection shares them."""
    per_module: dict[str, int]
    """Top-level module -> parameter count; repeated blocks are summed under `layers`."""

    @property
    def total(self) -> int:
        return self.trainable + self.untrainable

    @property
    def non_embedding(self) -> int:
        """Every parameter but the token embedding (torchtitan's count); the untied output projection is included."""
        return self.total - self.embedding


@dataclass(frozen=True)
class ParamFormula:
    """The Llama-3 decoder's parameters by part, from its shape alone (no biases anywhere):

    embedding   vocab × dim                                 (a lookup: no matmul)
    attention   2 × dim × H·Q (wq, wo) + 2 × dim × K·Q (wk, wv)  per layer; H, K query and kv heads, Q head dim
    ffn         3 × dim × ffn_hidden_dim (w1, w2, w3)       per layer
    norms       (2 × n_layers + 1) × dim                    (two RMSNorms per layer and the final one)
    output      dim × vocab                                 (the same tensor as the embedding when tied)
    """

    args: ModelArgs

    @property
    def attention(self) -> int:
        a = self.args
        return 2 * a.dim * a.n_heads * a.head_dim + 2 * a.dim * a.kv_heads * a.head_dim

    @property
    def ffn(self) -> int:
        return 3 * self.args.dim * self.args.ffn_hidden_dim

    @property
    def norms(self) -> int:
        return (2 * self.args.n_layers + 1) * self.args.dim

    @property
    def embedding(self) -> int:
        return self.args.vocab_size * self.args.dim

    @property
    def matmul(self) -> int:
        """The weights that multiply activations once per token (the FLOPs count's N): every layer's projections and
        the output projection, tied or not."""
        return self.args.n_layers * (self.attention + self.ffn) + self.embedding

    @property
    def total(self) -> int:
        """Every parameter once (a tied output projection is the embedding's tensor)."""
        output = 0 if self.args.tie_embeddings else self.embedding
        return self.embedding + self.args.n_layers * (self.attention + self.ffn) + self.norms + output

    def per_tensor_parallel_rank(self, tp: int) -> float:
        """Parameters one tensor-parallel rank holds: the norm weights whole, everything else ÷ tp."""
        return self.norms + (self.total - self.norms) / tp


def build_meta_model(args: ModelArgs) -> Transformer:
    import torch  # the formula above needs none of it

    from dlx.model.llama import Transformer

    with torch.device("meta"):
        return Transformer(args)


def count_parameters(model: nn.Module) -> ParamStats:
    """Shared (tied) parameters are counted once, as `sum(p.numel() for p in model.parameters())` does."""
    trainable = untrainable = 0
    per_module: dict[str, int] = defaultdict(int)
    for name, param in model.named_parameters():  # named_parameters yields a tied tensor only once
        if param.requires_grad:
            trainable += param.numel()
        else:
            untrainable += param.numel()
        per_module[name.split(".")[0]] += param.numel()
    embedding = model.tok_embeddings.weight.numel() if hasattr(model, "tok_embeddings") else 0
    return ParamStats(trainable, untrainable, embedding, dict(per_module))


def model_stats(args: ModelArgs) -> ParamStats:
    return count_parameters(build_meta_model(args))
