"""`model.init_from`: start a run from existing weights instead of random ones.

The source is whatever `dlx.train.rundir.trained.resolve_trained` takes: a Hugging Face Llama folder, a dlx model
folder, a checkpoint of any layout or a run folder (its newest complete checkpoint), local or in a bucket.
`resolve_init` turns the recipe's model section into one `InitFrom`, once, before the recipe is validated: the source
and the run's model shape. The shape comes from the weights (a preset or `model.*` key may only agree with them;
`max_seq_len`, which sizes the RoPE tables and not the weights, is free, and RoPE may change for long-context continued
pretraining); when the dataset's tokenizer extends the weights' (`dlx tokenizer extend`), the vocabulary grows
(`dlx.train.init.vocab_growth`). Optimizer, schedule and data start fresh: this is not --resume.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dlx.errors import UserError
from dlx.model.args import ModelArgs, describe_rope_scaling
from dlx.model.hf import TRAINED_LENGTH_KEY, rope_context
from dlx.model.presets import resolve_model_args
from dlx.train.config import ModelSection, model_overrides_problem
from dlx.train.init.vocab_growth import dataset_tokenizer, grown_vocab_size
from dlx.train.rundir.folder import RUN_CONFIG_FILE, saved_config
from dlx.train.rundir.trained import TrainedSource, resolve_trained

ROLE = "model.init_from"
FREE_KEYS = ("max_seq_len",)
"""ModelArgs fields a run may set whatever the weights: they size derived tables, not weights."""
ROPE_KEYS = ("rope_theta", "rope_scaling")
"""ModelArgs fields a recipe may change at init_from (long-context continued pretraining); left out, the weights'."""


@dataclass(frozen=True)
class InitFrom:
    """`model.init_from` resolved: where the weights are and the model the run builds from them."""

    source: TrainedSource
    args: ModelArgs
    """The run's model: the weights' shape, with the recipe's max_seq_len and RoPE and a grown vocabulary."""


def resolve_init(raw: dict[str, Any], resuming: bool) -> InitFrom | None:
    """The recipe mapping's model.init_from resolved and its shape checked against the preset and `model.*` keys;
    None without init_from, when validation will refuse the model section anyway, or when a resumed run's weights are
    gone (the run folder's config.yaml then gives the shape)."""
    model = raw.get("model")
    if not isinstance(model, dict) or not isinstance(model.get("init_from"), str) or not model["init_from"]:
        return None
    overrides = {key: value for key, value in model.items() if key not in ("preset", "init_from", "pad_vocab_to")}
    if (resuming and not Path(model["init_from"]).exists()) or model_overrides_problem(overrides):
        return None
    try:
        source = resolve_trained(model["init_from"], ROLE)
        args = resolve_init_args(source, model.get("preset"), overrides)
    except UserError as e:
        message = str(e)
        raise UserError(f"recipe: {message}" if message.startswith("model.") else f"recipe: model: {message}") from None
    grown = vocabulary_after_growth(source, args, raw.get("data"), model.get("pad_vocab_to"))
    if grown is not None:
        args = resolve_model_args(None, **{**args.model_dump(), "vocab_size": grown})
    return InitFrom(source, args)


def vocabulary_after_growth(source: TrainedSource, args: ModelArgs, data: Any, pad_to: Any) -> int | None:
    """The vocabulary the model grows to when the recipe's dataset has a tokenizer that extends the weights' beyond
    their rows; None otherwise (also for a data section validation will refuse)."""
    data = data if isinstance(data, dict) else {}
    found = dataset_tokenizer(data.get("path"), data.get("mix"), data.get("cache_dir", ""))
    if found is None or found[1] <= args.vocab_size:
        return None
    if source.in_shards:
        raise UserError(
            f"{ROLE} {source.given}: growing the vocabulary reads {source.weights}/model.safetensors, which this "
            "sharded checkpoint lacks; give a checkpoint with full weights (checkpoint.full_weights last or every)"
        )
    if pad_to is None:
        pad_to = ModelSection.model_fields["pad_vocab_to"].default
    if not isinstance(pad_to, int) or pad_to < 1:
        return None  # validation refuses model.pad_vocab_to
    where = f"data.path {data.get('path')}" if not data.get("mix") else "the data.mix sources"
    return grown_vocab_size(args.vocab_size, source.tokenizer, found, pad_to, where)


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


