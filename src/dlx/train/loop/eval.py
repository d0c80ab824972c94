"""Validation loss, perplexity and bits per byte: the mean next-token cross-entropy over the same first batches of the
val split, and the same cross-entropy in bits per UTF-8 byte of the evaluated targets (dlx.data.token_bytes)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable

import torch
from torch import nn

from dlx.model.loss import IGNORE_INDEX, LossParts
from dlx.precision import Precision


@torch.no_grad()
def evaluate(
    model: nn.Module,
    batches: Iterable,
    max_batches: int,
    precision: Precision,
    model_inputs: Callable[[torch.Tensor], dict] | None,
    loss_fn: Callable[..., LossParts],
    byte_lengths: torch.Tensor | None = None,
) -> dict[str, float]:
    """{"loss", "perplexity", "batches", "eval_s"}; the model is put back in training mode afterwards.
    `byte_lengths` (vocab,): bytes per token id; then also "nats" (Σ cross-entropy over the counted targets) and
    "target_bytes" (Σ their bytes), whose ratio ÷ ln 2 is bits per byte (`bits_per_byte`).
    `model_inputs(inputs)`: keyword arguments for the model besides the tokens (document ids), as in training.
    `loss_fn(model, inputs, targets, **model_inputs)`: the training loss (`dlx.train.build.objective.training_loss` with
    the run's strategy: vocab-parallel under tensor parallelism); its cross-entropy is what is averaged."""
    start = time.perf_counter()
    model.eval()
    losses: list[torch.Tensor] = []
    nats = target_bytes = torch.zeros((), dtype=torch.float64)
    try:
        for inputs, targets in batches:
            with precision.autocast():
                extra = model_inputs(inputs) if model_inputs else {}
                loss = loss_fn(model, inputs, targets, **extra).cross_entropy
            losses.append(loss)  # kept on the device: one sync at the end
            if byte_lengths is not None:
                counted = targets != IGNORE_INDEX
                nats = nats + loss.double() * counted.sum()  # the mean over counted targets, times their count
                target_bytes = target_bytes + torch.where(counted, byte_lengths[targets.clamp(min=0)], 0).sum()
            if len(losses) >= max_batches:
                break
    finally:
        model.train()
    loss = torch.stack(losses).double().mean().item() if losses else math.nan
    result = {"loss": loss, "perplexity": perplexity(loss), "batches": len(losses)}
    if byte_lengths is not None:
        result.update(nats=float(nats), target_bytes=float(target_bytes))
    return {**result, "eval_s": time.perf_counter() - start}


def bits_per_byte(nats: float, target_bytes: float) -> float | None:
    """Σ cross-entropy in nats over targets ÷ ln 2 ÷ the bytes they stand for; None when they stand for no bytes."""
    return nats / math.log(2) / target_bytes if target_bytes > 0 else None


def perplexity(loss: float) -> float:
    return math.exp(loss) if loss < 700 else math.inf  # exp overflows a float beyond ~709; NaN stays NaN
