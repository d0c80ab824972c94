"""Document boundaries inside packed windows, for position resets or document masking.

The loader returns no extra tensor for them: every document ends with eos_id, so the boundaries are in the tokens
already, and this computes them on whatever device the batch is on, only for trainers that want them.
"""

from __future__ import annotations

import torch


def document_positions(inputs: torch.Tensor, eos_id: int) -> torch.Tensor:
    """Position of each token within its document, restarting at 0 after every eos_id; shape and device of `inputs`.

    A window starts mid-document in general; its first token gets position 0 all the same.
    """
    _, seq_len = inputs.shape  # (B, T)
    index = torch.arange(seq_len, device=inputs.device).expand_as(inputs)
    starts = torch.zeros_like(inputs, dtype=torch.bool)
    starts[:, 0] = True
    starts[:, 1:] = inputs[:, :-1] == eos_id
    last_start = torch.where(starts, index, torch.zeros_like(index)).cummax(dim=1).values
    return index - last_start


def document_ids(inputs: torch.Tensor, eos_id: int) -> torch.Tensor:
    """Which document of its window each token belongs to, (B, T) int64 from 0: a new one begins after every eos_id
    (the eos_id itself belongs to the document it ends). For `Transformer(..., document_ids=...)`."""
    starts = torch.zeros_like(inputs, dtype=torch.int64)
    starts[:, 1:] = inputs[:, :-1] == eos_id
    return starts.cumsum(dim=1)
