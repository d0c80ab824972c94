"""PyTorch Distributed Checkpoint (DCP) for every sharded layout: FSDP2, tensor parallel, both, and plain modules.

Each rank writes the shards it holds of the model and optimizer state, keyed by parameter name; a load reads, for each
rank, the parts of the saved shards that its own (possibly different) layout holds. So a checkpoint written with any
tp × dp layout resumes under any other, down to one process, and its full weights can be read without a process group
(`load_whole_model`, for `dlx export-hf` and `dlx generate`).

Asynchronous saves (`save(..., background=True)`): DCP copies the state into host memory (the "staging" copy, so that
training may change the weights at once), then writes it from a background thread; the ranks coordinate the write over
a separate gloo group, so that the background collectives never interleave with the training step's.
"""

from __future__ import annotations

import contextlib
import warnings
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import torch
from torch import nn

from dlx.model.llama import Transformer

MODEL_KEY, OPTIMIZER_KEY = "model", "optim"
_background: dict[str, Any] = {}


def background_group() -> Any:
    """A gloo group for the background writes, one per process group (every rank must reach the first call together:
    making a group is a collective)."""
    import torch.distributed as dist

    if not dist.is_initialized():
        return None
    if _background.get("world") is not dist.group.WORLD:
        _background.update(world=dist.group.WORLD, group=dist.new_group(backend="gloo"))
    return _background["group"]


def training_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_state, optim_state = get_state_dict(model, optimizer)
    return {MODEL_KEY: model_state, OPTIMIZER_KEY: optim_state}


def save(model: nn.Module, optimizer: torch.optim.Optimizer, folder: Path, background: bool = False) -> Future | None:
    """Every rank writes its shards into `folder`. With `background`, returns once the state is staged in host memory;
    the future completes when this rank's part is written (on rank 0: once every rank's is, and the metadata)."""
    import torch.distributed.checkpoint as dcp

    state = training_state(model, optimizer)
    if not background:
        with _one_process():
            dcp.save(state, checkpoint_id=folder, no_dist=not _group_active())
        return None
    return dcp.async_save(state, checkpoint_id=folder, process_group=background_group(), no_dist=not _group_active())


def load(model: nn.Module, optimizer: torch.optim.Optimizer, folder: Path) -> None:
    """Reshard on load: each rank reads what its layout holds of the saved shards."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import set_state_dict

    state = training_state(model, optimizer)
    with _one_process():
        dcp.load(state, checkpoint_id=folder, no_dist=not _group_active())
    set_state_dict(model, optimizer, model_state_dict=state[MODEL_KEY], optim_state_dict=state[OPTIMIZER_KEY])


def load_model_weights(model: nn.Module, folder: Path) -> None:
    """Only the model weights of a DCP checkpoint (written by any layout) into `model` in any layout (whole, FSDP2 or
    tensor-parallel shards): each rank reads what it holds. Every rank of a process group calls it."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict

    weights = get_model_state_dict(model)
    with _one_process():
        dcp.load({MODEL_KEY: weights}, checkpoint_id=folder, no_dist=not _group_active())
    set_model_state_dict(model, weights)


def stored_shapes(folder: Path) -> dict[str, tuple[int, ...]]:
    """The model tensors a DCP checkpoint holds and their full shapes, from its metadata (no tensor data read)."""
    from torch.distributed.checkpoint import FileSystemReader

    prefix = f"{MODEL_KEY}."
    entries = FileSystemReader(str(folder)).read_metadata().state_dict_metadata
    return {
        name.removeprefix(prefix): tuple(entry.size)
        for name, entry in entries.items()
        if name.startswith(prefix) and hasattr(entry, "size")
    }


def load_whole_model(model: Transformer, folder: Path) -> None:
    """Read a DCP checkpoint's model weights (not the optimizer state) into a whole, unsharded model, in one process
    and without a process group: DCP reads every rank's shards into place."""
    import torch.distributed.checkpoint as dcp

    weights = model.state_dict()
    if model.args.tie_embeddings:
        weights.pop("output.weight")  # the same tensor as the embedding
    with _one_process():
        dcp.load({MODEL_KEY: weights}, checkpoint_id=folder, no_dist=True)


def _group_active() -> bool:
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()


def _one_process() -> contextlib.AbstractContextManager:
    """DCP warns that it assumes one process when there is no group: that is the intent here."""
    stack = contextlib.ExitStack()
    stack.enter_context(warnings.catch_warnings())
    warnings.filterwarnings("ignore", message="torch.distributed is disabled")
    return stack
