"""dlx's own weight folder: `model.safetensors` + `model_args.json`. Checkpoints and `dlx import-hf` write it."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from dlx.atomic import atomic_dir
from dlx.errors import UserError
from dlx.model.args import ModelArgs
from dlx.model.llama import Transformer

WEIGHTS_FILE = "model.safetensors"
ARGS_FILE = "model_args.json"


def unique_state_dict(model: Transformer) -> dict[str, torch.Tensor]:
    """The state dict with a tied output projection left out (it is the embedding), tensors made contiguous."""
    state = model.state_dict()
    if model.args.tie_embeddings:
        state.pop("output.weight", None)
    return {name: t.detach().contiguous() for name, t in state.items()}


def write_weights(model: Transformer, folder: Path) -> None:
    """Write into an existing (temporary) folder; callers make the folder appear atomically."""
    write_weight_dict(unique_state_dict(model), model.args, folder)


def write_weight_dict(state: dict[str, torch.Tensor], args: ModelArgs, folder: Path) -> None:
    """The same from a state dict (e.g. gathered from FSDP shards); a tied output projection is left out."""
    if args.tie_embeddings:
        state = {name: t for name, t in state.items() if name != "output.weight"}
    state = {name: t.detach().contiguous() for name, t in state.items()}
    save_file(state, str(folder / WEIGHTS_FILE), metadata={"format": "pt"})
    (folder / ARGS_FILE).write_text(args.model_dump_json(indent=2) + "\n")


def save_model(model: Transformer, out_dir: str | Path, overwrite: bool = False) -> Path:
    out_dir = Path(out_dir)
    if out_dir.exists() and not overwrite:
        raise UserError(f"{out_dir} already exists; choose another output folder or remove it")
    with atomic_dir(out_dir, overwrite=overwrite) as tmp:
        write_weights(model, tmp)
    return out_dir


def model_from_state_dict(args: ModelArgs, state: dict[str, torch.Tensor], device: str | torch.device) -> Transformer:
    """Build on the meta device and adopt the given tensors (no second copy, no random init)."""
    with torch.device("meta"):
        model = Transformer(args)
    if args.tie_embeddings:
        state = {k: v for k, v in state.items() if k != "output.weight"}
        state["output.weight"] = state["tok_embeddings.weight"]
    missing = set(model.state_dict()) - set(state)
    unexpected = set(state) - set(model.state_dict())
    if missing or unexpected:
        raise UserError(
            f"weights do not match ModelArgs: missing {sorted(missing)[:3]}, unexpected {sorted(unexpected)[:3]}"
        )
    model.load_state_dict(state, strict=True, assign=True)
    if args.tie_embeddings:
        model.output.weight = model.tok_embeddings.weight
    model.init_rope(device)
    return model.to(device)


def load_model(folder: str | Path, device: str | torch.device = "cpu") -> Transformer:
    folder = Path(folder)
    weights, args_file = folder / WEIGHTS_FILE, folder / ARGS_FILE
    for needed in (weights, args_file):
        if not needed.is_file():
            raise UserError(f"{folder} is not a dlx model folder: {needed.name} is missing")
    args = ModelArgs.model_validate_json(args_file.read_text())
    try:
        state = load_file(str(weights), device=str(device))
    except (SafetensorError, OSError) as e:
        raise UserError(f"cannot read {weights}: {e}; the file is damaged, use an earlier checkpoint") from None
    return model_from_state_dict(args, state, device)
