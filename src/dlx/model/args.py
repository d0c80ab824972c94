"""`ModelArgs`: the shape of a Llama-3 decoder, with the field names of Meta's reference code."""

from __future__ import annotations

import math

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator


class RopeScaling(BaseModel):
    """Llama 3.1/3.2 RoPE frequency scaling (Meta's `apply_scaling`, HF's `rope_type: llama3`)."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    factor: float = Field(8.0, gt=0)
    """How much longer the extended context is than the original one."""
    low_freq_factor: float = Field(1.0, gt=0)
    """Wavelengths longer than original_max_seq_len / low_freq_factor are divided by `factor`."""
    high_freq_factor: float = Field(4.0, gt=0)
    """Wavelengths shorter than original_max_seq_len / high_freq_factor are kept as they are."""
    original_max_seq_len: int = Field(8192, gt=0)
    """The context length the frequencies were first trained for."""


class ModelArgs(BaseModel):
    """A Llama-3 decoder's shape. `ModelArgs(**params_json)` accepts Meta's field names."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    dim: int = Field(4096, gt=0)
    """Width of the residual stream (HF: hidden_size)."""
    n_layers: int = Field(32, gt=0)
    """Number of transformer blocks."""
    n_heads: int = Field(32, gt=0)
    """Number of query heads; head_dim = dim // n_heads."""
    n_kv_heads: int | None = Field(None, gt=0)
    """Number of key/value heads for grouped-query attention; None means n_heads (plain multi-head attention)."""
    vocab_size: int = Field(128256, gt=0)
    """Rows of the token embedding and of the output projection."""
    multiple_of: int = Field(256, gt=0)
    """The FFN hidden size is rounded up to a multiple of this."""
    ffn_dim_multiplier: float | None = Field(None, gt=0)
    """Scales the FFN hidden size 2/3 · 4 · dim before rounding; None means 1."""
    norm_eps: float = Field(1e-5, gt=0)
    """Epsilon of every RMSNorm."""
    rope_theta: float = Field(500000.0, gt=0)
    """Base of the RoPE frequencies."""
    max_seq_len: int = Field(2048, gt=0)
    """Longest sequence the RoPE tables and the KV cache are built for."""
    tie_embeddings: bool = False
    """Share the token embedding with the output projection (Llama 3.2 1B/3B do; Meta's 8B does not)."""
    rope_scaling: RopeScaling | None = None
    """Llama 3.1/3.2 RoPE scaling; None for Llama 3.0."""

    @model_validator(mode="after")
    def _check_heads(self) -> ModelArgs:
        if self.dim % self.n_heads:
            raise ValueError(f"n_heads ({self.n_heads}) must divide dim ({self.dim})")
        if self.head_dim % 2:
            raise ValueError(f"head_dim = dim / n_heads = {self.head_dim} must be even for RoPE")
        if self.n_heads % self.kv_heads:
            raise ValueError(f"n_kv_heads ({self.kv_heads}) must divide n_heads ({self.n_heads})")
        return self

    @property
    def kv_heads(self) -> int:
        return self.n_kv_heads or self.n_heads

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    @property
    def ffn_hidden_dim(self) -> int:
        """Meta's rule: 2/3 · 4 · dim, times ffn_dim_multiplier, rounded up to a multiple of multiple_of."""
        hidden = int(2 * 4 * self.dim / 3)
        if self.ffn_dim_multiplier is not None:
            hidden = int(self.ffn_dim_multiplier * hidden)
        return self.multiple_of * math.ceil(hidden / self.multiple_of)


def describe_validation_error(error: ValidationError, where: str) -> str:
    """One line naming the first offending field and what is allowed."""
    first = error.errors()[0]
    field = ".".join(str(part) for part in first["loc"]) or where
    if first["type"] == "extra_forbidden":
        return f"{where}: unknown field '{field}'"
    message = first["msg"].removeprefix("Value error, ")
    if first["loc"]:
        return f"{where}: field '{field}': {message} (got {first.get('input')!r})"
    return f"{where}: {message}"
