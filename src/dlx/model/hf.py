"""Hugging Face Llama folders, both ways, without importing transformers.

`save_hf` writes what `LlamaForCausalLM.from_pretrained` and `AutoTokenizer.from_pretrained` load: `config.json`,
`model.safetensors` and, given the tokenizer, the files of `dlx.model.hf_tokenizer`. `read_hf_folder` reads such a
folder as `save_pretrained` writes it (one `model.safetensors`, or shards listed by `model.safetensors.index.json`),
checking the architecture, the index against its shards and every tensor's shape against config.json; `load_hf` loads
it into a dlx `Transformer` without a second copy (`dlx.model.io`). dlx's RoPE rotates halves like HF's, so q/k
weights need no permutation: the conversion is a renaming.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from pydantic import ValidationError

from dlx.atomic import atomic_dir
from dlx.errors import UserError
from dlx.model.args import ROPE_TYPES, ModelArgs, RopeScaling, describe_validation_error
from dlx.model.hf_tokenizer import copy_tokenizer_files, write_tokenizer_files
from dlx.model.io import (
    StoredTensor,
    empty_model,
    load_weights,
    read_headers,
    save_weights_file,
    stored_dtype,
    unique_state_dict,
    write_weights,
)
from dlx.model.llama import Transformer

HF_CONFIG_FILE = "config.json"
HF_WEIGHTS_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
_LAYER_NAMES = {  # dlx name inside `layers.N.` -> HF name inside `model.layers.N.`
    "attention.wq.weight": "self_attn.q_proj.weight",
    "attention.wk.weight": "self_attn.k_proj.weight",
    "attention.wv.weight": "self_attn.v_proj.weight",
    "attention.wo.weight": "self_attn.o_proj.weight",
    "feed_forward.w1.weight": "mlp.gate_proj.weight",
    "feed_forward.w3.weight": "mlp.up_proj.weight",
    "feed_forward.w2.weight": "mlp.down_proj.weight",
    "attention_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
}
_TOP_NAMES = {
    "tok_embeddings.weight": "model.embed_tokens.weight",
    "norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}


def dlx_to_hf_name(name: str) -> str:
    if name in _TOP_NAMES:
        return _TOP_NAMES[name]
    _, index, rest = name.split(".", 2)  # layers.N.rest
    return f"model.layers.{index}.{_LAYER_NAMES[rest]}"


def hf_to_dlx_name(name: str) -> str | None:
    """None for HF tensors dlx does not keep (for example `rotary_emb.inv_freq` in old exports)."""
    for dlx_name, hf_name in _TOP_NAMES.items():
        if name == hf_name:
            return dlx_name
    if name.startswith("model.layers."):
        _, _, index, rest = name.split(".", 3)
        for dlx_rest, hf_rest in _LAYER_NAMES.items():
            if rest == hf_rest:
                return f"layers.{index}.{dlx_rest}"
    return None


def hf_config(args: ModelArgs, dtype: torch.dtype) -> dict[str, Any]:
    config: dict[str, Any] = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": args.dim,
        "intermediate_size": args.ffn_hidden_dim,
        "num_hidden_layers": args.n_layers,
        "num_attention_heads": args.n_heads,
        "num_key_value_heads": args.kv_heads,
        "head_dim": args.head_dim,
        "vocab_size": args.vocab_size,
        "rms_norm_eps": args.norm_eps,
        "rope_theta": args.rope_theta,
        "max_position_embeddings": args.max_seq_len,
        "tie_word_embeddings": args.tie_embeddings,
        "hidden_act": "silu",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "mlp_bias": False,
        "initializer_range": 0.02,
        "use_cache": True,
        "torch_dtype": _DTYPE_NAMES.get(dtype, "float32"),
        "rope_scaling": None,
        "bos_token_id": None,  # set from the tokenizer by save_hf; left out, transformers would assume 1 and 2
        "eos_token_id": None,
    }
    if args.rope_scaling is not None:
        config["rope_scaling"] = hf_rope_scaling(args.rope_scaling)
    return config


def args_from_hf_config(config: dict[str, Any], source: str = HF_CONFIG_FILE) -> ModelArgs:
    """ModelArgs from a Llama config.json; another architecture, or a Llama variant dlx's module does not compute
    (biases, another activation, another head_dim), is one line saying which."""
    _check_llama(config, source)
    try:
        fields = _llama_fields(config, source)
    except KeyError as e:
        raise UserError(f"{source} has no {e.args[0]!r}; it is not a complete Llama config.json") from None
    except (TypeError, ZeroDivisionError):
        raise UserError(f"{source}: hidden_size, num_attention_heads and intermediate_size must be integers") from None
    try:
        args = ModelArgs(**fields)
    except ValidationError as e:
        raise UserError(describe_validation_error(e, source)) from None
    if args.ffn_hidden_dim != config["intermediate_size"]:
        raise UserError(f"{source}: intermediate_size {config['intermediate_size']} is not supported")
    return args


def _llama_fields(config: dict[str, Any], source: str) -> dict[str, Any]:
    dim, n_heads = config["hidden_size"], config["num_attention_heads"]
    if config.get("head_dim") not in (None, dim // n_heads):
        raise UserError(f"{source}: head_dim {config['head_dim']} != hidden_size / num_attention_heads; not supported")
    # Meta's rule cannot express every intermediate_size; this choice reproduces it exactly: int(base · m) lands
    # on intermediate or one below it, and rounding up to a multiple of intermediate gives it back.
    intermediate = config["intermediate_size"]
    return {
        "dim": dim,
        "n_layers": config["num_hidden_layers"],
        "n_heads": n_heads,
        "n_kv_heads": config.get("num_key_value_heads") or n_heads,
        "vocab_size": config["vocab_size"],
        "multiple_of": intermediate,
        "ffn_dim_multiplier": intermediate / int(8 * dim / 3),
        "norm_eps": config.get("rms_norm_eps", 1e-6),
        "rope_theta": _rope_theta(config),
        "max_seq_len": config.get("max_position_embeddings", 2048),
        "tie_embeddings": bool(config.get("tie_word_embeddings", False)),
        "rope_scaling": _rope_scaling(config, source),
    }


def _check_llama(config: dict[str, Any], source: str) -> None:
    architectures = config.get("architectures") or []
    if config.get("model_type") != "llama" or (architectures and "LlamaForCausalLM" not in architectures):
        named = ", ".join(architectures) or f"model_type {config.get('model_type')!r}"
        raise UserError(f"{source} describes {named}, not a Llama model; dlx reads LlamaForCausalLM folders only")
    unsupported = {
        "attention_bias": config.get("attention_bias", False),
        "mlp_bias": config.get("mlp_bias", False),
        "hidden_act": config.get("hidden_act", "silu") != "silu" and config.get("hidden_act"),
    }
    for key, value in unsupported.items():
        if value:
            raise UserError(f"{source}: {key} {value!r} is not supported (dlx's Llama has no biases and uses SiLU)")


def _rope_theta(config: dict[str, Any]) -> float:
    params = config.get("rope_parameters") or {}
    return float(config.get("rope_theta") or params.get("rope_theta") or 10000.0)


HF_SCALING_NAMES = {"original_max_seq_len": "original_max_position_embeddings"}
"""rope_scaling fields dlx names otherwise than transformers (after max_seq_len, HF's max_position_embeddings)."""


def hf_rope_scaling(scaling: RopeScaling) -> dict[str, Any]:
    """config.json's rope_scaling: dlx's fields under HF's names, unset optional ones (None) left out."""
    fields = {HF_SCALING_NAMES.get(key, key): value for key, value in scaling.model_dump().items() if value is not None}
    return {"rope_type": fields.pop("rope_type"), **fields}


def _rope_scaling(config: dict[str, Any], source: str) -> dict[str, Any] | None:
    """The rope_scaling (or transformers 5's rope_parameters) dict as ModelArgs takes it, read as transformers reads
    it: `type` for rope_type, original_max_position_embeddings defaulting to max_position_embeddings, a yarn factor
    of null meaning max_position_embeddings / original_max_position_embeddings, keys the kind has no use for ignored."""
    scaling = dict(config.get("rope_scaling") or config.get("rope_parameters") or {})
    rope_type = scaling.pop("rope_type", scaling.pop("type", None))
    if rope_type in (None, "default"):
        return None
    if rope_type not in ROPE_TYPES:
        raise UserError(
            f"{source}: rope_scaling type {rope_type!r} is not supported; dlx computes {', '.join(ROPE_TYPES)} "
            "(HF's dynamic NTK acts only at inference past the trained length: re-save the config with yarn or linear)"
        )
    if scaling.get("partial_rotary_factor", 1.0) != 1.0:
        raise UserError(f"{source}: partial_rotary_factor {scaling['partial_rotary_factor']} is not supported")
    if rope_type in ("llama3", "yarn"):
        scaling.setdefault("original_max_position_embeddings", config.get("max_position_embeddings", 2048))
    if rope_type == "yarn":
        if scaling.get("factor") is None:
            original = scaling["original_max_position_embeddings"]
            scaling["factor"] = config.get("max_position_embeddings", 2048) / original
        for beta in ("beta_fast", "beta_slow"):  # transformers takes 0 and null for its defaults, 32 and 1
            if not scaling.get(beta, True):
                del scaling[beta]
    names = {HF_SCALING_NAMES.get(key, key): key for key in ROPE_TYPES[rope_type].model_fields}
    return {"rope_type": rope_type, **{names[key]: value for key, value in scaling.items() if key in names}}


TRAINED_LENGTH_KEY = "dlx_trained_max_seq_len"
"""config.json key (dlx's own; transformers keeps it as an attribute) holding the model.max_seq_len a run trained with,
when the export states another context length: the weights' it started from (`model.init_from`), or the one its
YaRN scaling was configured for (`rope_context`)."""


def rope_context(args: ModelArgs) -> tuple[int, str]:
    """The context length `args`' RoPE was configured for, which an export states as max_position_embeddings, and
    how it follows from `args`: YaRN's original_max_seq_len × factor (rounded), its documented meaning, which
    transformers checks (it warns when max_position_embeddings / original_max_position_embeddings is not the factor);
    else the trained max_seq_len: linear names no original length, and llama3's factor is not a ratio of lengths
    (Llama 3.2 has 8,192 × 32 but claims 131,072), so neither says what context the model was made for."""
    scaling = args.rope_scaling
    if scaling is not None and scaling.rope_type == "yarn":
        how = f"yarn's original_max_seq_len {scaling.original_max_seq_len:,} × factor {scaling.factor:g}"
        return round(scaling.original_max_seq_len * scaling.factor), how
    return args.max_seq_len, "the trained max_seq_len"


def save_hf(
    model: Transformer,
    out_dir: str | Path,
    overwrite: bool = False,
    tokenizer: Path | None = None,
    context: int | None = None,
) -> Path:
    """Write `config.json` and `model.safetensors` for `LlamaForCausalLM.from_pretrained` and, given the training
    tokenizer.json, the tokenizer files with bos/eos ids in config.json (`dlx.model.hf_tokenizer`). `context`: the
    max_position_embeddings (and tokenizer model_max_length) to state; left out, the one the model's RoPE was
    configured for (`rope_context`). When it is not the model's max_seq_len, the trained length is kept under
    TRAINED_LENGTH_KEY."""
    out_dir = Path(out_dir)
    if out_dir.exists() and not overwrite:
        raise UserError(f"{out_dir} already exists; choose another output folder, remove it, or give --overwrite")
    state = {dlx_to_hf_name(name): t for name, t in unique_state_dict(model).items()}
    config = hf_config(model.args, next(model.parameters()).dtype)
    context = context or rope_context(model.args)[0]
    if context != model.args.max_seq_len:
        config.update(max_position_embeddings=context, **{TRAINED_LENGTH_KEY: model.args.max_seq_len})
    with atomic_dir(out_dir, overwrite=overwrite) as tmp:
        save_weights_file(state, tmp / HF_WEIGHTS_FILE)
        if tokenizer is not None:
            tokens = write_tokenizer_files(tokenizer, tmp, context)
            config.update(bos_token_id=tokens.bos_id, eos_token_id=tokens.eos_id)
        (tmp / HF_CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")
    return out_dir


def read_hf_args(hf_dir: str | Path) -> ModelArgs:
    """The model shape from a Hugging Face folder's config.json."""
    config_file = Path(hf_dir) / HF_CONFIG_FILE
    if not config_file.is_file():
        raise UserError(f"{hf_dir} is not a Hugging Face model folder: {HF_CONFIG_FILE} is missing")
    try:
        config = json.loads(config_file.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise UserError(f"{config_file} is not valid JSON: {e}") from None
    if not isinstance(config, dict):
        raise UserError(f"{config_file} is not a Hugging Face config (not a JSON object)")
    return args_from_hf_config(config, str(config_file))


def read_hf_folder(hf_dir: str | Path, args: ModelArgs | None = None) -> tuple[ModelArgs, dict[str, StoredTensor]]:
    """The shape and the stored tensors (by dlx name) of a Hugging Face Llama folder, headers only; `args`: its
    config.json, when already read."""
    hf_dir = Path(hf_dir)
    args = args or read_hf_args(hf_dir)
    weight_map = _weight_map(hf_dir)
    files = sorted({hf_dir / name for name in weight_map.values()}) if weight_map else [hf_dir / HF_WEIGHTS_FILE]
    stored = read_headers(files, _name_for_load, fix="download it again")
    for hf_name, file in (weight_map or {}).items():
        dlx_name = _name_for_load(hf_name)
        if dlx_name is not None and (dlx_name not in stored or stored[dlx_name].file.name != file):
            raise UserError(f"{hf_dir / INDEX_FILE} places {hf_name} in {file}, which does not hold it; download again")
    if args.tie_embeddings:  # some exports keep lm_head beside tied embeddings; transformers ignores it too
        stored.pop("output.weight", None)
    return args, stored


def load_hf(hf_dir: str | Path, device: str | torch.device = "cpu") -> Transformer:
    """A Hugging Face Llama folder (single or sharded safetensors) as a dlx model, in the dtype it was saved in."""
    args, stored = read_hf_folder(hf_dir)
    model = empty_model(args, device, stored_dtype(stored))
    load_weights(model, stored, str(hf_dir))
    return model


def import_hf(hf_dir: str | Path, out_dir: str | Path, overwrite: bool = False) -> list[str]:
    """A Hugging Face Llama folder as a dlx model folder, with the tokenizer files it holds kept beside the weights
    (so that `dlx generate` and `model.init_from` find its tokenizer). Returns the tokenizer files kept."""
    out_dir = Path(out_dir)
    if out_dir.exists() and not overwrite:
        raise UserError(f"{out_dir} already exists; choose another output folder, remove it, or give --overwrite")
    model = load_hf(hf_dir)
    with atomic_dir(out_dir, overwrite=overwrite) as tmp:
        write_weights(model, tmp)
        kept = copy_tokenizer_files(Path(hf_dir), tmp)
    return kept


def _name_for_load(hf_name: str) -> str | None:
    """The dlx name; None for derived tensors dlx rebuilds (`rotary_emb.inv_freq` of old exports); any other name is
    kept as it is, so that loading reports it as unexpected instead of dropping a weight silently."""
    if hf_name.endswith("rotary_emb.inv_freq"):
        return None
    return hf_to_dlx_name(hf_name) or hf_name


def _weight_map(hf_dir: Path) -> dict[str, str] | None:
    """The index's tensor → shard map (None for a single model.safetensors); every shard it names must exist."""
    index = hf_dir / INDEX_FILE
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (OSError, ValueError, KeyError, TypeError):
            weight_map = None
        if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
            raise UserError(f"{index} is damaged (no weight_map of tensor → file); download it again")
        for name in sorted(set(weight_map.values())):
            if not (hf_dir / name).is_file():
                raise UserError(f"{index} names the shard {name}, which is missing from {hf_dir}; download it again")
        return weight_map
    if (hf_dir / HF_WEIGHTS_FILE).is_file():
        return None
    others = sorted(p.name for p in hf_dir.glob("*.bin")) + sorted(p.name for p in hf_dir.glob("*.pth"))
    if others:
        raise UserError(
            f"{hf_dir} holds {others[0]} but no safetensors; dlx reads safetensors only (no pickles): re-save it with "
            "transformers' save_pretrained, which writes safetensors"
        )
    raise UserError(f"{hf_dir} holds no weights: neither {HF_WEIGHTS_FILE} nor {INDEX_FILE}")
