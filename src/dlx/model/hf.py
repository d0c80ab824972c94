"""Hugging Face Llama format, both ways, without importing transformers.

`save_hf` writes `config.json` + `model.safetensors` that `LlamaForCausalLM.from_pretrained` loads; `load_hf` reads
such a folder (one file, or shards with `model.safetensors.index.json`) into a dlx `Transformer`. dlx's RoPE rotates
halves like HF's, so q/k weights need no permutation: the conversion is a renaming.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from pydantic import ValidationError
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from dlx.atomic import atomic_dir
from dlx.errors import UserError
from dlx.model.args import ModelArgs
from dlx.model.io import model_from_state_dict, unique_state_dict
from dlx.model.llama import Transformer
from dlx.model.presets import describe_validation_error

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
    }
    if args.rope_scaling is not None:
        s = args.rope_scaling
        config["rope_scaling"] = {
            "rope_type": "llama3",
            "factor": s.factor,
            "low_freq_factor": s.low_freq_factor,
            "high_freq_factor": s.high_freq_factor,
            "original_max_position_embeddings": s.original_max_seq_len,
        }
    return config


def args_from_hf_config(config: dict[str, Any], source: str = "config.json") -> ModelArgs:
    architectures = config.get("architectures") or []
    if config.get("model_type") != "llama" or (architectures and "LlamaForCausalLM" not in architectures):
        raise UserError(
            f"{source}: model_type {config.get('model_type')!r} / architectures {architectures} is not a Llama model; "
            "dlx imports LlamaForCausalLM folders only"
        )
    dim, n_heads = config["hidden_size"], config["num_attention_heads"]
    if config.get("head_dim") not in (None, dim // n_heads):
        raise UserError(f"{source}: head_dim {config['head_dim']} != hidden_size / num_attention_heads; not supported")
    # Meta's rule cannot express every intermediate_size; this choice reproduces it exactly:
    # int(base · m) lands on intermediate or one below it, and rounding up to a multiple of intermediate gives it back.
    intermediate = config["intermediate_size"]
    fields: dict[str, Any] = {
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
    try:
        args = ModelArgs(**fields)
    except ValidationError as e:
        raise UserError(describe_validation_error(e, source)) from None
    assert args.ffn_hidden_dim == intermediate, (args.ffn_hidden_dim, intermediate)
    return args


def _rope_theta(config: dict[str, Any]) -> float:
    params = config.get("rope_parameters") or {}
    return float(config.get("rope_theta") or params.get("rope_theta") or 10000.0)


def _rope_scaling(config: dict[str, Any], source: str) -> dict[str, Any] | None:
    scaling = config.get("rope_scaling") or config.get("rope_parameters")
    if not scaling or scaling.get("rope_type", scaling.get("type")) in (None, "default"):
        return None
    if scaling.get("rope_type", scaling.get("type")) != "llama3":
        raise UserError(f"{source}: rope_scaling type {scaling.get('rope_type')!r} is not supported (only 'llama3')")
    return {
        "factor": scaling["factor"],
        "low_freq_factor": scaling["low_freq_factor"],
        "high_freq_factor": scaling["high_freq_factor"],
        "original_max_seq_len": scaling["original_max_position_embeddings"],
    }


def save_hf(model: Transformer, out_dir: str | Path, overwrite: bool = False) -> Path:
    """Write `config.json` and `model.safetensors` for `transformers.LlamaForCausalLM.from_pretrained`."""
    out_dir = Path(out_dir)
    if out_dir.exists() and not overwrite:
        raise UserError(f"{out_dir} already exists; choose another output folder or remove it")
    state = {dlx_to_hf_name(name): t for name, t in unique_state_dict(model).items()}
    dtype = next(model.parameters()).dtype
    with atomic_dir(out_dir, overwrite=overwrite) as tmp:
        save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        (tmp / "config.json").write_text(json.dumps(hf_config(model.args, dtype), indent=2) + "\n")
    return out_dir


def load_hf(hf_dir: str | Path, device: str | torch.device = "cpu") -> Transformer:
    """Read a Hugging Face Llama folder (single or sharded safetensors) into a dlx model."""
    hf_dir = Path(hf_dir)
    config_file = hf_dir / "config.json"
    if not config_file.is_file():
        raise UserError(f"{hf_dir} is not a Hugging Face model folder: config.json is missing")
    try:
        config = json.loads(config_file.read_text())
    except json.JSONDecodeError as e:
        raise UserError(f"{config_file} is not valid JSON: {e}") from None
    args = args_from_hf_config(config, str(config_file))
    state: dict[str, torch.Tensor] = {}
    for file in _weight_files(hf_dir):
        try:
            tensors = load_file(str(file), device=str(device))
        except (SafetensorError, OSError) as e:
            raise UserError(f"cannot read {file}: {e}") from None
        for name, tensor in tensors.items():
            dlx_name = hf_to_dlx_name(name)
            if dlx_name is not None:
                state[dlx_name] = tensor
    return model_from_state_dict(args, state, device)


def _weight_files(hf_dir: Path) -> list[Path]:
    index = hf_dir / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text())["weight_map"]
        return [hf_dir / name for name in sorted(set(weight_map.values()))]
    single = hf_dir / "model.safetensors"
    if single.is_file():
        return [single]
    raise UserError(f"{hf_dir} holds no model.safetensors nor model.safetensors.index.json (only safetensors is read)")
