"""PyTorch Distributed Checkpoint (DCP) for every sharded layout: FSDP2, tensor parallel, both, and plain modules.

Each rank writes the shards it holds of the model and optimizer state, keyed by parameter name; a load reads, for each
rank, the parts of the saved shards that its own (possibly different) layout holds. So a checkpoint written with any
tp × dp layout resumes under any other, down to one process, and its full weights can be read without a process group
(`load_whole_model`, for `dlx export-hf` and `dlx generate`).

Asynchronous saves (`save(..., background=True)`): DCP copies the state into host memory (the "staging" copy, so that
training may change the weights at once), then writes it from a background thread; the ranks coordinate the write over
a separate gloo group, so that the background collectives never interleave with the training step's.

Reading is data-only: DCP's `.metadata` is a pickle, read here by `read_metadata` through an unpickler that admits only
the checkpoint-metadata classes (DCP's own dataclasses, torch.Size, dtypes, layouts, paths); anything else is refused
with a `UserError` before it is built. The non-tensor entries of the state (the optimizer's hyper-parameters) are read
with torch.load(weights_only=True), not DCP's default weights_only=False (`_WeightsOnlyPlanner`).
"""

from __future__ import annotations

import contextlib
import io
import os
import pickle
import re
import sys
import warnings
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import torch
from torch import nn

from dlx.errors import UserError
from dlx.model.llama import Transformer

MODEL_KEY, OPTIMIZER_KEY = "model", "optim"
METADATA_FILE = ".metadata"
_background: dict[str, Any] = {}
_METADATA_CLASSES = {
    "torch.distributed.checkpoint.metadata": {
        "Metadata",
        "MetadataIndex",
        "StorageMeta",
        "TensorStorageMetadata",
        "TensorProperties",
        "ChunkStorageMetadata",
        "BytesStorageMetadata",
        "_MEM_FORMAT_ENCODING",
    },
    "torch.distributed.checkpoint.filesystem": {"_StorageInfo", "_StoragePrefix", "SerializationFormat"},
    "torch": {"Size"},
    "torch.serialization": {"_get_layout"},  # a lookup of torch's layouts by name
    "pathlib": {"Path", "PosixPath", "WindowsPath", "PurePosixPath", "PureWindowsPath"},
    "collections": {"OrderedDict"},
}
"""What a DCP `.metadata` pickle may name, by module; torch's dtypes (torch.float32, ...) besides."""


class _MetadataUnpickler(pickle.Unpickler):
    """Builds only `_METADATA_CLASSES` and torch dtypes; any other global is refused before it is looked up."""

    def find_class(self, module: str, name: str) -> Any:
        if name in _METADATA_CLASSES.get(module, ()):
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise pickle.UnpicklingError(f"it names {module}.{name}, which is not checkpoint metadata")


def read_metadata(folder: Path, rank: int | None = None) -> Any:
    """A DCP checkpoint's Metadata, unpickled with only the checkpoint-metadata classes admitted; UserError naming
    the file when it is missing, unreadable or names anything else (a planted pickle runs nothing)."""
    from torch.distributed.checkpoint.metadata import Metadata

    path = Path(folder) / (METADATA_FILE if rank is None else f"__{rank}{METADATA_FILE}")
    try:
        metadata = _MetadataUnpickler(io.BytesIO(path.read_bytes())).load()
    except OSError as e:
        raise UserError(f"{path} cannot be read ({e.strerror or e}); give another checkpoint") from None
    except Exception as e:  # UnpicklingError, EOFError, or a constructor refusing its arguments
        raise UserError(
            f"{path} refused: {e}; a DCP checkpoint's metadata is data only (give another checkpoint)"
        ) from None
    if not isinstance(metadata, Metadata):
        raise UserError(f"{path} refused: it holds a {type(metadata).__name__}, not DCP metadata")
    return metadata


