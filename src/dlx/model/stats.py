"""Exact parameter counts, computed on the meta device so that an 8B model costs no memory."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import torch
from torch import nn

from dlx.model.args import ModelArgs
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


def build_meta_model(args: ModelArgs) -> Transformer:
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
