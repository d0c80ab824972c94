"""`model.init_from`: start a run from existing weights instead of random ones.

The source is any of

    a Hugging Face Llama folder   config.json + model.safetensors, or shards listed by model.safetensors.index.json
    a dlx model folder            model_args.json + model.safetensors (`dlx import-hf` writes one)
    a dlx checkpoint              checkpoints/step-N/ of a run: its model.safetensors, or, where a sharded run saved
                                  none (checkpoint.full_weights last or never), its DCP shards, read shard-wise
    a dlx run folder              its newest complete checkpoint

The model's shape comes from the weights (a preset or `model.*` key may only agree with them; `max_seq_len`, which
sizes the RoPE tables and not the weights, is free). Optimizer, schedule and data start fresh: this is not --resume.
When a tokenizer.json comes with the weights, the dataset must have been prepared with the same tokenizer, compared by
content (`dlx.data.tokenizer_identity`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import torch

from dlx.data.shards import TOKENIZER_FILE
from dlx.errors import UserError
from dlx.model.args import ModelArgs, describe_rope_scaling
from dlx.model.hf import HF_CONFIG_FILE, TRAINED_LENGTH_KEY, read_hf_args, read_hf_folder, rope_context
from dlx.model.io import (
    ARGS_FILE,
    WEIGHTS_FILE,
    StoredTensor,
    load_weights,
    read_model_args,
    read_model_folder,
    unique_state_dict,
)
from dlx.model.llama import Transformer
from dlx.model.presets import resolve_model_args
from dlx.parallel import dcp
from dlx.parallel.strategy import DCP_FOLDER
from dlx.train import checkpoint as ckpt
from dlx.train.folder import RUN_CONFIG_FILE
from dlx.train.trained import find_tokenizer_file
from dlx.train.vocab_growth import VOCAB_TENSORS, extends, fill_grown, new_token_pieces

KINDS = {"hf": "Hugging Face folder", "model": "dlx model folder", "checkpoint": "dlx checkpoint", "run": "dlx run"}
FREE_KEYS = ("max_seq_len",)
"""ModelArgs fields a run may set whatever the weights: they size derived tables, not weights."""
ROPE_KEYS = ("rope_theta", "rope_scaling")
"""ModelArgs fields a recipe may change at init_from (long-context continued pretraining); left out, the weights'."""


@dataclass(frozen=True)
class InitSource:
    """Where the initial weights are, resolved from what `model.init_from` names."""

    given: Path
    kind: str
    """hf, model, checkpoint or run (see KINDS)."""
    weights: Path
    """The folder that holds the weights (a run folder's newest complete checkpoint)."""
    tokenizer: Path | None
    """The tokenizer.json that comes with the weights, if any."""
    notes: tuple[str, ...] = field(default=())
    """Damaged checkpoints passed over in a run folder, for the console."""

    def describe(self) -> str:
        where = "" if self.weights == self.given else f" ({self.weights.relative_to(self.given)})"
        return f"{self.given}{where}, a {KINDS[self.kind]}"

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


def resolve_source(init_from: str | Path, role: str = "model.init_from") -> InitSource:
    """What kind of folder `init_from` is, and where its weights and tokenizer are; one line when it is none, starting
    with `role` (what the user gave the folder as)."""
    path = Path(init_from)
    if not path.is_dir():
        raise UserError(
            f"{role} {path} does not exist or is not a folder; give a Hugging Face model folder, a dlx model "
            "folder, a checkpoint or a run folder"
        )
    if (path / HF_CONFIG_FILE).is_file():
        return InitSource(path, "hf", path, _file_or_none(path / TOKENIZER_FILE))
    if (path / ckpt.TRAINER_STATE_FILE).is_file():
        try:
            ckpt.read_trainer_state(path)
        except ckpt.DamagedCheckpoint as e:
            raise UserError(f"{role} {path}: the checkpoint is damaged ({e}); give an earlier one") from None
        return InitSource(path, "checkpoint", path, find_tokenizer_file(path))
    if (path / ARGS_FILE).is_file():
        return InitSource(path, "model", path, find_tokenizer_file(path))
    if (path / RUN_CONFIG_FILE).is_file():
        return _newest_checkpoint(path, role)
    raise UserError(
        f"{role} {path} is neither a Hugging Face folder ({HF_CONFIG_FILE}), a dlx model folder or checkpoint "
        f"({ARGS_FILE}) nor a run folder ({RUN_CONFIG_FILE}); give one of those"
    )


def _newest_checkpoint(run_dir: Path, role: str) -> InitSource:
    notes = []
    for path in ckpt.list_checkpoints(run_dir):
        try:
            ckpt.read_trainer_state(path)
        except ckpt.DamagedCheckpoint as e:
            notes.append(f"{role}: checkpoint {path} is damaged ({e}); taking the one before it")
            continue
        return InitSource(run_dir, "run", path, find_tokenizer_file(path), tuple(notes))
    raise UserError(f"{role} {run_dir} is a run folder without a complete checkpoint; give another source")


