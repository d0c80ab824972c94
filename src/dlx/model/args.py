"""`ModelArgs`: the shape of a Llama-3 decoder, with the field names of Meta's reference code."""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Discriminator, Field, Tag, ValidationError, model_validator

_SCALING_CONFIG = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)
_ORIGINAL_LENGTH = AliasChoices("original_max_seq_len", "original_max_position_embeddings")
"""dlx names it after max_seq_len; HF's name is accepted too, so a config.json's rope_scaling pastes as it is."""


class Llama3Scaling(BaseModel):
    """Llama 3.1/3.2 RoPE frequency scaling (Meta's `apply_scaling`, HF's `rope_type: llama3`)."""

    model_config = _SCALING_CONFIG

    rope_type: Literal["llama3"] = "llama3"
    """Left out, llama3 (recipes and model_args.json written before the other kinds existed)."""
    factor: float = Field(8.0, gt=0)
    """How much longer the extended context is than the original one."""
    low_freq_factor: float = Field(1.0, gt=0)
    """Wavelengths longer than original_max_seq_len / low_freq_factor are divided by `factor`."""
    high_freq_factor: float = Field(4.0, gt=0)
    """Wavelengths shorter than original_max_seq_len / high_freq_factor are kept as they are."""
    original_max_seq_len: int = Field(8192, gt=0, validation_alias=_ORIGINAL_LENGTH)
    """The context length the frequencies were first trained for (HF: original_max_position_embeddings)."""

    @model_validator(mode="after")
    def _check_band(self) -> Llama3Scaling:
        if self.high_freq_factor <= self.low_freq_factor:  # the band between would divide by zero or turn inside out
            raise ValueError(
                f"high_freq_factor ({self.high_freq_factor}) must be greater than low_freq_factor "
                f"({self.low_freq_factor})"
            )
        return self


class LinearScaling(BaseModel):
    """Position interpolation (Chen et al. 2023, HF's `rope_type: linear`): every frequency divided by `factor`, as if
    positions were compressed `factor` times into the trained range."""

    model_config = _SCALING_CONFIG

    rope_type: Literal["linear"]
    factor: float = Field(ge=1)
    """How much longer the extended context is than the original one (1: no change)."""


class YarnScaling(BaseModel):
    """YaRN (Peng et al. 2023, HF's `rope_type: yarn`): high frequencies kept, low ones divided by `factor`, a linear
    ramp between (over the dimensions that turn between beta_slow and beta_fast times in original_max_seq_len), and
    cos and sin multiplied by an attention factor that sharpens attention at long range."""

    model_config = _SCALING_CONFIG

    rope_type: Literal["yarn"]
    factor: float = Field(ge=1)
    """How much longer the extended context is than the original one."""
    original_max_seq_len: int = Field(gt=0, validation_alias=_ORIGINAL_LENGTH)
    """The context length the frequencies were first trained for (HF: original_max_position_embeddings)."""
    beta_fast: float = Field(32.0, gt=0)
    """Dimensions turning more than beta_fast times in original_max_seq_len keep their frequency (extrapolated)."""
    beta_slow: float = Field(1.0, gt=0)
    """Dimensions turning fewer than beta_slow times in original_max_seq_len are divided by `factor` (interpolated)."""
    mscale: float | None = Field(None, ge=0)
    """With mscale_all_dim (both nonzero): attention_factor = mscale(factor, mscale) / mscale(factor, mscale_all_dim),
    where mscale(s, m) = 0.1 · m · ln(s) + 1 (DeepSeek's convention); else attention_factor = 0.1 · ln(factor) + 1."""
    mscale_all_dim: float | None = Field(None, ge=0)
    """See mscale."""
    attention_factor: float | None = Field(None, gt=0)
    """cos and sin are multiplied by this; None: computed from factor (and mscale, mscale_all_dim) as above."""
    truncate: bool = True
    """Round the ramp's ends outwards to whole dimensions (the paper's and HF's default)."""

    @model_validator(mode="after")
    def _check_betas(self) -> YarnScaling:
        if self.beta_fast <= self.beta_slow:
            raise ValueError(f"beta_fast ({self.beta_fast}) must be greater than beta_slow ({self.beta_slow})")
        return self


ROPE_TYPES = {"llama3": Llama3Scaling, "linear": LinearScaling, "yarn": YarnScaling}
"""rope_scaling.rope_type → its settings. Not HF's `dynamic` NTK: it rescales only when a sequence at inference runs
past the trained length, so at a fixed training length it is plain RoPE and training on it learns nothing of it."""


def _rope_type(value: Any) -> str | None:
    if isinstance(value, dict):
        return value.get("rope_type", "llama3")
    return getattr(value, "rope_type", None)


RopeScaling = Annotated[
    Annotated[Llama3Scaling, Tag("llama3")]
    | Annotated[LinearScaling, Tag("linear")]
    | Annotated[YarnScaling, Tag("yarn")],
    Discriminator(
        _rope_type,
        custom_error_type="rope_type",
        custom_error_message=(
            f"rope_type must be one of {', '.join(ROPE_TYPES)} (HF's dynamic NTK rescales only at inference past the "
            "trained length: train with yarn or linear instead)"
        ),
    ),
]
"""One of ROPE_TYPES, chosen by its `rope_type` field."""


def describe_rope_scaling(scaling: RopeScaling | None) -> str:
    """`yarn(factor=4.0, original_max_seq_len=8192, ...)`, unset fields left out; `none` for plain RoPE."""
    if scaling is None:
        return "none"
    fields = {key: value for key, value in scaling.model_dump().items() if value is not None and key != "rope_type"}
    return f"{scaling.rope_type}({', '.join(f'{key}={value}' for key, value in fields.items())})"


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
    """RoPE frequency scaling for a longer context: rope_type llama3 (Llama 3.1/3.2's), linear or yarn, with HF's
    fields; None for plain RoPE (Llama 3.0)."""

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
    loc, kind = _without_rope_tag(first["loc"])
    field = ".".join(str(part) for part in loc) or where
    if kind is not None and first["type"] in ("extra_forbidden", "missing"):
        allowed = ", ".join(ROPE_TYPES[kind].model_fields)
        problem = "is not a field of" if first["type"] == "extra_forbidden" else "is required for"
        return f"{where}: {field} {problem} rope_type {kind!r}; rope_scaling with rope_type {kind!r} takes {allowed}"
    if first["type"] == "extra_forbidden":
        return f"{where}: unknown field '{field}'"
    message = first["msg"].removeprefix("Value error, ")
    if loc:
        return f"{where}: field '{field}': {message} (got {first.get('input')!r})"
    return f"{where}: {message}"


def _without_rope_tag(loc: tuple[int | str, ...]) -> tuple[tuple[int | str, ...], str | None]:
    """pydantic places the union's tag in the location (`rope_scaling.yarn.factor`): drop it, and return it."""
    if len(loc) > 1 and loc[0] == "rope_scaling" and loc[1] in ROPE_TYPES:
        return (loc[0], *loc[2:]), str(loc[1])
    return loc, None
