"""Named model shapes, and `resolve_model_args`: preset or file, then field-by-field overrides."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from dlx.errors import UserError
from dlx.model.args import ModelArgs, describe_validation_error

_LLAMA3 = {"vocab_size": 128256, "norm_eps": 1e-5, "rope_theta": 500000.0}
_LLAMA32_SCALING = {"factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_seq_len": 8192}

PRESETS: dict[str, dict[str, Any]] = {
    # 135,529,984 parameters: one block at dim 512; the 128k-token embedding and output hold almost all of them.
    "seed-135m": {
        **_LLAMA3,
        "dim": 512,
        "n_layers": 1,
        "n_heads": 2,
        "n_kv_heads": 2,
        "multiple_of": 1024,
        "ffn_dim_multiplier": 1.3,
        "max_seq_len": 150,
    },
    # 164,897,280 parameters: eight blocks at dim 512 with one attention head, the same embedding and output.
    "seed-165m": {
        **_LLAMA3,
        "dim": 512,
        "n_layers": 8,
        "n_heads": 1,
        "n_kv_heads": 1,
        "multiple_of": 1024,
        "ffn_dim_multiplier": 1.3,
        "max_seq_len": 150,
    },
    # Meta's params.json shapes. max_seq_len is the training context dlx builds tables for, not the 128K the
    # scaled RoPE admits; raise it per run when needed.
    "llama3.2-1b": {
        **_LLAMA3,
        "dim": 2048,
        "n_layers": 16,
        "n_heads": 32,
        "n_kv_heads": 8,
        "multiple_of": 256,
        "ffn_dim_multiplier": 1.5,
        "max_seq_len": 8192,
        "tie_embeddings": True,
        "rope_scaling": _LLAMA32_SCALING,
    },
    "llama3.2-3b": {
        **_LLAMA3,
        "dim": 3072,
        "n_layers": 28,
        "n_heads": 24,
        "n_kv_heads": 8,
        "multiple_of": 256,
        "ffn_dim_multiplier": 1.0,
        "max_seq_len": 8192,
        "tie_embeddings": True,
        "rope_scaling": _LLAMA32_SCALING,
    },
    "llama3-8b": {
        **_LLAMA3,
        "dim": 4096,
        "n_layers": 32,
        "n_heads": 32,
        "n_kv_heads": 8,
        "multiple_of": 1024,
        "ffn_dim_multiplier": 1.3,
        "max_seq_len": 8192,
    },
    # A GPT-2-small-sized Llama (about 126M parameters) for single-GPU benchmarks.
    "small-125m": {
        **_LLAMA3,
        "dim": 768,
        "n_layers": 12,
        "n_heads": 12,
        "n_kv_heads": 4,
        "vocab_size": 32768,
        "multiple_of": 256,
        "max_seq_len": 2048,
    },
    # Sized for a 2-core CPU: the embedded demo (about 6M parameters with an 8K vocabulary).
    "demo": {
        **_LLAMA3,
        "dim": 256,
        "n_layers": 4,
        "n_heads": 4,
        "n_kv_heads": 2,
        "vocab_size": 8192,
        "multiple_of": 16,
        "rope_theta": 10000.0,
        "max_seq_len": 256,
    },
    # The smallest useful shape, for tests.
    "debug": {
        **_LLAMA3,
        "dim": 64,
        "n_layers": 2,
        "n_heads": 4,
        "n_kv_heads": 2,
        "vocab_size": 512,
        "multiple_of": 16,
        "rope_theta": 10000.0,
        "max_seq_len": 128,
    },
}


def load_args_file(path: Path) -> dict[str, Any]:
    """ModelArgs fields from a YAML or JSON file (Meta's params.json works), a Hugging Face Llama config.json, or a
    folder holding one (a Hugging Face model folder) or a dlx model_args.json (a dlx model folder or checkpoint)."""
    if path.is_dir():
        found = [path / name for name in ("config.json", "model_args.json") if (path / name).is_file()]
        if not found:
            raise UserError(f"{path} holds neither a Hugging Face config.json nor a dlx model_args.json")
        path = found[0]
    data = _read_mapping(path)
    if "model_type" in data or "architectures" in data:  # a Hugging Face config.json
        from dlx.model.hf import args_from_hf_config  # hf imports this module

        return args_from_hf_config(data, str(path)).model_dump()
    return data


def _read_mapping(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text()
    except OSError as e:
        raise UserError(f"cannot read model file {path}: {e.strerror}") from None
    try:
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as e:
        raise UserError(f"model file {path} is not valid {path.suffix.lstrip('.') or 'YAML'}: {e}") from None
    if not isinstance(data, dict):
        raise UserError(f"model file {path} must hold a mapping of ModelArgs fields")
    return data


def resolve_model_args(preset_or_file: str | None = None, **overrides: Any) -> ModelArgs:
    """A preset name or a YAML/JSON file of ModelArgs, then overrides, validated into ModelArgs."""
    fields: dict[str, Any] = {}
    where = "model"
    if preset_or_file:
        path = Path(preset_or_file)
        if preset_or_file in PRESETS:
            fields, where = dict(PRESETS[preset_or_file]), f"preset '{preset_or_file}'"
        elif path.suffix in (".yaml", ".yml", ".json") or path.exists():
            fields, where = load_args_file(path), str(path)
        else:
            raise UserError(
                f"unknown model preset '{preset_or_file}'; choose one of {', '.join(PRESETS)} or a YAML/JSON file"
            )
    fields.update(overrides)
    try:
        return ModelArgs(**fields)
    except ValidationError as e:
        raise UserError(describe_validation_error(e, where)) from None
