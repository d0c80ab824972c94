"""Checkpoints: everything a run needs to continue exactly where it stopped, written atomically.

    RUN_DIR/checkpoints/step-00000100/
        model.safetensors     the whole model's weights (safetensors: loading runs no code); always in the "full"
                              format, in sharded ones as checkpoint.full_weights says (every, last, never)
        model_args.json       the model shape; with the weights, a model folder `dlx export-hf` and `load_model` read
        train_state.pt        scheduler, fp16 loss scaler, every rank's RNG states and (one process, DDP) the optimizer
                              state: tensors and plain data only, read back with torch.load(weights_only=True)
        dcp/                  FSDP, any tp > 1: model and optimizer shards, PyTorch Distributed Checkpoint (reshards
                              on load; `dlx export-hf` reads the whole weights from it)
        deepspeed/            DeepSpeed: the engine's own ZeRO checkpoint
        trainer_state.json    step, tokens seen, loader position, format, world size, and the size of every file
                              above, with the SHA-256 of those dlx writes itself (checkpoint_record); written last

The folder is filled under a temporary name by every rank and renamed into place by rank 0 once all have written, so
a crash mid-save leaves the previous checkpoints untouched and at most a `.step-*.tmp` folder, which the next save or
resume removes. With checkpoint.async the DCP shards are written in the background (`PendingSave`): the step goes on
after the state is copied to host memory, and the folder is published only once every rank's part and DCP's metadata
are written; the next save and the end of the run wait for it. A folder whose files are missing, shorter or longer
than recorded, whose SHA-256 differs from the one recorded, or unreadable, or whose trainer_state.json does not follow
its schema, is damaged; `find_resumable` then falls back to the one before it and says so. Checkpoints recorded
without SHA-256s (written before dlx recorded them) are checked by size.
"""

from __future__ import annotations

import contextlib
import json
import random
import re
import shutil
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from dlx import device as dev
from dlx.atomic import make_temp_dir, publish_dir
from dlx.errors import UserError
from dlx.faults import pause_point
from dlx.model.args import ModelArgs
from dlx.model.io import ARGS_FILE, WEIGHTS_FILE, empty_model, load_model, write_weight_dict
from dlx.model.llama import Transformer
from dlx.parallel import dcp
from dlx.parallel.distributed import any_rank, gather_to_main, main_decides
from dlx.parallel.strategy import DCP_FOLDER, DEEPSPEED_FOLDER, Strategy, check_deepspeed_files, check_format
from dlx.train.rundir.checkpoint_record import (
    STATE_FILE,
    HashingFile,
    file_problem,
    file_record,
    safetensors_sha256,
    schema_problem,
    text_sha256,
)

CHECKPOINTS_DIR = "checkpoints"
OPTIMIZER_STATE_FILE = "train_state.pt"
"""torch.save of the optimizer, scheduler, loss-scaler and random generator states."""
TRAINER_STATE_FILE = STATE_FILE
"""The `TrainerState` (step, tokens, loader position, file sizes); written last, it marks a checkpoint complete."""
DCP_METADATA = f"{DCP_FOLDER}/.metadata"
"""Marks a checkpoint whose weights are in DCP shards (written by DCP last, once every rank's shards are)."""
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
    observers: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Each observer's state under its name (`dlx.train.observers.base`: the spike guard's window, counts and skips)."""
    loader: dict[str, Any] | None = None
    """The training loader's state_dict: where the next batch comes from."""
    format: str = "full"
    """How model and optimizer state are stored: full (one process, DDP), dcp (FSDP) or deepspeed."""
    world_size: int = 1
    """Ranks that trained the run up to this checkpoint."""
    full_weights: bool = True
    """model.safetensors is part of this checkpoint (always in the full format; see checkpoint.full_weights)."""
    files: dict[str, Any] = field(default_factory=dict)
    """Every other file of the checkpoint: {"size": bytes, "sha256": hex} (the SHA-256 of the files dlx writes itself;
    shards written by DCP or DeepSpeed carry their size only). Checkpoints written before the SHA-256s: bytes only."""


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
    cuda = dev.cuda_rng_states()
    if cuda:
        state["cuda"] = cuda
    return state


