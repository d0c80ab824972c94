"""Validation loss and perplexity: the mean next-token cross-entropy over the same first batches of the val split."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable

import torch
import torch.nn.functional as F
from torch import nn

from dlx.parallel.strategy import Strategy
from dlx.parallel.tensor import vocab_parallel_loss
from dlx.precision import Precision


def next_token_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of logits (B, T, vocab) against targets (B, T), computed in fp32 whatever the autocast."""
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())


def z_loss(logits: torch.Tensor) -> torch.Tensor:
    """Mean over tokens of log(Z)², Z = Σ_v exp(logit_v), of logits (B, T, vocab), in fp32: PaLM's and OLMo's z-loss,
    which `train.z_loss` weighs."""
    return logits.float().logsumexp(dim=-1).square().mean()


@torch.no_grad()
def evaluate(
    model: nn.Module,
    batches: Iterable,
    max_batches: int,
    precision: Precision,
    model_inputs: Callable[[torch.Tensor], dict] | None = None,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = next_token_loss,
) -> dict[str, float]:
    """{"loss", "perplexity", "batches", "eval_s"}; the model is put back in training mode afterwards.
    `model_inputs(inputs)`: keyword arguments for the model besides the tokens (document ids), as in training.
    `loss_fn`: the training loss (vocab-parallel under tensor parallelism)."""
    start = time.perf_counter()
    model.eval()
    losses: list[torch.Tensor] = []
    try:
        for inputs, targets in batches:
            with precision.autocast():
                logits = model(inputs, **(model_inputs(inputs) if model_inputs else {}))
            losses.append(loss_fn(logits, targets).detach())  # kept on the device: one sync at the end
            if len(losses) >= max_batches:
                break
    finally:
        model.train()
    loss = torch.stack(losses).double().mean().item() if losses else math.nan
    return {
        "loss": loss,
        "perplexity": perplexity(loss),
        "batches": len(losses),
        "eval_s": time.perf_counter() - start,
    }


def perplexity(loss: float) -> float:
    return math.exp(loss) if loss < 700 else math.inf  # exp overflows a float beyond ~709; NaN stays NaN


def training_loss(strategy: Strategy, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The one place the loss is chosen: under tensor parallelism the logits are vocabulary shards and the loss is
    computed on them (`vocab_parallel_loss`, the full logits are never gathered); otherwise `next_token_loss`."""
    if strategy.vocab_parallel:
        return vocab_parallel_loss(logits, targets)
    return next_token_loss(logits, targets)