def _reader(folder: Path) -> Any:
    """DCP's file-system reader with `read_metadata` above; the metadata is checked here, before DCP starts."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import StorageMeta

    class SafeReader(FileSystemReader):
        def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
            metadata = read_metadata(Path(self.path), kwargs.get("rank"))
            if getattr(metadata, "storage_meta", None) is None:
                metadata.storage_meta = StorageMeta()
            metadata.storage_meta.load_id = self.load_id
            return metadata

    read_metadata(folder)
    return SafeReader(str(folder))


def weights_only_refusal(error: Exception) -> str:
    """What torch.load(weights_only=True) refused, in a few words ("it names builtins.exec"), from its long message."""
    found = re.search(r"GLOBAL (\S+)", str(error))
    return f"it names {found.group(1)}, which is not plain data" if found else str(error).strip()[:160]


class _Refused(ValueError):
    """A non-tensor entry that holds more than plain data."""


def _load(state: dict[str, Any], folder: Path, no_dist: bool) -> None:
    """dcp.load through the checked reader and planner. DCP wraps every rank's failure into a CheckpointException (a
    BaseException): a refused entry becomes a UserError, any other failure a RuntimeError naming the first."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    reader = _reader(folder)
    try:
        with _one_process():
            dcp.load(state, storage_reader=reader, planner=_planner(), no_dist=no_dist)
    except CheckpointException as e:
        failures = [failure[0] if isinstance(failure, tuple) else failure for failure in e.failures.values()]
        refused = [f for f in failures if isinstance(f, _Refused)]
        if refused:
            raise UserError(f"{folder}: {refused[0]}; a checkpoint is data only (give another checkpoint)") from None
        first = failures[0] if failures else e
        raise RuntimeError(f"{type(first).__name__}: {str(first).strip().splitlines()[0][:200]}") from None


def _planner() -> Any:
    """DCP's default load planner, with non-tensor entries read by torch.load(weights_only=True)."""
    from torch.distributed.checkpoint import DefaultLoadPlanner
    from torch.distributed.checkpoint._traverse import set_element
    from torch.distributed.checkpoint.planner import ReadItem

    class WeightsOnlyPlanner(DefaultLoadPlanner):
        def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
            try:
                loaded = torch.load(value, weights_only=True)
            except Exception as e:  # weights_only's UnpicklingError names the refused global
                reason = weights_only_refusal(e)
                raise _Refused(f"{read_item.dest_index.fqn} refused by torch.load(weights_only=True): {reason}") from e
            fqn = read_item.dest_index.fqn
            if self.flatten_state_dict:
                set_element(self.original_state_dict, self.mappings[fqn], loaded)
            else:
                self.state_dict[fqn] = loaded

    return WeightsOnlyPlanner()


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
    the future completes when this rank's part is written (on rank 0: once every rank's part is, and the metadata)."""
    import torch.distributed.checkpoint as dcp

    from dlx.parallel.direct_write import direct_writer

    state = training_state(model, optimizer)
    writer = direct_writer(folder)  # around the page cache: the write's CPU is not the training's
    if not background:
        with _one_process():
            try:
                dcp.save(state, storage_writer=writer, no_dist=not _group_active())
            except BaseException as e:
                raise rank_failure(e) from None
        return None
    written = _write_in_background(state, writer)
    settled: Future = Future()

    def settle(done: Future) -> None:
        try:
            settled.set_result(done.result())
        except BaseException as e:
            settled.set_exception(rank_failure(e))

    written.add_done_callback(settle)
    return settled


def _write_in_background(state: dict[str, Any], writer: Any) -> Future:
    """DCP's async save. In a process group: the state copied into shared memory kept between saves, then written by
    DCP's checkpoint process (one per training process, started before step 1 or by the first save), at the lowest CPU
    priority, with a GIL of its own (`dlx.parallel.background_writer`). Without a group, or where /dev/shm cannot
    hold the staged state: DCP's background thread (its CPU and GIL shared with the steps), the staged copy freed
    after each save."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
    from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType

    from dlx.parallel import background_writer

    if not _group_active() or not _staging_fits(state):
        stager = DefaultStager(StagingOptions(False, False, False, False))  # DCP's own default: a blocking copy
        group = background_group()
        written = dcp.async_save(
            state, storage_writer=writer, async_stager=stager, process_group=group, no_dist=group is None
        )
        written.add_done_callback(lambda _: stager.close())
        return written
    if "stager" not in _background:
        _background["stager"] = DefaultStager(StagingOptions(False, True, False, False))
    if (started := _background.pop("start_save", None)) is not None:
        started.result()  # one request at a time on the writer's pipe: the start's empty save is done first
    writer.settle_in = background_writer.low_in_writer_process()  # lowers the checkpoint process on arrival

    group = background_group()  # made here: its threads keep the training's priority

    def start() -> Future:
        return dcp.async_save(
            state,
            storage_writer=writer,
            async_stager=_background["stager"],
            process_group=group,
            async_checkpointer_type=AsyncCheckpointerType.PROCESS,
        )

    if _background.get("process_for") is dist.group.WORLD:
        return start()
    _background["process_for"] = dist.group.WORLD
    return background_writer.starting_writer_process(start)


def start_writer_process() -> None:
    """Start checkpoint.async's writer process now, before the first step, with an empty save into a temporary folder
    (removed once written): it starts Python and torch at the lowest priority while the run starts up, so the first
    save finds it running. Every rank calls it; nothing happens without a process group."""
    if not _group_active() or "process_for" in _background:
        return
    import shutil
    import tempfile

    from dlx.parallel.direct_write import direct_writer

    folder = Path(tempfile.mkdtemp(prefix="dlx-writer-start-"))
    started = _write_in_background({}, direct_writer(folder))
    started.add_done_callback(lambda _: shutil.rmtree(folder, ignore_errors=True))
    _background["start_save"] = started


