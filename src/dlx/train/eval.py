"""Validation loss, perplexity and bits per byte: the mean next-token cross-entropy over the same first batches of the
val split, and the same cross-entropy in bits per UTF-8 byte of the evaluated targets (dlx.data.token_bytes)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable

import torch
from torch import nn

from dlx.model.loss import IGNORE_INDEX, LossParts
from dlx.parallel.strategy import Strategy
from dlx.parallel.tensor import vocab_parallel_loss
from dlx.precision import Precision


def next_token_loss(
    model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor, z_loss: float = 0.0, **model_inputs: torch.Tensor
) -> LossParts:
    """The model's loss on inputs (B, T) against targets (B, T): mean cross-entropy in fp32 whatever the autocast,
    plus `z_loss` × the z-loss (mean over tokens of log(Z)², Z = Σ_v exp(logit_v), as in PaLM and OLMo), each also
    apart (dlx.model.loss). Through the model (and any wrapper: DDP, FSDP, DeepSpeed), so that the loss is computed
    chunk by chunk from the hidden states, never from whole-batch logits. `model_inputs`: document ids."""
    return model(inputs, targets=targets, z_loss=z_loss, **model_inputs)


@torch.no_grad()
def evaluate(
    model: nn.Module,
    batches: Iterable,
    max_batches: int,
    precision: Precision,
    model_inputs: Callable[[torch.Tensor], dict] | None = None,
    loss_fn: Callable[..., LossParts] = next_token_loss,
    byte_lengths: torch.Tensor | None = None,
) -> dict[str, float]:
    """{"loss", "perplexity", "batches", "eval_s"}; the model is put back in training mode afterwards.
    `byte_lengths` (vocab,): bytes per token id; then also "nats" (Σ cross-entropy over the counted targets) and
    "target_bytes" (Σ their bytes), whose ratio ÷ ln 2 is bits per byte (`bits_per_byte`).
    `model_inputs(inputs)`: keyword arguments for the model besides the tokens (document ids), as in training.
    `loss_fn(model, inputs, targets, **model_inputs)`: the training loss (`training_loss`: vocab-parallel under tensor
    parallelism); its cross-entropy is what is averaged."""
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


def training_loss(
    strategy: Strategy,
    model: nn.Module,
    inputs: torch.Tensor,
    targets: torch.Tensor,
    z_loss: float = 0.0,
    **model_inputs: torch.Tensor,
) -> LossParts:
    """The one place the loss is chosen. Under tensor parallelism the model's logits are vocabulary shards and the
    cross-entropy is computed on them (`vocab_parallel_loss`: the full logits are never gathered; train.z_loss is
    refused there, so the z-loss is not computed and reads NaN). Otherwise the model's own chunked loss
    (`next_token_loss`: no whole-batch logits at all), with the z-loss weighted by `z_loss`."""
    if strategy.vocab_parallel:
        ce = vocab_parallel_loss(model(inputs, **model_inputs), targets)
        return LossParts(ce, ce.detach(), torch.full_like(ce.detach(), math.nan))
    return next_token_loss(model, inputs, targets, z_loss, **model_inputs)
