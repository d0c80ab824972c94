"""Checkpoints: everything a run needs to continue exactly where it stopped, written atomically.

    RUN_DIR/checkpoints/step-00000100/
        model.safetensors     weights (safetensors: loading runs no code)
        model_args.json       the model shape; with the weights, a model folder `dlx export-hf` and `load_model` read
        train_state.pt        optimizer, scheduler, fp16 loss scaler and RNG states: tensors and plain data only,
                              read back with torch.load(weights_only=True), which refuses pickled code
        trainer_state.json    step, tokens seen, loader position, and the size of every file above; written last

The folder is filled under a temporary name and renamed into place (`atomic_dir`), so a crash mid-save leaves the
previous checkpoints untouched and at most a `.step-*.tmp` folder, which the next save or resume removes. A folder
whose files are missing, shorter or longer than recorded, or unreadable is damaged; `find_resumable` then falls back to
the one before it and says so.
"""

from __future__ import annotations

import json
import random
import re
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from dlx.atomic import atomic_dir
from dlx.errors import UserError
from dlx.faults import pause_point
from dlx.model.io import ARGS_FILE, WEIGHTS_FILE, write_weights
from dlx.model.llama import Transformer

CHECKPOINTS_DIR = "checkpoints"
TRAIN_STATE_FILE = "train_state.pt"
STATE_FILE = "trainer_state.json"
_NAME = re.compile(r"^step-(\d{8,})$")


@dataclass
class TrainerState:
    """The run's position: what the next step needs besides weights and optimizer state."""

    step: int = 0
    """Optimizer steps completed."""
    tokens_seen: int = 0
    """Training tokens consumed, all ranks together."""
    nan_skipped: int = 0
    """Steps whose update was skipped for a non-finite loss (train.nan_policy: skip)."""
    loader: dict[str, Any] | None = None
    """The training loader's state_dict: where the next batch comes from."""
    files: dict[str, int] = field(default_factory=dict)
    """Byte size of every other file of the checkpoint, to detect truncation."""


class DamagedCheckpoint(Exception):
    pass


def checkpoint_dir(run_dir: Path, step: int) -> Path:
    return run_dir / CHECKPOINTS_DIR / f"step-{step:08d}"


def list_checkpoints(run_dir: Path) -> list[Path]:
    """Checkpoint folders, newest (highest step) first; temporary folders of unfinished saves are not listed."""
    folder = run_dir / CHECKPOINTS_DIR
    if not folder.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in folder.iterdir() if p.is_dir() and (m := _NAME.match(p.name))]
    return [p for _, p in sorted(found, reverse=True)]


def remove_unfinished_saves(run_dir: Path) -> None:
    """Temporary folders left by a save that was killed; they were never checkpoints."""
    folder = run_dir / CHECKPOINTS_DIR
    if folder.is_dir():
        for path in folder.glob(".step-*"):
            shutil.rmtree(path, ignore_errors=True)


def rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        "numpy": _numpy_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _numpy_rng_state() -> dict[str, Any]:
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    # As a tensor and plain numbers: weights_only loading refuses numpy arrays.
    return {"kind": kind, "keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
            "has_gauss": int(has_gauss), "cached": float(cached)}  # fmt: skip


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(_as_tuples(state["python"]))
    n = state["numpy"]
    np.random.set_state((n["kind"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["cached"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _as_tuples(value: Any) -> Any:
    return tuple(_as_tuples(v) for v in value) if isinstance(value, (list, tuple)) else value


def save_checkpoint(
    run_dir: Path,
    model: Transformer,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    scaler: torch.amp.GradScaler | None,
    state: TrainerState,
    keep_last: int,
) -> Path:
    """Write `checkpoints/step-N/` atomically, then delete all but the newest `keep_last` checkpoints."""
    remove_unfinished_saves(run_dir)
    path = checkpoint_dir(run_dir, state.step)
    try:
        _write(path, model, optimizer, scheduler, scaler, state)
    except (OSError, SafetensorError, RuntimeError) as e:  # a full disk or quota (torch.save says RuntimeError)
        # atomic_dir removed the temporary folder; the older checkpoints were never touched.
        reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e).splitlines()[0][:160]
        previous = next(iter(list_checkpoints(run_dir)), None)
        raise UserError(
            f"cannot save checkpoint {path.name}: {reason}; the previous checkpoint "
            f"({previous or 'none'}) is intact. Free space in {run_dir} and resume with --resume"
        ) from None
    prune_checkpoints(run_dir, keep_last)
    return path


def _write(
    path: Path,
    model: Transformer,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    scaler: torch.amp.GradScaler | None,
    state: TrainerState,
) -> None:
    with atomic_dir(path, overwrite=True) as tmp:
        write_weights(model, tmp)
        save_torch(
            {
                "optimizer": optimizer.state_dict(),
                "scheduler": _scheduler_state(scheduler),
                "scaler": scaler.state_dict() if scaler is not None else None,
                "rng": rng_state(),
            },
            tmp / TRAIN_STATE_FILE,
        )
        pause_point("checkpoint_save")  # test-only, off by default: see dlx.faults
        state.files = {name: (tmp / name).stat().st_size for name in (WEIGHTS_FILE, ARGS_FILE, TRAIN_STATE_FILE)}
        (tmp / STATE_FILE).write_text(json.dumps(asdict(state), indent=2) + "\n")


class _KeepWriteError:
    """A file for torch.save that keeps the OSError of a failed write: torch.save itself reports a full disk as
    `enforce fail ... unexpected pos`, which names no cause."""

    def __init__(self, file: Any) -> None:
        self.file, self.error = file, None

    def write(self, data: Any) -> int:
        try:
            return self.file.write(data)
        except OSError as e:
            self.error = self.error or e
            raise

    def flush(self) -> None:
        self.file.flush()


def save_torch(obj: Any, path: Path) -> None:
    """torch.save to `path`; a failed write raises its OSError (ENOSPC, EDQUOT, EFBIG), not torch's RuntimeError."""
    with open(path, "wb") as f:
        keep = _KeepWriteError(f)
        try:
            torch.save(obj, keep)
        except RuntimeError:
            if keep.error is not None:
                raise keep.error from None
            raise


def _scheduler_state(scheduler: torch.optim.lr_scheduler.LRScheduler) -> dict[str, Any]:
    """The schedule's position only: its shape is rebuilt from the recipe (so a resumed run may change max_steps)."""
    state = scheduler.state_dict()
    if "lr_lambdas" in state:
        state["lr_lambdas"] = [None] * len(state["lr_lambdas"])
    return state


def prune_checkpoints(run_dir: Path, keep_last: int) -> None:
    for old in list_checkpoints(run_dir)[keep_last:]:
        shutil.rmtree(old, ignore_errors=True)


@dataclass
class LoadedCheckpoint:
    path: Path
    state: TrainerState
    weights: dict[str, torch.Tensor]
    train_state: dict[str, Any]


def read_checkpoint(path: Path) -> LoadedCheckpoint:
    """Read and check every file of a checkpoint into memory; DamagedCheckpoint says what is wrong."""
    try:
        raw = json.loads((path / STATE_FILE).read_text())
        state = TrainerState(**raw)
    except (OSError, ValueError, TypeError) as e:
        raise DamagedCheckpoint(f"{STATE_FILE} unreadable ({type(e).__name__})") from None
    for name, size in state.files.items():
        file = path / name
        if not file.is_file():
            raise DamagedCheckpoint(f"{name} is missing")
        if file.stat().st_size != size:
            raise DamagedCheckpoint(f"{name} has {file.stat().st_size:,} bytes, {size:,} were written")
    try:
        weights = load_file(str(path / WEIGHTS_FILE))
        train_state = torch.load(path / TRAIN_STATE_FILE, map_location="cpu", weights_only=True)
    except (SafetensorError, OSError, RuntimeError, EOFError) as e:
        raise DamagedCheckpoint(f"unreadable ({str(e).splitlines()[0][:120]})") from None
    except Exception as e:  # weights_only's UnpicklingError: the file holds more than tensors and plain data
        raise DamagedCheckpoint(
            f"{TRAIN_STATE_FILE} refused by torch.load(weights_only=True): {type(e).__name__}"
        ) from None
    return LoadedCheckpoint(path, state, weights, train_state)


def find_resumable(run_dir: Path, say=print, set_aside: bool = False) -> LoadedCheckpoint | None:
    """The newest checkpoint that reads back completely; each damaged newer one is reported and skipped, and with
    `set_aside` renamed to `step-N.damaged` (kept for inspection, never again taken for a checkpoint or pruned)."""
    remove_unfinished_saves(run_dir)
    for path in list_checkpoints(run_dir):
        try:
            return read_checkpoint(path)
        except DamagedCheckpoint as e:
            aside = path.with_name(path.name + ".damaged")
            note = f"; moved to {aside.name}" if set_aside else ""
            say(f"checkpoint {path} is damaged: {e}; falling back to the previous one{note}")
            if set_aside:
                shutil.rmtree(aside, ignore_errors=True)
                path.rename(aside)
    return None


def apply_checkpoint(
    loaded: LoadedCheckpoint,
    model: Transformer,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    scaler: torch.amp.GradScaler | None,
) -> TrainerState:
    """Put a checkpoint read by `read_checkpoint` into the live objects and restore the random generators."""
    weights = dict(loaded.weights)
    if model.args.tie_embeddings:
        weights["output.weight"] = weights["tok_embeddings.weight"]
    try:
        model.load_state_dict(weights, strict=True)
        optimizer.load_state_dict(loaded.train_state["optimizer"])
    except (RuntimeError, ValueError, KeyError) as e:
        raise UserError(
            f"checkpoint {loaded.path} does not fit this recipe's model or optimizer ({str(e).splitlines()[0][:160]}); "
            "resume with the recipe the run was started with"
        ) from None
    scheduler.load_state_dict(loaded.train_state["scheduler"])
    if scaler is not None and loaded.train_state.get("scaler"):
        scaler.load_state_dict(loaded.train_state["scaler"])
    set_rng_state(loaded.train_state["rng"])
    return loaded.state
