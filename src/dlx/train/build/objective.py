"""What the step minimises, and what the model gets besides the tokens.

- Loss (`training_loss`, the one function that computes it, in training and evaluation): the next-token
  cross-entropy, plus `train.z_loss` × the z-loss (the mean squared log-partition of the logits, as in PaLM and OLMo;
  computed with the chunked loss, dlx.model.loss) when that weight is above 0. It keeps the softmax normaliser near 1,
  against the logit drift that makes bf16 training diverge. The logged `loss` stays the cross-entropy alone
  (comparable across runs and with the validation loss); `z_loss` is logged beside it: the weighted term as added to
  the minimised loss, for the record's step.
- Document masking (`data.document_mask`): per-token document ids from the eos_id boundaries of each window, for
  `Transformer(..., document_ids=...)`, in training and in evaluation alike.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from dlx.data.loader import document_ids
from dlx.model.loss import LossParts
from dlx.parallel.strategy import Strategy
from dlx.parallel.tensor import vocab_parallel_loss


def training_loss(
    strategy: Strategy,
    model: nn.Module,
    inputs: torch.Tensor,
    targets: torch.Tensor,
    z_loss: float = 0.0,
    **model_inputs: torch.Tensor,
) -> LossParts:
    """The model's loss on inputs (B, T) against targets (B, T), in training and evaluation: mean cross-entropy in fp32
    whatever the autocast, plus `z_loss` × the z-loss (mean over tokens of log(Z)², Z = Σ_v exp(logit_v)), each also
    apart. Through the model (and any wrapper: DDP, FSDP, DeepSpeed), so that the loss is computed chunk by chunk from
    the hidden states (`dlx.model.loss`), never from whole-batch logits. Under tensor parallelism the model's logits
    are vocabulary shards and the cross-entropy is computed on them (`vocab_parallel_loss`: the full logits are never
    gathered; train.z_loss is refused there, so the z-loss reads NaN). `model_inputs`: document ids.
    Under context parallelism each rank computes its part of every sequence, its loss weighted so that the mean over
    the cp ranks is the whole sequences' loss (`dlx.parallel.context`)."""
    context = strategy.context
    if context is None:
        return _loss(strategy, model, inputs, targets, z_loss, **model_inputs)
    inputs, targets, model_inputs, weight = context.shard(inputs, targets, model_inputs)
    parts = _loss(strategy, model, inputs, targets, z_loss, **model_inputs)
    return LossParts(*(part * weight for part in parts))


def _loss(strategy: Strategy, model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor, z_loss: float, **kw):
    if strategy.vocab_parallel:
        ce = vocab_parallel_loss(model(inputs, **kw), targets)
        return LossParts(ce, ce.detach(), torch.full_like(ce.detach(), math.nan))
    return model(inputs, targets=targets, z_loss=z_loss, **kw)


class Objective:
    def __init__(self, z_loss_weight: float = 0.0, document_eos: int | None = None):
        """`document_eos`: the eos_id that ends each document when attention is masked per document, else None."""
        self.z_loss_weight = z_loss_weight
        self.document_eos = document_eos
        self._micro_step = 0
        self._step_z: torch.Tensor | None = None

    def model_inputs(self, inputs: torch.Tensor) -> dict[str, torch.Tensor]:
        """Keyword arguments for the model besides the tokens (B, T)."""
        if self.document_eos is None:
            return {}
        return {"document_ids": document_ids(inputs, self.document_eos)}

    def record_z_loss(self, parts: LossParts, accum: int) -> None:
        """Add one of `accum` micro-steps' weighted z-loss (weight × z / accum, as it is in the minimised loss) to the
        step's; nothing when the weight is 0."""
        if not self.z_loss_weight:
            return
        term = self.z_loss_weight * parts.z_loss.detach() / accum
        first = self._micro_step == 0
        self._step_z = term if first else self._step_z + term
        self._micro_step = (self._micro_step + 1) % accum

    def step_z_loss(self) -> torch.Tensor | None:
        """The weighted z-loss of the last complete step (a device tensor), or None when it is off."""
        return self._step_z if self.z_loss_weight else None


def build_objective(z_loss_weight: float, document_mask: bool, eos_id: int) -> Objective:
    return Objective(z_loss_weight, eos_id if document_mask else None)


PLAIN = Objective()
"""Cross-entropy only, no document ids: what `accumulate_gradients` uses unless told otherwise."""
