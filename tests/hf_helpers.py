"""Shared by the init_from and HF export tests: Hugging Face folders written by transformers itself, run options
without a preset (the shape comes from the weights), and a model's next-token loss on a batch."""

from __future__ import annotations

from pathlib import Path

import torch

from train_helpers import TINY

BASE = [arg for pair in zip(TINY[::2], TINY[1::2], strict=True) if pair[0] != "--model.preset" for arg in pair]
"""TINY without `--model.preset`: with model.init_from the shape comes from the weights."""
SHAPE = {"hidden_size": 64, "intermediate_size": 200, "num_hidden_layers": 2, "num_attention_heads": 4}


def write_hf_llama(
    folder: Path,
    vocab_size: int,
    tokenizer: Path | None = None,
    shard_size: str | None = None,
    tie: bool = False,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
    eos_token: str = "<|endoftext|>",
    rope_scaling: dict | None = None,
):
    """A random LlamaForCausalLM saved by `save_pretrained` (sharded when `shard_size` is given, e.g. "100KB"), with
    `tokenizer` (a tokenizer.json) re-saved beside it by transformers' own tokenizer class, and config.json's
    `rope_scaling` (HF's names) when given. Returns the HF model."""
    import transformers

    config = transformers.LlamaConfig(
        vocab_size=vocab_size,
        num_key_value_heads=2,
        max_position_embeddings=128,
        rope_theta=10000.0,
        tie_word_embeddings=tie,
        rope_scaling=rope_scaling,
        **SHAPE,
    )
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(config).to(dtype).eval()
    model.save_pretrained(folder, **({"max_shard_size": shard_size} if shard_size else {}))
    if tokenizer is not None:
        hf_tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_file=str(tokenizer), eos_token=eos_token)
        hf_tokenizer.save_pretrained(folder)
    return model


def next_token_loss(logits: torch.Tensor, targets: torch.Tensor) -> float:
    """Mean cross-entropy of logits (B, T, vocab) against targets (B, T)."""
    return torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), targets.flatten()).item()


LLAMA32_1B_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 128000,
    "eos_token_id": 128001,
    "head_dim": 64,
    "hidden_act": "silu",
    "hidden_size": 2048,
    "initializer_range": 0.02,
    "intermediate_size": 8192,
    "max_position_embeddings": 131072,
    "mlp_bias": False,
    "model_type": "llama",
    "num_attention_heads": 32,
    "num_hidden_layers": 16,
    "num_key_value_heads": 8,
    "pretraining_tp": 1,
    "rms_norm_eps": 1e-05,
    "rope_scaling": {
        "factor": 32.0,
        "high_freq_factor": 4.0,
        "low_freq_factor": 1.0,
        "original_max_position_embeddings": 8192,
        "rope_type": "llama3",
    },
    "rope_theta": 500000.0,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.45.0.dev0",
    "use_cache": True,
    "vocab_size": 128256,
}
"""config.json of the published meta-llama/Llama-3.2-1B (its shape and special ids; no weights)."""
