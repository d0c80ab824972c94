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
from typing import Any

import torch
from safetensors import safe_open

from dlx.data import storage
from dlx.data.mixture.sources import parse_mix
from dlx.data.remote import mirror_dataset
from dlx.data.shards import TOKENIZER_FILE, read_manifest
from dlx.data.tokenizer_identity import describe_extension_problem, read_identity
from dlx.errors import UserError
from dlx.model.io import StoredTensor
from dlx.parallel.materialize import local_region

VOCAB_TENSORS = ("tok_embeddings.weight", "output.weight")


def dataset_tokenizer(data_path: Any, mix: Any, cache_dir: Any = "") -> tuple[Path, int] | None:
    """The dataset's tokenizer.json and vocabulary size (a data.mix's first source: they share one); None for
    synthetic data, a folder that is not a prepared dataset or a data section validation refuses (the data checks
    say why later). `mix` as the recipe gives it: a mapping, or `PATH=W,...`. A dataset in object storage is read
    from its mirror under `cache_dir` (data.cache_dir), fetched now if it is not there yet: the same folder and
    verified files the run trains from; None when the bucket cannot be read (the run's own mirroring says why)."""
    if isinstance(mix, str):
        try:
            mix = parse_mix(mix)
        except ValueError:
            return None
    if mix and (not isinstance(mix, dict) or not all(isinstance(key, str) for key in mix)):
        return None
    first = next(iter(sorted(mix))) if mix else data_path if isinstance(data_path, str) else ""
    folder = mirrored_folder(first, cache_dir if isinstance(cache_dir, str) else "", bool(mix))
    if folder is None or not (folder / TOKENIZER_FILE).is_file():
        return None
    try:
        return folder / TOKENIZER_FILE, read_manifest(folder).vocab_size
    except UserError:
        return None


def mirrored_folder(path: str, cache_dir: str, in_mix: bool) -> Path | None:
    """`path` itself, or for a URL its dataset's mirror (`dlx.data.remote.mirror_dataset`); None when that fails."""
    if not storage.is_url(path):
        return Path(path)
    try:
        return mirror_dataset(path, cache_dir, "data.mix source" if in_mix else "data.path")
    except UserError:
        return None


def data_extends_weights(weights_tokenizer: Path | None, data_tokenizer: Path | None, where: str) -> bool:
    """Whether the data's tokenizer is a strict extension of the weights' (`dlx tokenizer extend`: every old token at
    its id, new ones after), whose new rows start from their pieces; False when it is the weights' own or either is
    unknown. A tokenizer that is neither is one line naming `where` (the data) and the fix."""
    if weights_tokenizer is None or data_tokenizer is None:
        return False
    base, data = read_identity(weights_tokenizer), read_identity(data_tokenizer)
    problem = describe_extension_problem(base, data)
    if problem is not None:
        raise UserError(
            f"{where} was prepared with a tokenizer that is neither model.init_from's {weights_tokenizer} nor an "
            f"extension of it ({problem}); prepare the data again with --tokenizer {weights_tokenizer} (or one "
            "`dlx tokenizer extend` made from it)"
        )
    return data.vocab_size > base.vocab_size


def grown_vocab_size(
    weights_vocab: int, weights_tokenizer: Path | None, data: tuple[Path, int], pad_to: int, where: str
) -> int | None:
    """The vocabulary the model grows to when the data's tokens outnumber the weights' rows and the weights come with
    a tokenizer; None when it does not grow. The data's tokenizer must extend the weights' (one line otherwise)."""
    tokenizer, data_vocab = data
    if data_vocab <= weights_vocab or weights_tokenizer is None:
        return None  # without the weights' tokenizer nothing says the data's extends it: the data check refuses it
    data_extends_weights(weights_tokenizer, tokenizer, where)
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
