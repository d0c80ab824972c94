"""What the step minimises, and what the model gets besides the tokens.

- Loss: the next-token cross-entropy (`next_token_loss`), plus `train.z_loss` × the z-loss (the mean squared
  log-partition of the logits, as in PaLM and OLMo; computed with the chunked loss, dlx.model.loss) when that weight is
  above 0. It keeps the softmax normaliser near 1, against the logit drift that makes bf16 training diverge. The logged
  `loss` stays the cross-entropy alone (comparable across runs and with the validation loss); `z_loss` is logged
  beside it: the weighted term as added to the minimised loss, for the record's step.
- Document masking (`data.document_mask`): per-token document ids from the eos_id boundaries of each window, for
  `Transformer(..., document_ids=...)`, in training and in evaluation alike.
"""

from __future__ import annotations

import torch

from dlx.data.loader import document_ids
from dlx.model.loss import LossParts


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
