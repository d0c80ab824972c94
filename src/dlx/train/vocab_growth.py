"""A larger vocabulary at `model.init_from`: the weights' embedding and output head grow to the dataset's tokenizer.

When the dataset was prepared with an extension of the weights' tokenizer (`dlx tokenizer extend`: every old token at
its id, new ones after), the model's vocabulary becomes the extended tokenizer's size rounded up to a multiple of
`model.pad_vocab_to` (decided once, when the recipe is loaded). Every old row is copied as it is stored, so the logits
over the old vocabulary are the weights' own; each new token's row (in the embedding and, untied, in the output head)
starts as the mean of the rows of the base pieces the weights' tokenizer splits it into; rows no token uses (padding)
start as the mean of all stored rows. Each rank computes the grown tensor and keeps the part its layout holds, as the
rest of init_from's loading does (`dlx.parallel.materialize.local_region`).
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
from safetensors import safe_open

from dlx.data.shards import TOKENIZER_FILE, read_manifest
from dlx.data.tokenizer_identity import describe_extension_problem, is_extension, read_identity
from dlx.errors import UserError
from dlx.model.io import StoredTensor
from dlx.parallel.materialize import local_region

VOCAB_TENSORS = ("tok_embeddings.weight", "output.weight")


def dataset_tokenizer(data_path: str | None, mix: dict[str, float] | None) -> tuple[Path, int] | None:
    """The dataset's tokenizer.json and vocabulary size (a data.mix's first source: they share one); None for
    synthetic data or a folder that is not a prepared dataset (the data checks say why later)."""
    folder = Path(next(iter(sorted(mix))) if mix else data_path or "")
    if not (folder / TOKENIZER_FILE).is_file():
        return None
    try:
        return folder / TOKENIZER_FILE, read_manifest(folder).vocab_size
    except UserError:
        return None


def grown_vocab_size(
    weights_vocab: int, weights_tokenizer: Path | None, data: tuple[Path, int] | None, pad_to: int, where: str
) -> int | None:
    """The vocabulary the model grows to when the data's tokens outnumber the weights' rows and the weights come with
    a tokenizer; None when it does not grow. The data's tokenizer must extend the weights' (one line otherwise)."""
    if data is None or data[1] <= weights_vocab or weights_tokenizer is None:
        return None  # without the weights' tokenizer nothing says the data's extends it: the data check refuses it
    tokenizer, data_vocab = data
    problem = describe_extension_problem(read_identity(weights_tokenizer), read_identity(tokenizer))
    if problem is not None:
        raise UserError(
            f"{where} was prepared with a tokenizer that is neither model.init_from's {weights_tokenizer} nor an "
            f"extension of it ({problem}); prepare it with that tokenizer or one `dlx tokenizer extend` made from it"
        )
    return pad_to * math.ceil(data_vocab / pad_to)


def new_token_pieces(weights_tokenizer: Path, data_tokenizer: Path, vocab_size: int) -> tuple[int, list[list[int]]]:
    """(the first new id, for each id from it up to vocab_size the base ids of its pieces; [] for padding rows)."""
    from dlx.data.prepare.tokenizer import load_tokenizer
    from dlx.data.tokenizer_extend import base_pieces

    first = read_identity(weights_tokenizer).vocab_size
    return first, base_pieces(load_tokenizer(weights_tokenizer), load_tokenizer(data_tokenizer), first, vocab_size)


def grown_tensor(stored: torch.Tensor, first_new: int, pieces: list[list[int]]) -> torch.Tensor:
    """(first_new + len(pieces), dim): the stored rows below `first_new`, then each new row the mean of its pieces'
    rows (the mean of all stored rows when it has none), computed in float32."""
    old = stored.float()
    mean = old.mean(dim=0)
    rows = [old[piece].mean(dim=0) if piece else mean for piece in pieces]
    new = torch.stack(rows) if rows else old.new_empty(0, old.shape[1])
    return torch.cat([old[:first_new], new]).to(stored.dtype)


@torch.no_grad()
def fill_grown(
    model: torch.nn.Module, stored: dict[str, StoredTensor], first_new: int, pieces: list[list[int]]
) -> None:
    """Fill the embedding (and an untied output head) from their stored rows and the new rows; each rank its part."""
    params = dict(model.named_parameters())
    for name in VOCAB_TENSORS:
        if name not in stored or name not in params:
            continue
        with safe_open(str(stored[name].file), framework="pt") as f:
            whole = grown_tensor(f.get_tensor(stored[name].key), first_new, pieces)
        target = params[name]
        local = target.to_local() if hasattr(target, "to_local") else target
        local.copy_(whole[local_region(target)].to(local.dtype))


def extends(weights_tokenizer: Path | None, data_tokenizer: Path | None) -> bool:
    """The data's tokenizer is a strict extension of the weights' (new rows to initialise from pieces)."""
    if weights_tokenizer is None or data_tokenizer is None:
        return False
    return is_extension(read_identity(weights_tokenizer), read_identity(data_tokenizer))
