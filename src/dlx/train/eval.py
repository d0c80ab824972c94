"""Validation loss and perplexity: the mean next-token cross-entropy over the same first batches of the val split."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable

import torch
from torch import nn

from dlx.model.loss import LossParts
from dlx.precision import Precision


@torch.no_grad()
def evaluate(
    model: nn.Module,
    batches: Iterable,
    max_batches: int,
    precision: Precision,
    model_inputs: Callable[[torch.Tensor], dict] | None,
    loss_fn: Callable[..., LossParts],
) -> dict[str, float]:
    """{"loss", "perplexity", "batches", "eval_s"}; the model is put back in training mode afterwards.
    `model_inputs(inputs)`: keyword arguments for the model besides the tokens (document ids), as in training.
    `loss_fn(model, inputs, targets, **model_inputs)`: the training loss (`dlx.train.objective.training_loss` with the
    run's strategy: vocab-parallel under tensor parallelism); its cross-entropy is what is averaged."""
    start = time.perf_counter()
    model.eval()
    losses: list[torch.Tensor] = []
    try:
        for inputs, targets in batches:
            with precision.autocast():
                extra = model_inputs(inputs) if model_inputs else {}
                loss = loss_fn(model, inputs, targets, **extra).cross_entropy
            losses.append(loss)  # kept on the device: one sync at the end
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
