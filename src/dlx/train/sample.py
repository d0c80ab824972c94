"""`dlx generate`: a trained model and its run's tokenizer, from a run folder or one checkpoint folder."""

from __future__ import annotations

from pathlib import Path

import torch

from dlx import device as dev
from dlx.data.shards import TOKENIZER_FILE
from dlx.errors import UserError
from dlx.model.io import WEIGHTS_FILE, load_model
from dlx.train.checkpoint import find_resumable
from dlx.train.init_from import find_tokenizer_file


def resolve_checkpoint(path: Path) -> Path:
    """A checkpoint (or any dlx model folder) itself, or the newest complete checkpoint of a run folder."""
    if (path / WEIGHTS_FILE).is_file():
        return path
    if not path.is_dir():
        raise UserError(f"{path} does not exist; give a run folder or a checkpoint folder")
    loaded = find_resumable(path, say=lambda text: print(text))
    if loaded is None:
        raise UserError(f"{path} holds no complete checkpoint (checkpoints/step-*/); train first or give a checkpoint")
    return loaded.path


def find_tokenizer(checkpoint: Path):
    """tokenizer.json beside the weights, or in the run folder above `checkpoints/`."""
    from tokenizers import Tokenizer

    found = find_tokenizer_file(checkpoint)
    if found is not None:
        return Tokenizer.from_file(str(found))
    raise UserError(
        f"no {TOKENIZER_FILE} for {checkpoint}: the run trained on synthetic data or its folder was moved; "
        f"copy the dataset's {TOKENIZER_FILE} into the run folder"
    )


def sample_text(
    path: Path,
    prompt: str,
    max_new_tokens: int = 100,
    temperature: float = 0.8,
    top_k: int | None = 50,
    top_p: float | None = None,
    seed: int = 0,
    device: str = "auto",
) -> str:
    checkpoint = resolve_checkpoint(path)
    tokenizer = find_tokenizer(checkpoint)
    torch_device = dev.resolve_device(device)
    model = load_model(checkpoint, torch_device)
    return continue_text(model, tokenizer, prompt, max_new_tokens, temperature, top_k, top_p, seed)


def continue_text(
    model,
    tokenizer,
    prompt: str,
    max_new_tokens: int,
    temperature: float = 0.8,
    top_k: int | None = 50,
    top_p: float | None = None,
    seed: int = 0,
) -> str:
    """The prompt and its sampled continuation, decoded; stops early at the end-of-document token."""
    ids = tokenizer.encode(prompt).ids
    if not ids:
        raise UserError("--prompt encodes to no tokens; give some text")
    device = next(model.parameters()).device
    room = model.args.max_seq_len - 1
    prompt_ids = torch.tensor([ids[-room:]], device=device)
    generator = torch.Generator(device=device).manual_seed(seed)
    eos_id = _eos_id(tokenizer)
    model.eval()
    out = model.generate(
        prompt_ids,
        max_new_tokens,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        eos_id=eos_id,
        generator=generator,
    )
    return tokenizer.decode(out[0].tolist(), skip_special_tokens=True)


def _eos_id(tokenizer) -> int | None:
    for token in ("<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>"):
        token_id = tokenizer.token_to_id(token)
        if token_id is not None:
            return token_id
    return None