def _staging_fits(state: dict[str, Any]) -> bool:
    """Whether /dev/shm has room for the staged state twice over (a full tmpfs ends a process with SIGBUS); says once
    why not. Decided on the first state with tensors (the writer's start stages none) and kept."""
    from torch.distributed.tensor import DTensor
    from torch.utils._pytree import tree_leaves

    if _background.get("staging_fits"):
        return True
    tensors = [value for value in tree_leaves(state) if isinstance(value, torch.Tensor)]
    locals_ = [value.to_local() if isinstance(value, DTensor) else value for value in tensors]
    staged = sum(local.numel() * local.element_size() for local in locals_)
    if staged == 0:
        return True
    try:
        stats = os.statvfs("/dev/shm")
        free = stats.f_bavail * stats.f_frsize
    except OSError:
        free = 0
    if free >= 2 * staged:
        _background["staging_fits"] = True
        return True
    if not _background.get("said_shm"):
        _background["said_shm"] = True
        print(
            f"checkpoint.async: /dev/shm has {free / 1e9:.2f} GB free for {staged / 1e9:.2f} GB of staged state; the "
            "write runs in a thread of this process (slower steps after a save); give the container a larger "
            "--shm-size for a separate writer process",
            file=sys.stderr,
            flush=True,
        )
    return False


def end_background() -> None:
    """Free the staged copy and end the checkpoint process (its group goes with the training's); once every save
    has been waited for."""
    started = _background.pop("start_save", None)
    if started is not None:
        started.exception()  # written or failed: the writer's pipe is free
    stager = _background.pop("stager", None)
    if stager is not None:
        stager.close()
    if _background.pop("process_for", None) is not None:
        from dlx.parallel.background_writer import end_writer_process

        end_writer_process()


def rank_failure(error: BaseException) -> BaseException:
    """What failed on a rank when DCP reports a write's failure as a CheckpointException (a BaseException carrying
    each rank's exception and traceback): the first OSError among them (a full disk, a size limit), else the first
    exception; `error` itself when it is not one of those."""
    failures = getattr(error, "failures", None)
    if not isinstance(failures, dict) or not failures:
        return error
    causes = [failure[0] if isinstance(failure, tuple) else failure for failure in failures.values()]
    return next((cause for cause in causes if isinstance(cause, OSError)), causes[0])


def load(model: nn.Module, optimizer: torch.optim.Optimizer, folder: Path) -> None:
    """Reshard on load: each rank reads what its layout holds of the saved shards."""
    from torch.distributed.checkpoint.state_dict import set_state_dict

    state = training_state(model, optimizer)
    _load(state, folder, no_dist=not _group_active())
    set_state_dict(model, optimizer, model_state_dict=state[MODEL_KEY], optim_state_dict=state[OPTIMIZER_KEY])


def load_model_weights(model: nn.Module, folder: Path) -> None:
    """Only the model weights of a DCP checkpoint (written by any layout) into `model` in any layout (whole, FSDP2 or
    tensor-parallel shards): each rank reads what it holds. Every rank of a process group calls it."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict

    weights = get_model_state_dict(model)
    _load({MODEL_KEY: weights}, folder, no_dist=not _group_active())
    set_model_state_dict(model, weights)


def stored_shapes(folder: Path) -> dict[str, tuple[int, ...]]:
    """The model tensors a DCP checkpoint holds and their full shapes, from its metadata (no tensor data read)."""
    prefix = f"{MODEL_KEY}."
    entries = read_metadata(folder).state_dict_metadata
    return {
        name.removeprefix(prefix): tuple(entry.size)
        for name, entry in entries.items()
        if name.startswith(prefix) and hasattr(entry, "size")
    }


def load_whole_model(model: Transformer, folder: Path) -> None:
    """Read a DCP checkpoint's model weights (not the optimizer state) into a whole, unsharded model, in one process
    and without a process group: DCP reads every rank's shards into place."""

    weights = model.state_dict()
    if model.args.tie_embeddings:
        weights.pop("output.weight")  # the same tensor as the embedding
    _load({MODEL_KEY: weights}, folder, no_dist=True)


def _group_active() -> bool:
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()


def _one_process() -> contextlib.AbstractContextManager:
    """DCP warns that it assumes one process when there is no group: that is the intent here."""
    stack = contextlib.ExitStack()
    stack.enter_context(warnings.catch_warnings())
    warnings.filterwarnings("ignore", message="torch.distributed is disabled")
    return stack
