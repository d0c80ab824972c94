"""A trained model, from whatever names one: a run folder (its newest complete checkpoint), a checkpoint of any layout
(model.safetensors, or its DCP shards), a dlx model folder or a Hugging Face folder, each also as an s3://, gs:// or
hf:// URL (`dlx.train.rundir.remote.pull_source` brings it into a local staging folder first), with the tokenizer that
came with it. `resolve_trained` is the one resolver: the starting weights of a run, `dlx generate`, `eval`, `passkey`,
`export-hf`, `plan` and `params` all find their model through it; a source that is none of these, or damaged, is one
line naming it.
"""

from __future__ import annotations

import fcntl
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import torch

from dlx.data import storage
from dlx.data.shards import TOKENIZER_FILE
from dlx.errors import UserError
from dlx.model.args import ModelArgs
from dlx.model.hf import HF_CONFIG_FILE, load_hf, read_hf_args, read_hf_folder
from dlx.model.io import ARGS_FILE, WEIGHTS_FILE, StoredTensor, read_model_args, read_model_folder, unique_state_dict
from dlx.model.llama import Transformer
from dlx.parallel import dcp
from dlx.parallel.strategy import DCP_FOLDER
from dlx.train.rundir import checkpoint as ckpt
from dlx.train.rundir.folder import RUN_CONFIG_FILE

PULL_LOCK = ".pull.lock"
"""In the staging root: held while a URL's model is downloaded."""
KINDS = {"hf": "Hugging Face folder", "model": "dlx model folder", "checkpoint": "dlx checkpoint", "run": "dlx run"}


@dataclass(frozen=True)
class TrainedSource:
    """Where a trained model's weights and tokenizer are, resolved from what the user named."""

    given: str
    """What the user named: a folder or a URL."""
    folder: Path
    """The local folder it names (a URL's staging copy)."""
    kind: str
    """hf, model, checkpoint or run (see KINDS)."""
    weights: Path
    """The folder that holds the weights (a run folder's newest complete checkpoint)."""
    tokenizer: Path | None
    """The tokenizer.json that comes with the weights, if any."""
    notes: tuple[str, ...] = field(default=())
    """Damaged checkpoints passed over in a run folder, for the console."""

    def describe(self) -> str:
        """What was read: the source as given, the checkpoint's step and folder when it is one, and its kind."""
        step = f"checkpoint step {int(self.weights.name[5:])}" if re.fullmatch(r"step-\d+", self.weights.name) else ""
        inside = "" if self.weights == self.folder else str(self.weights.relative_to(self.folder))
        where = ": ".join(part for part in (step, inside) if part)
        return f"{self.given}{f' ({where})' if where else ''}, a {KINDS[self.kind]}"

    @property
    def in_shards(self) -> bool:
        """A checkpoint without model.safetensors (a sharded run's, as checkpoint.full_weights last or never leaves
        all but its last): the weights are read from its DCP shards."""
        return self.kind in ("checkpoint", "run") and not (self.weights / WEIGHTS_FILE).is_file()

    def args(self) -> ModelArgs:
        """The weights' shape (config.json or model_args.json, read once)."""
        return self._args

    def stored(self) -> dict[str, StoredTensor]:
        """Every stored tensor by dlx name (headers only: names, shapes, dtypes; shards and index checked; read
        once)."""
        return self._stored

    @cached_property
    def _args(self) -> ModelArgs:
        if self.kind == "hf":
            return read_hf_args(self.weights)
        return _sharded_checkpoint_args(self.weights) if self.in_shards else read_model_args(self.weights)

    @cached_property
    def _stored(self) -> dict[str, StoredTensor]:
        if self.kind == "hf":
            return read_hf_folder(self.weights, self._args)[1]
        return read_model_folder(self.weights)[1]

    def check(self) -> None:
        """Every header, shard and shape checked, no tensor data read: a broken source fails before anything starts."""
        if not self.in_shards:
            self.stored()
            return
        with torch.device("meta"):
            expected = {name: tuple(t.shape) for name, t in unique_state_dict(Transformer(self.args())).items()}
        try:
            stored = dcp.stored_shapes(self.weights / DCP_FOLDER)
        except Exception as e:  # DCP raises bare exceptions for unreadable metadata
            raise UserError(f"{self.weights}: its DCP metadata cannot be read ({e}); give another checkpoint") from None
        wrong = [name for name, shape in expected.items() if stored.get(name) != shape]
        if wrong:
            raise UserError(
                f"{self.weights}: its DCP shards do not hold {wrong[0]} with shape {list(expected[wrong[0]])} as its "
                f"{ARGS_FILE} says; give another checkpoint"
            )

    def load(self, device: str | torch.device = "cpu") -> Transformer:
        """The whole model in this process on `device`: a Hugging Face folder in the dtype it was saved in, else
        model.safetensors, or the whole weights read from the DCP shards."""
        if self.kind == "hf":
            return load_hf(self.weights, device)
        return ckpt.load_checkpoint_model(self.weights, device)