def _numpy_rng_state() -> dict[str, Any]:
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    # As a tensor and plain numbers: weights_only loading refuses numpy arrays.
    return {
        "kind": kind,
        "keys": torch.from_numpy(keys.astype(np.int64)),
        "pos": int(pos),
        "has_gauss": int(has_gauss),
        "cached": float(cached),
    }


def set_rng_state(state: dict[str, Any], say=print) -> None:
    """Every generator back to the saved state; CUDA's as far as the visible GPUs allow (`say` tells what did not)."""
    torch.set_rng_state(state["torch"])
    random.setstate(_as_tuples(state["python"]))
    n = state["numpy"]
    np.random.set_state((n["kind"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["cached"]))
    note = dev.restore_cuda_rng_states(state.get("cuda", []))
    if note:
        say(f"resume: {note}")


def _as_tuples(value: Any) -> Any:
    return tuple(_as_tuples(v) for v in value) if isinstance(value, (list, tuple)) else value


def save_checkpoint(
    run_dir: Path,
    strategy: Strategy,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    scaler: torch.amp.GradScaler | None,
    state: TrainerState,
    keep_last: int,
    full_weights: bool = True,
    background: bool = False,
) -> PendingSave:
    """Start writing `checkpoints/step-N/` (every rank calls this). `full_weights`: also gather model.safetensors
    (always in the full format). `background`: the DCP shards are written while training goes on. The returned
    `PendingSave` publishes the folder (and deletes all but the newest `keep_last`) once `wait` finds it complete."""
    path = checkpoint_dir(run_dir, state.step)
    full_weights = full_weights or strategy.checkpoint_format == "full"
    state.format, state.world_size = strategy.checkpoint_format, strategy.env.world_size
    state.full_weights = full_weights
    tmp = main_decides(lambda: _start_save(run_dir, path))
    error: BaseException | None = None
    future, digests = None, {}
    try:
        future, digests = _write_parts(tmp, strategy, scheduler, scaler, full_weights, background)
    except (OSError, SafetensorError, RuntimeError) as e:  # a full disk or quota (torch.save says RuntimeError)
        error = e
    pending = PendingSave(tmp, path, replace(state), run_dir, keep_last, strategy.precision.device, future, digests)
    pending.give_up_unless_all_wrote(error)
    return pending


@dataclass
class PendingSave:
    """A checkpoint being written into its temporary folder; `path` once every rank's part is complete."""

    tmp: Path
    path: Path
    state: TrainerState
    """The run's position when the save started (training may have moved on since)."""
    run_dir: Path
    keep_last: int
    device: torch.device
    future: Future | None = None
    """This rank's background DCP write; None when everything was written before `save_checkpoint` returned."""
    digests: dict[str, str] = field(default_factory=dict)
    """SHA-256 of the files rank 0 wrote, by name, computed as they were written."""
    published: bool = False
    """Rank 0 renamed the folder into place (`poll` may do so before `wait`, on rank 0 alone)."""
    settled: bool = False
    """Every rank has been through `wait` (the same on every rank, unlike `published`)."""

    def poll(self) -> None:
        """Rank 0, between steps, without a collective: publish as soon as the background write is complete. Rank 0's
        write completes only after every rank's part and DCP's metadata are written."""
        if self.published or self.future is None or not self.future.done() or self.future.exception() is not None:
            return
        _publish(self.tmp, self.path, self.state, self.run_dir, self.keep_last, self.digests)
        self.published = True

    def wait(self) -> Path:
        """Every rank: wait for this rank's part, agree that every rank succeeded, publish (rank 0). UserError if one
        failed: the folder is removed and the previous checkpoints are intact."""
        error: BaseException | None = None
        if self.future is not None:
            try:
                self.future.result()
            except Exception as e:  # DCP re-raises a failed write (OSError, or its CheckpointException)
                error = e
        self.give_up_unless_all_wrote(error)
        if not main_decides(lambda: self.published):  # only rank 0 polls: it knows
            main_decides(lambda: _publish(self.tmp, self.path, self.state, self.run_dir, self.keep_last, self.digests))
        self.published = self.settled = True
        return self.path

    def give_up_unless_all_wrote(self, error: BaseException | None) -> None:
        if not any_rank(error is not None, self.device):
            return
        main_decides(lambda: shutil.rmtree(self.tmp, ignore_errors=True))  # the older checkpoints were never touched
        raise _save_refused(self.path, self.run_dir, error) from None

    def abandon(self) -> None:
        """On the way out after an error: let the background write finish or fail, so that no thread outlives the
        process group. The unpublished folder is removed by the next save or resume."""
        if self.future is not None:
            self.future.exception()


def _start_save(run_dir: Path, path: Path) -> Path:
    remove_unfinished_saves(run_dir)
    return make_temp_dir(path)


def _reason(error: BaseException | None) -> str:
    if error is None:
        return "another rank failed to write its part"
    if isinstance(error, OSError) and error.strerror:
        return error.strerror
    return str(error).splitlines()[0][:160]


def _write_parts(
    tmp: Path,
    strategy: Strategy,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    scaler: torch.amp.GradScaler | None,
    full_weights: bool,
    background: bool,
) -> tuple[Future | None, dict[str, str]]:
    """Every rank: its shards (DCP, DeepSpeed); rank 0: the whole weights (when asked) and train_state.pt, and the
    SHA-256 of each file it wrote."""
    weights = strategy.full_weights() if full_weights else None  # a collective when sharded
    rng_states = gather_to_main(rng_state())  # a collective: each rank's generators (its own GPU's) are its own
    future = strategy.save_sharded(tmp, background)
    if not strategy.env.is_main:
        return future, {}
    args: ModelArgs = strategy.model.args
    digests = {}
    with ThreadPoolExecutor(1, thread_name_prefix="dlx-sha256") as hashing:  # hashlib releases the GIL
        weights_sha256 = None
        if weights is not None:
            write_weight_dict(weights, args, tmp)
            weights_sha256 = hashing.submit(safetensors_sha256, tmp / WEIGHTS_FILE, weights)  # beside the next write
        else:
            (tmp / ARGS_FILE).write_text(args.model_dump_json(indent=2) + "\n")
        digests[ARGS_FILE] = text_sha256((tmp / ARGS_FILE).read_text())  # a few hundred bytes
        digests[OPTIMIZER_STATE_FILE] = save_torch(
            {
                "optimizer": strategy.optimizer_state(),
                "scheduler": _scheduler_state(scheduler),
                "scaler": scaler.state_dict() if scaler is not None else None,
                "rng": rng_states[0],
                "rng_ranks": rng_states,
            },
            tmp / OPTIMIZER_STATE_FILE,
        )
        if weights_sha256 is not None:
            digests[WEIGHTS_FILE] = weights_sha256.result()
    pause_point("checkpoint_save")  # test-only, off by default: see dlx.faults
    return future, digests


def _publish(tmp: Path, path: Path, state: TrainerState, run_dir: Path, keep_last: int, digests: dict) -> None:
    """Rank 0, once every rank has written: record every file's size and SHA-256 (where rank 0 computed it as it
    wrote), write trainer_state.json last, rename."""
    try:
        files = {str(f.relative_to(tmp)): f.stat().st_size for f in sorted(tmp.rglob("*")) if f.is_file()}
        state.files = {name: file_record(size, digests.get(name)) for name, size in files.items()}
        (tmp / TRAINER_STATE_FILE).write_text(json.dumps(asdict(state), indent=2) + "\n")
        publish_dir(tmp, path, overwrite=True)
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise _save_refused(path, run_dir, e) from None
    prune_checkpoints(run_dir, keep_last)
    PUBLISHED.set()


def _save_refused(path: Path, run_dir: Path, error: BaseException | None) -> UserError:
    previous = next(iter(list_checkpoints(run_dir)), None)
    return UserError(
        f"cannot save checkpoint {path.name}: {_reason(error)}; the previous checkpoint ({previous or 'none'}) is "
        f"intact. Free space in {run_dir} and resume with --resume"
    )


def save_torch(obj: Any, path: Path) -> str:
    """torch.save to `path`, returning the SHA-256 of what it wrote; a failed write raises its OSError (ENOSPC, EDQUOT,
    EFBIG), not torch's RuntimeError."""
    with open(path, "wb") as f:
        keep = HashingFile(f)
        try:
            torch.save(obj, keep)
        except RuntimeError:
            if keep.error is not None:
                raise keep.error from None
            raise
    return keep.sha.hexdigest()


def _scheduler_state(scheduler: torch.optim.lr_scheduler.LRScheduler) -> dict[str, Any]:
    """The schedule's position only: its shape is rebuilt from the recipe (so a resumed run may change max_steps)."""
    state = scheduler.state_dict()
    if "lr_lambdas" in state:
        state["lr_lambdas"] = [None] * len(state["lr_lambdas"])
    return state


PUBLISHED = threading.Event()
"""Set each time a checkpoint is published in this process (a bucket run's sync uploads it at once)."""
_PINNED: set[Path] = set()
_PIN_LOCK = threading.Lock()


@contextlib.contextmanager
def pinned(path: Path) -> Iterator[bool]:
    """While inside, pruning leaves the checkpoint `path` alone (an upload reads it); yields whether it still exists."""
    with _PIN_LOCK:
        _PINNED.add(path)
        exists = path.is_dir()
    try:
        yield exists
    finally:
        with _PIN_LOCK:
            _PINNED.discard(path)


ROLLED_BACK_SUFFIX = ".rolled-back"
"""A checkpoint of a branch a spike rollback abandoned: `step-N.rolled-back` (`-2`, `-3` … when rolled back again)."""


def prune_checkpoints(run_dir: Path, keep_last: int) -> None:
    """The one retention rule: the newest `keep_last` checkpoints stay, except that one an upload is reading
    (`pinned`) stays until a later save; checkpoints a rollback set aside count toward `keep_last`, the oldest going
    first."""
    with _PIN_LOCK:
        live = list_checkpoints(run_dir)
        for old in live[keep_last:]:
            if old not in _PINNED:
                shutil.rmtree(old, ignore_errors=True)
        aside = sorted(set_aside_checkpoints(run_dir), key=lambda p: p.stat().st_mtime, reverse=True)
        for path in aside[max(keep_last - min(len(live), keep_last), 0) :]:
            shutil.rmtree(path, ignore_errors=True)


def set_aside_after(run_dir: Path, step: int, keep_last: int) -> None:
    """The checkpoints after `step` belong to an abandoned branch: renamed so that no resume takes them, then the
    retention rule."""
    for path in list_checkpoints(run_dir):
        if checkpoint_step(path) > step:
            path.rename(free_name(path, ROLLED_BACK_SUFFIX))
    prune_checkpoints(run_dir, keep_last)


def checkpoint_step(path: Path) -> int:
    """The step of a checkpoint folder (`step-00000012`, also set aside: `step-00000012.rolled-back`)."""
    return int(path.name.split("-")[1].split(".")[0])


def set_aside_checkpoints(run_dir: Path) -> list[Path]:
    """The checkpoints a rollback set aside (`step-N.rolled-back`, `-2` ...)."""
    root = run_dir / CHECKPOINTS_DIR
    return [p for p in root.glob(f"step-*{ROLLED_BACK_SUFFIX}*") if p.is_dir()] if root.is_dir() else []


def free_name(path: Path, suffix: str) -> Path:
    """`path` + `suffix`, or + `suffix`-2, -3 ... when a step was rolled back before."""
    candidate, n = path.with_name(path.name + suffix), 1
    while candidate.exists():
        n += 1
        candidate = path.with_name(f"{path.name}{suffix}-{n}")
    return candidate


@dataclass
class LoadedCheckpoint:
    path: Path
    state: TrainerState
    weights: dict[str, torch.Tensor]
    train_state: dict[str, Any]


def read_trainer_state(path: Path, checksums: bool = True) -> TrainerState:
    """trainer_state.json, once it follows its schema and every file it lists is there at its recorded size and
    SHA-256 (where one was recorded; `checksums=False`: sizes only, for a checkpoint already verified);
    DamagedCheckpoint otherwise."""
    try:
        raw = json.loads((path / TRAINER_STATE_FILE).read_text())
        state = TrainerState(**with_observer_states(raw))
    except (OSError, ValueError, TypeError) as e:
        raise DamagedCheckpoint(f"{TRAINER_STATE_FILE} unreadable ({type(e).__name__})") from None
    problem = schema_problem(raw, state.step, state.tokens_seen, state.world_size, state.files, state.loader)
    named = _NAME.match(path.name.split(".")[0])
    if problem is None and named and int(named.group(1)) != state.step:
        problem = f"{TRAINER_STATE_FILE} says step {state.step}, its folder {path.name}"
    problem = problem or next(filter(None, (file_problem(path, n, r, checksums) for n, r in state.files.items())), None)
    if problem:
        raise DamagedCheckpoint(problem)
    return state


def with_observer_states(raw: dict[str, Any]) -> dict[str, Any]:
    """trainer_state.json as written before observers had their own state: its spike fields under "spikes"."""
    if "spike_window" not in raw and "spikes_skipped" not in raw:
        return raw
    raw = dict(raw)
    window, skipped = raw.pop("spike_window", []), raw.pop("spikes_skipped", 0)
    if window or skipped:
        raw.setdefault("observers", {})["spikes"] = {"window": window, "counts": {"skipped": skipped}}
    return raw


def read_model_state(path: Path, checksums: bool = True) -> TrainerState:
    """trainer_state.json (`read_trainer_state`) and the layout's own metadata checked safe to read (DCP's .metadata,
    DeepSpeed's files): what reading the weights needs, without reading them; DamagedCheckpoint otherwise."""
    state = read_trainer_state(path, checksums)
    try:
        if state.format == "dcp":
            dcp.read_metadata(path / DCP_FOLDER)  # checked before DCP's own reader could unpickle it
        if state.format == "deepspeed":
            check_deepspeed_files(path / DEEPSPEED_FOLDER)  # rank 0 decides before the ranks load together
    except UserError as e:
        raise DamagedCheckpoint(str(e).split("; ")[0]) from None
    return state


def read_checkpoint(path: Path, checksums: bool = True) -> LoadedCheckpoint:
    """Read and check every file of a checkpoint into memory; DamagedCheckpoint says what is wrong. `checksums=False`
    skips the SHA-256s (the ranks reading a checkpoint rank 0 has just verified)."""
    state = read_model_state(path, checksums)
    try:
        weights = load_file(str(path / WEIGHTS_FILE)) if state.format == "full" else {}  # else in dcp/ or deepspeed/
        train_state = torch.load(path / OPTIMIZER_STATE_FILE, map_location="cpu", weights_only=True)
    except (SafetensorError, OSError, RuntimeError, EOFError) as e:
        raise DamagedCheckpoint(f"unreadable ({str(e).splitlines()[0][:120]})") from None
    except Exception as e:  # weights_only's UnpicklingError: the file holds more than tensors and plain data
        raise DamagedCheckpoint(
            f"{OPTIMIZER_STATE_FILE} refused by torch.load(weights_only=True): {type(e).__name__}"
        ) from None
    return LoadedCheckpoint(path, state, weights, train_state)


def find_resumable(
    run_dir: Path,
    say=print,
    set_aside: bool = False,
    refuse_all_damaged: bool = False,
    accept: Callable[[LoadedCheckpoint], None] | None = None,
) -> LoadedCheckpoint | None:
    """The newest checkpoint that reads back completely (and that `accept` takes: it raises DamagedCheckpoint for a
    part it cannot use, a damaged loader position say); each damaged newer one is reported and skipped, and with
    `set_aside` renamed to `step-N.damaged` (kept for inspection, never again taken for a checkpoint or pruned).
    `refuse_all_damaged` (a resume): a folder that has checkpoints, none usable, is refused with one UserError naming
    them, and nothing is renamed."""
    remove_unfinished_saves(run_dir)
    damaged: list[tuple[Path, DamagedCheckpoint]] = []
    for path in list_checkpoints(run_dir):
        try:
            loaded = read_checkpoint(path)
            if accept is not None:
                accept(loaded)
        except DamagedCheckpoint as e:
            damaged.append((path, e))
            continue
        _report_damaged(damaged, say, set_aside)
        return loaded
    set_aside_before = sorted(p.name for p in (run_dir / CHECKPOINTS_DIR).glob("step-*.damaged"))
    if refuse_all_damaged and (damaged or set_aside_before):
        found = [f"{path.name} ({error})" for path, error in damaged] + [f"{n} (set aside)" for n in set_aside_before]
        raise UserError(
            f"--resume: no checkpoint in {run_dir / CHECKPOINTS_DIR} is usable: {'; '.join(found)}; nothing was "
            "changed. Put a good copy of a checkpoint there, or start a new run without --resume (or another --run-dir)"
        )
    _report_damaged(damaged, say, set_aside)
    return None


def _report_damaged(damaged: list[tuple[Path, DamagedCheckpoint]], say, set_aside: bool) -> None:
    for path, error in damaged:
        aside = path.with_name(path.name + ".damaged")
        note = f"; moved to {aside.name}" if set_aside else ""
        say(f"checkpoint {path} is damaged: {error}; falling back to the previous one{note}")
        if set_aside:
            shutil.rmtree(aside, ignore_errors=True)
            path.rename(aside)


def apply_checkpoint(
    loaded: LoadedCheckpoint,
    strategy: Strategy,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    scaler: torch.amp.GradScaler | None,
    say=print,
) -> TrainerState:
    """Put a checkpoint read by `read_checkpoint` into the live objects and restore the random generators."""
    check_format(loaded.state.format, loaded.state.world_size, strategy, strategy.env.world_size, loaded.path)
    weights = dict(loaded.weights)
    if strategy.model.args.tie_embeddings and weights:
        weights["output.weight"] = weights["tok_embeddings.weight"]
    try:
        strategy.load(loaded.path, loaded.state.format, weights, loaded.train_state)
    except (RuntimeError, ValueError, KeyError) as e:
        raise UserError(
            f"checkpoint {loaded.path} does not fit this recipe's model or optimizer ({str(e).splitlines()[0][:160]}); "
            "resume with the recipe the run was started with"
        ) from None
    scheduler.load_state_dict(loaded.train_state["scheduler"])
    if scaler is not None and loaded.train_state.get("scaler"):
        scaler.load_state_dict(loaded.train_state["scaler"])
    set_rng_state(own_rng_state(loaded.train_state, strategy.env.rank), say)
    return loaded.state


def own_rng_state(train_state: dict[str, Any], rank: int) -> dict[str, Any]:
    """This rank's saved generators (`rng_ranks`, one entry per rank); rank 0's (`rng`) where the checkpoint holds
    none for this rank: written by fewer ranks, or before every rank's were saved."""
    states = train_state.get("rng_ranks") or []
    return states[rank] if rank < len(states) else train_state["rng"]


def load_checkpoint_model(folder: Path, device: str | torch.device = "cpu") -> Transformer:
    """A checkpoint's (or dlx model folder's) whole model in one process: from model.safetensors where the folder has
    one, else read from its DCP shards (any layout wrote them). For `dlx export-hf` and `dlx generate`."""
    if (folder / WEIGHTS_FILE).is_file() or not (folder / DCP_METADATA).is_file():
        return load_model(folder, device)  # names what is missing when neither is there
    if not (folder / ARGS_FILE).is_file():
        raise UserError(f"{folder} is not a dlx checkpoint: {ARGS_FILE} is missing")
    model = empty_model(ModelArgs.model_validate_json((folder / ARGS_FILE).read_text()), device)
    dcp.load_whole_model(model, folder / DCP_FOLDER)
    return model