def _file_or_none(path: Path) -> Path | None:
    return path if path.is_file() else None


def shape_of(args: ModelArgs) -> dict[str, Any]:
    """What the weights fix: every ModelArgs property that changes a tensor's shape or value."""
    return {
        "dim": args.dim,
        "n_layers": args.n_layers,
        "n_heads": args.n_heads,
        "n_kv_heads": args.kv_heads,
        "vocab_size": args.vocab_size,
        "ffn_hidden_dim": args.ffn_hidden_dim,
        "norm_eps": args.norm_eps,
        "rope_theta": args.rope_theta,
        "tie_embeddings": args.tie_embeddings,
        "rope_scaling": args.rope_scaling.model_dump() if args.rope_scaling else None,
    }


def resolve_init_args(source: InitSource, preset: str | None, overrides: dict[str, Any]) -> ModelArgs:
    """The weights' shape; `preset` (when the recipe names one) and `overrides` must agree with it, except FREE_KEYS.
    A contradiction is one line naming the key, its value and the weights' value."""
    weights = source.args()
    if preset:
        claimed = resolve_model_args(preset, **overrides)
    else:
        claimed = resolve_model_args(None, **{**weights.model_dump(), **overrides})
    expected = shape_of(weights)
    for prop, value in shape_of(claimed).items():
        if _may_change(prop, value, expected[prop], overrides):
            continue
        if value != expected[prop]:
            key = _blamed_key(prop, overrides) or (None if preset else next(iter(overrides)))
            if key is None:
                subject, key = f"model.preset {preset!r} has {prop} {value}", "preset"
            elif key == prop:
                subject = f"model.{key} is {value}"
            else:
                subject = f"model.{key} {overrides[key]} makes {prop} {value}"
            raise UserError(
                f"{subject} but the weights in model.init_from {source.given} have {prop} {expected[prop]}; the shape "
                f"comes from the weights: leave model.{key} out"
            )
    free = {key: getattr(claimed, key) for key in FREE_KEYS}
    changed = {key: overrides[key] for key in (*ROPE_KEYS, "vocab_size") if key in overrides}
    return resolve_model_args(None, **{**weights.model_dump(), **free, **changed})


def _may_change(prop: str, value: Any, stored: Any, overrides: dict[str, Any]) -> bool:
    """RoPE keys the recipe sets, and a vocabulary at least the weights' (the embedding grows), differ freely."""
    if prop not in overrides:
        return False
    return prop in ROPE_KEYS or (prop == "vocab_size" and value >= stored)


def describe_changes(weights: ModelArgs, run: ModelArgs) -> list[str]:
    """`key old → new` for every field the run changes at init_from (the header's line)."""
    before, after = weights.model_dump(), run.model_dump()
    before["rope_scaling"], after["rope_scaling"] = map(describe_rope_scaling, (weights.rope_scaling, run.rope_scaling))
    return [
        f"{key} {before[key]} → {after[key]}"
        for key in (*FREE_KEYS, *ROPE_KEYS, "vocab_size")
        if before[key] != after[key]
    ]


def _blamed_key(prop: str, overrides: dict[str, Any]) -> str | None:
    """The override that changed `prop`; None when it is the preset's doing."""
    candidates = {"ffn_hidden_dim": ("ffn_dim_multiplier", "multiple_of"), "n_kv_heads": ("n_kv_heads", "n_heads")}
    return next((key for key in candidates.get(prop, (prop,)) if key in overrides), None)


def load_initial_weights(model: Transformer, source: InitSource, data_tokenizer: Path | None = None) -> None:
    """Copy the source's weights into `model`: built by `dlx.model.io.empty_model`, or sharded (DTensor parameters,
    e.g. FSDP2 on the meta device, then `to_empty`), when each rank reads only its own rows. Under torchrun every rank
    reads the same files, which the operating system's page cache holds once. From a checkpoint's DCP shards, each rank
    reads the parts its layout holds (every rank calls this then: the read is collective). When the data's tokenizer
    extends the weights' or the model's vocabulary is larger, the embedding and head grow (`dlx.train.vocab_growth`)."""
    if not source.in_shards:
        stored = source.stored()
        if not _vocabulary_changes(model, stored, source, data_tokenizer):
            load_weights(model, stored, str(source.weights))
            return
        load_weights(model, stored, str(source.weights), skip=VOCAB_TENSORS)
        fill_grown(model, stored, *_new_rows(model, stored, source, data_tokenizer))
        return
    try:
        dcp.load_model_weights(model, source.weights / DCP_FOLDER)
    except (RuntimeError, ValueError, KeyError) as e:  # DCP's CheckpointException is a RuntimeError
        raise UserError(
            f"{source.weights}: its DCP shards cannot be read ({str(e).splitlines()[0][:160]}); give another checkpoint"
        ) from None


def _vocabulary_changes(
    model: Transformer, stored: dict[str, StoredTensor], source: InitSource, data_tokenizer: Path | None
) -> bool:
    rows = stored["tok_embeddings.weight"].shape[0]
    return model.args.vocab_size != rows or extends(source.tokenizer, data_tokenizer)