def _sharded_checkpoint_args(folder: Path) -> ModelArgs:
    if not (folder / ckpt.DCP_METADATA).is_file():
        raise UserError(
            f"{folder} holds neither {WEIGHTS_FILE} nor DCP shards (a DeepSpeed checkpoint without full weights); "
            f"give a checkpoint that has {WEIGHTS_FILE} (the run's last, or save with checkpoint.full_weights every)"
        )
    try:
        return ModelArgs.model_validate_json((folder / ARGS_FILE).read_text())
    except (OSError, ValueError) as e:
        raise UserError(f"{folder / ARGS_FILE} is missing or damaged ({e}); give another checkpoint") from None


def resolve_trained(source: str | Path, role: str, say: Callable[[str], None] | None = None) -> TrainedSource:
    """What kind of model `source` names, and where its weights and tokenizer are; a URL is downloaded first. One
    line when it is none of the kinds, starting with `role` (what the user gave it as: `model.init_from`, `dlx
    export-hf`, ...). `say`: where the notes go (damaged checkpoints passed over), besides the value's `notes`."""
    found = _resolve_local(str(source), local_copy(str(source), role), role)
    for note in found.notes if say is not None else ():
        say(note)
    return found


def local_copy(source: str, role: str) -> Path:
    """The folder `source` names; a URL's newest complete checkpoint (or the checkpoint it names) downloaded into the
    staging folder first (`dlx.train.rundir.remote.pull_source`), one process at a time: the ranks of a job on one
    machine share the staging folder, and the first download serves the others."""
    if not storage.is_url(source):
        return Path(source)
    from dlx.data.storage import staging_root
    from dlx.train.rundir.remote import pull_source

    staging_root().mkdir(parents=True, exist_ok=True)
    with open(staging_root() / PULL_LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, or when this process dies
        return Path(pull_source(source, role))


def _resolve_local(given: str, path: Path, role: str) -> TrainedSource:
    if not path.is_dir():
        raise UserError(
            f"{role} {path} does not exist or is not a folder; give a Hugging Face model folder, a dlx model "
            "folder, a checkpoint or a run folder"
        )
    if (path / HF_CONFIG_FILE).is_file():
        tokenizer = path / TOKENIZER_FILE
        return TrainedSource(given, path, "hf", path, tokenizer if tokenizer.is_file() else None)
    if (path / ckpt.TRAINER_STATE_FILE).is_file():
        try:
            ckpt.read_trainer_state(path)
        except ckpt.DamagedCheckpoint as e:
            raise UserError(f"{role} {path}: the checkpoint is damaged ({e}); give an earlier one") from None
        return TrainedSource(given, path, "checkpoint", path, find_tokenizer_file(path))
    if (path / ARGS_FILE).is_file():
        return TrainedSource(given, path, "model", path, find_tokenizer_file(path))
    if (path / RUN_CONFIG_FILE).is_file():
        return _newest_checkpoint(given, path, role)
    raise UserError(
        f"{role} {path} is neither a Hugging Face folder ({HF_CONFIG_FILE}), a dlx model folder or checkpoint "
        f"({ARGS_FILE}) nor a run folder ({RUN_CONFIG_FILE}); give one of those"
    )


def _newest_checkpoint(given: str, run_dir: Path, role: str) -> TrainedSource:
    """The newest checkpoint whose trainer state and layout metadata read back (`ckpt.read_model_state`); each
    damaged newer one is a note."""
    notes = []
    for path in ckpt.list_checkpoints(run_dir):
        try:
            ckpt.read_model_state(path)
        except ckpt.DamagedCheckpoint as e:
            notes.append(f"{role}: checkpoint {path} is damaged ({e}); taking the one before it")
            continue
        return TrainedSource(given, run_dir, "run", path, find_tokenizer_file(path), tuple(notes))
    raise UserError(f"{role} {run_dir} is a run folder without a complete checkpoint; give another source")


def find_tokenizer_file(weights: Path) -> Path | None:
    """tokenizer.json beside the weights, or in the run folder above `checkpoints/step-N/`."""
    for candidate in (weights / TOKENIZER_FILE, weights.parent.parent / TOKENIZER_FILE):
        if candidate.is_file():
            return candidate
    return None


@dataclass(frozen=True)
class TrainedModel:
    model: Transformer
    source: TrainedSource
    tokenizer: Any
    """The `tokenizers.Tokenizer` that came with the weights."""


def load_trained(found: TrainedSource, device: torch.device) -> TrainedModel:
    """The whole model `found` names, in one process on `device`, and its tokenizer (checked first: a folder without
    one is refused before the weights are read)."""
    from tokenizers import Tokenizer

    if found.tokenizer is None:
        raise UserError(
            f"no {TOKENIZER_FILE} for {found.given}: the run trained on synthetic data or its folder was moved; copy "
            f"the dataset's {TOKENIZER_FILE} into the run folder"
        )
    return TrainedModel(found.load(device), found, Tokenizer.from_file(str(found.tokenizer)))


def say_on_stderr(line: str) -> None:
    """Where a command's notes go: its standard output may be --json."""
    print(line, file=sys.stderr)


def model_args_of(name: str, role: str) -> ModelArgs:
    """The shape `name` gives: a preset or a YAML/JSON file of ModelArgs, else the model a folder or URL names
    (`resolve_trained`), read from its config.json or model_args.json alone."""
    from dlx.model.presets import PRESETS, resolve_model_args

    if name in PRESETS or Path(name).is_file() or (not storage.is_url(name) and not Path(name).is_dir()):
        return resolve_model_args(name)  # names an unknown preset or a missing file
    return resolve_trained(name, role).args()