def resolve_init_args(source: TrainedSource, preset: str | None, overrides: dict[str, Any]) -> ModelArgs:
    """The weights' shape; `preset` (when the recipe names one) and `overrides` must agree with it, except FREE_KEYS.
    A contradiction is one line naming the key, its value and the weights' value."""
    weights = source.args()
    if preset:
        claimed = resolve_model_args(preset, **overrides)
    else:
        claimed = resolve_model_args(None, **{**weights.model_dump(), **overrides})
    expected = shape_of(weights)
    for prop, value in shape_of(claimed).items():
        if _may_change(prop, value, expected[prop], overrides) or value == expected[prop]:
            continue
        key = _blamed_key(prop, overrides) or (None if preset else next(iter(overrides)))
        if key is None:
            subject, key = f"model.preset {preset!r} has {prop} {value}", "preset"
        elif key == prop:
            subject = f"model.{key} is {value}"
        else:
            subject = f"model.{key} {overrides[key]} makes {prop} {value}"
        raise UserError(
            f"{subject} but the weights in {ROLE} {source.given} have {prop} {expected[prop]}; the shape "
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


def _blamed_key(prop: str, overrides: dict[str, Any]) -> str | None:
    """The override that changed `prop`; None when it is the preset's doing."""
    candidates = {"ffn_hidden_dim": ("ffn_dim_multiplier", "multiple_of"), "n_kv_heads": ("n_kv_heads", "n_heads")}
    return next((key for key in candidates.get(prop, (prop,)) if key in overrides), None)


def describe_changes(weights: ModelArgs, run: ModelArgs) -> list[str]:
    """`key old → new` for every field the run changes at init_from (the header's line)."""
    before, after = weights.model_dump(), run.model_dump()
    before["rope_scaling"], after["rope_scaling"] = map(describe_rope_scaling, (weights.rope_scaling, run.rope_scaling))
    return [
        f"{key} {before[key]} → {after[key]}"
        for key in (*FREE_KEYS, *ROPE_KEYS, "vocab_size")
        if before[key] != after[key]
    ]


def export_context(found: TrainedSource) -> tuple[int, str | None]:
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
    run_dir = found.folder if found.kind == "run" else found.weights.parent.parent
    if found.kind not in ("run", "checkpoint") or not (run_dir / RUN_CONFIG_FILE).is_file():
        return own, own_line
    init_from = (saved_config(run_dir).get("model") or {}).get("init_from")
    if not init_from:
        return own, own_line
    if not Path(init_from).is_dir():
        return own, (
            f"note: {ROLE} {init_from} of {run_dir} is gone, so the export states {own:,} ({how}), not the "
            "source's context length"
        )
    source = resolve_trained(init_from, ROLE).args()
    if (source.rope_theta, source.rope_scaling) == (args.rope_theta, args.rope_scaling):
        if source.max_seq_len == args.max_seq_len:
            return source.max_seq_len, None
        return source.max_seq_len, (
            f"max_position_embeddings {source.max_seq_len:,}: the context length of {ROLE}'s weights, whose "
            f"RoPE the run kept ({trained})"
        )
    changes = [change for change in describe_changes(source, args) if change.startswith(ROPE_KEYS)]
    return own, (
        f"max_position_embeddings {own:,}: {how}, not {ROLE}'s {source.max_seq_len:,}, as RoPE changed at "
        f"init_from ({', '.join(changes)})" + (f"; {trained}" if own != args.max_seq_len else "")
    )
