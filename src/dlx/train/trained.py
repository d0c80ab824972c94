"""A trained model, from whatever names one: a run folder (its newest complete checkpoint), a checkpoint of any layout
(model.safetensors, or its DCP shards read whole), a dlx model folder or a Hugging Face folder, with the tokenizer
that came with it. `dlx passkey`, `dlx eval --tasks passkey` and `dlx generate` find models through `resolve_trained`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from dlx.data.shards import TOKENIZER_FILE
from dlx.errors import UserError
from dlx.model.hf import HF_CONFIG_FILE
from dlx.model.io import WEIGHTS_FILE
from dlx.model.llama import Transformer
from dlx.train.checkpoint import DCP_METADATA, find_resumable, load_checkpoint_model


@dataclass(frozen=True)
class TrainedModel:
    model: Transformer
    weights: Path
    """The folder the weights were read from (a run folder's newest complete checkpoint)."""
    tokenizer: Any
    """The `tokenizers.Tokenizer` that came with the weights."""


def resolve_trained(path: Path) -> Path:
    """A checkpoint (or any dlx or Hugging Face model folder) itself, or the newest complete checkpoint of a run
    folder."""
    if any((path / name).is_file() for name in (WEIGHTS_FILE, DCP_METADATA, HF_CONFIG_FILE)):
        return path
    if not path.is_dir():
        raise UserError(f"{path} does not exist; give a run folder or a checkpoint folder")
    loaded = find_resumable(path, say=lambda text: print(text))
    if loaded is None:
        raise UserError(f"{path} holds no complete checkpoint (checkpoints/step-*/); train first or give a checkpoint")
    return loaded.path


def find_tokenizer_file(weights: Path) -> Path | None:
    """tokenizer.json beside the weights, or in the run folder above `checkpoints/step-N/`."""
    for candidate in (weights / TOKENIZER_FILE, weights.parent.parent / TOKENIZER_FILE):
        if candidate.is_file():
            return candidate
    return None


def find_tokenizer(checkpoint: Path) -> Any:
    """tokenizer.json beside the weights, or in the run folder above `checkpoints/`."""
    from tokenizers import Tokenizer

    found = find_tokenizer_file(checkpoint)
    if found is not None:
        return Tokenizer.from_file(str(found))
    raise UserError(
        f"no {TOKENIZER_FILE} for {checkpoint}: the run trained on synthetic data or its folder was moved; "
        f"copy the dataset's {TOKENIZER_FILE} into the run folder"
    )


def load_trained(path: Path, device: torch.device) -> TrainedModel:
    """The whole model `path` names, in one process on `device`, and its tokenizer (tokenizer first: a folder without
    one is refused before the weights are read)."""
    weights = resolve_trained(path)
    tokenizer = find_tokenizer(weights)
    return TrainedModel(load_checkpoint_model(weights, device), weights, tokenizer)
