"""dlx's own weight folder (`model.safetensors` + `model_args.json`, which checkpoints and `dlx import-hf` write), and
reading safetensors into a model without holding a second copy.

Loading builds the model on the meta device, gives it uninitialised storage (`empty_model`), then fills each tensor
from its file (`load_weights`), `READ_THREADS` tensors at a time: with plain reads straight into the parameter when the
dtypes agree; else converted as it is copied from safetensors' memory map, at most `CHUNK_BYTES` at a time, the file
reopened per chunk (the mapped pages count in the process's resident memory while the file is open). So the peak is
the model's weights plus a few chunks. safetensors checks every file's header and size first. A parameter that is a
DTensor (sharded across ranks) receives only its own region of the stored tensor.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import torch
from pydantic import ValidationError
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from dlx.atomic import atomic_dir, process_umask
from dlx.errors import UserError
from dlx.model.args import ModelArgs
from dlx.model.llama import Transformer

WEIGHTS_FILE = "model.safetensors"
ARGS_FILE = "model_args.json"
CHUNK_BYTES = 64 << 20
"""Largest slice of a stored tensor read at once."""
READ_THREADS = min(4, os.cpu_count() or 1)
"""Tensors filled at once (transformers' own loader uses as many); the peak is the weights plus this many chunks."""
FLOAT_DTYPES = {"F64": torch.float64, "F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}
"""The stored dtypes dlx reads (converted to the model's dtype)."""


@dataclass(frozen=True)
class StoredTensor:
    """One tensor of a safetensors file, as its header describes it (no data read)."""

    file: Path
    key: str
    """Its name inside the file."""
    shape: tuple[int, ...]
    dtype: str
    """safetensors' dtype name: F32, BF16, F16, ..."""
    start: int
    """Byte offset of its data in the file."""


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
    save_weights_file(state, folder / WEIGHTS_FILE)
    (folder / ARGS_FILE).write_text(args.model_dump_json(indent=2) + "\n")


def save_weights_file(state: dict[str, torch.Tensor], path: Path) -> None:
    """A safetensors file with the permissions `open()` gives under the umask (the library writes 0600)."""
    save_file(state, str(path), metadata={"format": "pt"})
    os.chmod(path, 0o666 & ~process_umask())


def save_model(model: Transformer, out_dir: str | Path, overwrite: bool = False) -> Path:
    out_dir = Path(out_dir)
    if out_dir.exists() and not overwrite:
        raise UserError(f"{out_dir} already exists; choose another output folder or remove it")
    with atomic_dir(out_dir, overwrite=overwrite) as tmp:
        write_weights(model, tmp)
    return out_dir


def read_headers(
    files: list[Path], rename: Callable[[str], str | None] = str, fix: str = "copy it again"
) -> dict[str, StoredTensor]:
    """Every tensor of the files by its dlx name (`rename` maps a stored name to it; None skips the tensor).
    A truncated or damaged file is one line naming it and `fix`."""
    found: dict[str, StoredTensor] = {}
    for file in files:
        try:
            with safe_open(str(file), framework="pt") as f:  # checks the header and that the data covers the file
                starts = _data_starts(file)
                for key in f.keys():  # noqa: SIM118 (a safe_open handle is not iterable)
                    name = rename(key)
                    if name is not None:
                        stored = f.get_slice(key)
                        shape, dtype = tuple(stored.get_shape()), stored.get_dtype()
                        found[name] = StoredTensor(file, key, shape, dtype, starts[key])
        except (SafetensorError, OSError) as e:
            raise UserError(f"cannot read {file}: {_reason(e)}; the file is truncated or damaged, {fix}") from None
    return found


def _data_starts(file: Path) -> dict[str, int]:
    """Where each tensor's bytes start: the safetensors layout is an 8-byte little-endian header length, the JSON
    header (each tensor's `data_offsets` relative to the end of the header), then the data."""
    with open(file, "rb") as f:
        (size,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(size))
    return {key: 8 + size + info["data_offsets"][0] for key, info in header.items() if key != "__metadata__"}


def _reason(error: Exception) -> str:
    if isinstance(error, OSError) and error.strerror:
        return error.strerror
    return str(error).splitlines()[0][:160]


def empty_model(args: ModelArgs, device: str | torch.device, dtype: torch.dtype | None = None) -> Transformer:
    """The model with uninitialised weights on `device` (no random init, no second copy), in `dtype` (default: torch's
    default, float32), RoPE tables built."""
    with torch.device("meta"):
        model = Transformer(args)
    if dtype is not None:
        model.to(dtype)
    model.to_empty(device=device)
    if args.tie_embeddings:  # to_empty gives each module its own new tensor
        model.output.weight = model.tok_embeddings.weight
    model.init_rope(device)
    return model


def load_weights(model: Transformer, stored: dict[str, StoredTensor], source: str, skip: tuple[str, ...] = ()) -> None:
    """Copy every stored tensor into the model's parameters, converting the dtype; the names and shapes must be
    exactly the model's (a tied output projection is the embedding). `source` names the folder in errors; the
    parameters named in `skip` are left to the caller (a grown vocabulary's)."""
    targets = {name: t for name, t in _unique_parameters(model).items() if name not in skip}
    stored = {name: t for name, t in stored.items() if name not in skip}
    missing, unexpected = sorted(set(targets) - set(stored)), sorted(set(stored) - set(targets))
    if missing or unexpected:
        raise UserError(
            f"{source}: the weights do not fit the model's shape: missing {missing[:3]}, unexpected {unexpected[:3]}"
        )
    for name, target in targets.items():
        tensor = stored[name]
        if tensor.shape != tuple(target.shape):
            raise UserError(
                f"{source}: {tensor.key} in {tensor.file.name} has shape {list(tensor.shape)}, the model's "
                f"{name} has {list(target.shape)}; the folder's config does not describe its weights"
            )
        if tensor.dtype not in FLOAT_DTYPES:
            raise UserError(
                f"{source}: {tensor.key} is stored as {tensor.dtype}; dlx reads unquantised weights "
                f"({', '.join(FLOAT_DTYPES)})"
            )
    # A few tensors at a time, as transformers loads: reads, conversions and page faults release the GIL and overlap.
    with ThreadPoolExecutor(READ_THREADS) as pool:
        list(pool.map(lambda name: copy_stored(targets[name], stored[name]), targets))


def _unique_parameters(model: Transformer) -> dict[str, torch.Tensor]:
    """Parameters and persistent buffers by state-dict name, a tied output projection once (as the embedding)."""
    state = model.state_dict(keep_vars=True)
    if model.args.tie_embeddings:
        state.pop("output.weight", None)
    return state


@torch.no_grad()
def copy_stored(target: torch.Tensor, stored: StoredTensor) -> None:
    """Fill `target` (a tensor, or a DTensor's local shard) from the file, at most CHUNK_BYTES at a time."""
    local, offset = _local_region(target)
    if local.numel() == 0:
        return
    dtype = FLOAT_DTYPES[stored.dtype]
    whole_rows = tuple(local.shape[1:]) == stored.shape[1:]
    if whole_rows and local.dtype == dtype and local.device.type == "cpu" and local.is_contiguous():
        _read_into(local, offset[0], stored)
    else:
        _copy_mapped(local, offset, stored)


def _read_into(local: torch.Tensor, first_row: int, stored: StoredTensor) -> None:
    """Plain reads straight into the tensor's memory (the region is whole rows, the dtypes agree)."""
    row_bytes = local[0].numel() * local.element_size()
    step = max(1, CHUNK_BYTES // row_bytes)
    with open(stored.file, "rb", buffering=0) as f:
        f.seek(stored.start + first_row * row_bytes)
        for start in range(0, local.shape[0], step):
            view = memoryview(local[start : start + step].reshape(-1).view(torch.uint8).numpy())
            while view.nbytes:
                count = f.readinto(view)
                if not count:
                    raise UserError(f"{stored.file} ended inside {stored.key}; the file is truncated, copy it again")
                view = view[count:]


def _copy_mapped(local: torch.Tensor, offset: tuple[int, ...], stored: StoredTensor) -> None:
    """Any region, converted as it is copied, from safetensors' memory-mapped slices; the file is reopened per chunk
    so that the mapped pages leave the process with each chunk."""
    row_bytes = max(1, local[0].numel() * _itemsize(stored.dtype))
    step = max(1, CHUNK_BYTES // row_bytes)
    inner = tuple(slice(o, o + n) for o, n in zip(offset[1:], local.shape[1:], strict=True))
    for start in range(0, local.shape[0], step):
        stop = min(local.shape[0], start + step)
        with safe_open(str(stored.file), framework="pt") as f:
            local[start:stop].copy_(f.get_slice(stored.key)[(slice(offset[0] + start, offset[0] + stop), *inner)])


def _local_region(target: torch.Tensor) -> tuple[torch.Tensor, tuple[int, ...]]:
    """The tensor this rank holds and where it starts in the full tensor: all of it, or a DTensor's shard."""
    from torch.distributed.tensor import DTensor

    if not isinstance(target, DTensor):
        return target, (0,) * target.ndim
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset  # what DCP uses for the same

    _, offset = compute_local_shape_and_global_offset(target.shape, target.device_mesh, target.placements)
    return target.to_local(), tuple(offset)


def _itemsize(dtype: str) -> int:
    return FLOAT_DTYPES[dtype].itemsize if dtype in FLOAT_DTYPES else 8


def stored_dtype(stored: dict[str, StoredTensor]) -> torch.dtype:
    """The dtype the weights were saved in (the embedding's), to load a model as it was saved."""
    return FLOAT_DTYPES.get(stored["tok_embeddings.weight"].dtype, torch.float32) if stored else torch.float32


def read_model_folder(folder: str | Path) -> tuple[ModelArgs, dict[str, StoredTensor]]:
    """The shape and the stored tensors of a dlx model folder or checkpoint."""
    folder = Path(folder)
    return read_model_args(folder), read_headers([folder / WEIGHTS_FILE], fix="use an earlier checkpoint")


def read_model_args(folder: Path) -> ModelArgs:
    weights, args_file = folder / WEIGHTS_FILE, folder / ARGS_FILE
    for needed in (weights, args_file):
        if not needed.is_file():
            raise UserError(f"{folder} is not a dlx model folder: {needed.name} is missing")
    try:
        return ModelArgs.model_validate_json(args_file.read_text())
    except (OSError, ValidationError) as e:
        raise UserError(f"{args_file} is damaged ({_reason(e)}); use another checkpoint") from None


def load_model(folder: str | Path, device: str | torch.device = "cpu") -> Transformer:
    """A dlx model folder or checkpoint, in the dtype it was saved in."""
    args, stored = read_model_folder(folder)
    model = empty_model(args, device, stored_dtype(stored))
    load_weights(model, stored, str(folder))
    return model