def _new_rows(
    model: Transformer, stored: dict[str, StoredTensor], source: InitSource, data_tokenizer: Path | None
) -> tuple[int, list[list[int]]]:
    """The first id that is not the weights' and each new row's base pieces (none: the mean row)."""
    size = model.args.vocab_size
    if source.tokenizer is not None and data_tokenizer is not None and extends(source.tokenizer, data_tokenizer):
        return new_token_pieces(source.tokenizer, data_tokenizer, size)
    rows = stored["tok_embeddings.weight"].shape[0]
    return rows, [[] for _ in range(size - rows)]


def check_tokenizer(source: InitSource, dataset_tokenizer: Path | None, data_path: Path | None) -> None:
    """The dataset's tokenizer must be the weights' one or an extension of it (`dlx tokenizer extend`), by content
    (vocabulary, merges, added tokens)."""
    if source.tokenizer is None or dataset_tokenizer is None:
        return
    from dlx.data.tokenizer_identity import describe_extension_problem, read_identity

    difference = describe_extension_problem(read_identity(source.tokenizer), read_identity(dataset_tokenizer))
    if difference is not None:
        raise UserError(
            f"data.path {data_path} was prepared with a tokenizer that is neither model.init_from's "
            f"{source.tokenizer} nor an extension of it ({difference}); prepare the data again with --tokenizer "
            f"{source.tokenizer} (or one `dlx tokenizer extend` made from it)"
        )


def bos_difference(source: InitSource, dataset_tokenizer: Path | None) -> str | None:
    """One line when the data's documents start otherwise than the weights' tokenizer starts a text (its own BOS
    convention, `dlx.data.prepare.tokenizer.bos_by_convention`); None when they agree or either is unknown."""
    if source.tokenizer is None or dataset_tokenizer is None:
        return None
    from dlx.data.prepare.tokenizer import document_bos_id, read_tokenizer

    weights_bos, data_bos = read_tokenizer(source.tokenizer, None).bos_id, document_bos_id(dataset_tokenizer)
    if weights_bos == data_bos:
        return None
    data_side = "puts no BOS before its documents" if data_bos is None else f"starts every document with id {data_bos}"
    weights_side = "adds no BOS" if weights_bos is None else f"starts every text with BOS id {weights_bos}"
    fix = "--no-bos" if weights_bos is None else "--bos"
    return (
        f"note: the data {data_side}, but model.init_from's tokenizer {source.tokenizer} {weights_side}; "
        f"to train as the weights were, prepare the data again with {fix}"
    )


def export_context(found: InitSource) -> tuple[int, str | None]:
    """The context length `dlx export-hf` states for the model in `found` (config.json's max_position_embeddings,
    the tokenizer's model_max_length), and the line that says why (None when there is nothing to explain). The rule:
    a run with model.init_from that kept the source's RoPE (rope_theta and rope_scaling) states the source's context
    length: the weights were made for it, the run only trained on other windows. Everything else states the context
    its own RoPE was configured for (`dlx.model.hf.rope_context`: YaRN's original_max_seq_len × factor, else the
    trained max_seq_len): a run that changed RoPE at init_from (the source's claim describes frequencies the model no
    longer has, and transformers warns when YaRN's factor and the stated length disagree), a run from scratch, a model
    folder, and a run whose source is gone."""
    args = found.args()
    own, how = rope_context(args)
    trained = f"trained with max_seq_len {args.max_seq_len:,}, kept in config.json as {TRAINED_LENGTH_KEY}"
    own_line = None if own == args.max_seq_len else f"max_position_embeddings {own:,}: {how} ({trained})"
    run_dir = found.given if found.kind == "run" else found.weights.parent.parent
    if found.kind not in ("run", "checkpoint") or not (run_dir / RUN_CONFIG_FILE).is_file():
        return own, own_line
    from dlx.train.folder import saved_config

    init_from = (saved_config(run_dir).get("model") or {}).get("init_from")
    if not init_from:
        return own, own_line
    if not Path(init_from).is_dir():
        return own, (
            f"note: model.init_from {init_from} of {run_dir} is gone, so the export states {own:,} ({how}), not the "
            "source's context length"
        )
    source = resolve_source(init_from).args()
    if (source.rope_theta, source.rope_scaling) == (args.rope_theta, args.rope_scaling):
        if source.max_seq_len == args.max_seq_len:
            return source.max_seq_len, None
        return source.max_seq_len, (
            f"max_position_embeddings {source.max_seq_len:,}: the context length of model.init_from's weights, whose "
            f"RoPE the run kept ({trained})"
        )
    changes = [change for change in describe_changes(source, args) if change.startswith(ROPE_KEYS)]
    return own, (
        f"max_position_embeddings {own:,}: {how}, not model.init_from's {source.max_seq_len:,}, as RoPE changed at "
        f"init_from ({', '.join(changes)})" + (f"; {trained}" if own != args.max_seq_len else "")
    )
