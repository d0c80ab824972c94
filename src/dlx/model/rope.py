"""Real-valued rotary position embeddings.

We rotate the two halves of each head (`rotate_half`, as Hugging Face's Llama does) rather than adjacent pairs through
complex numbers (Meta's reference code). Both are the same rotation up to a fixed permutation of the rows of wq and wk,
so dlx weights map onto HF's `q_proj`/`k_proj` with no permutation, and no complex tensors appear in the graph.
"""

from __future__ import annotations

import math

import torch

from dlx.model.args import LinearScaling, Llama3Scaling, ModelArgs, RopeScaling, YarnScaling


def scale_frequencies(inv_freq: torch.Tensor, scaling: Llama3Scaling) -> torch.Tensor:
    """Llama 3.1 scaling: long wavelengths are slowed by `factor`, short ones kept, the band between interpolated."""
    low_freq_wavelen = scaling.original_max_seq_len / scaling.low_freq_factor
    high_freq_wavelen = scaling.original_max_seq_len / scaling.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / scaling.factor, inv_freq)
    smooth = (scaling.original_max_seq_len / wavelen - scaling.low_freq_factor) / (
        scaling.high_freq_factor - scaling.low_freq_factor
    )
    interpolated = (1 - smooth) * scaled / scaling.factor + smooth * scaled
    in_band = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
    return torch.where(in_band, interpolated, scaled)


def yarn_frequencies(theta: float, dim: int, scaling: YarnScaling, device: torch.device | str | None) -> torch.Tensor:
    """YaRN: each frequency between its own (extrapolation) and its own / factor (interpolation), by a linear ramp
    over the dimensions. Written operation for operation as transformers' `_compute_yarn_parameters`, so the tables are
    bit-identical to HF's."""
    pos_freqs = theta ** (torch.arange(0, dim, 2, device=device).float() / dim)
    extrapolated = 1.0 / pos_freqs
    interpolated = 1.0 / (scaling.factor * pos_freqs)
    low, high = _yarn_ramp_ends(theta, dim, scaling)
    if low == high:
        high += 0.001  # HF's guard against a zero-width ramp
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1).to(device)
    extrapolation_share = 1 - ramp
    return interpolated * (1 - extrapolation_share) + extrapolated * extrapolation_share


def _yarn_ramp_ends(theta: float, dim: int, scaling: YarnScaling) -> tuple[float, float]:
    """The (fractional) dimensions that turn beta_fast and beta_slow times in original_max_seq_len."""

    def dimension_turning(turns: float) -> float:
        return (dim * math.log(scaling.original_max_seq_len / (turns * 2 * math.pi))) / (2 * math.log(theta))

    low, high = dimension_turning(scaling.beta_fast), dimension_turning(scaling.beta_slow)
    if scaling.truncate:
        low, high = math.floor(low), math.ceil(high)
    return max(low, 0), min(high, dim - 1)


def attention_factor(scaling: RopeScaling | None) -> float:
    """What cos and sin are multiplied by (so q·k by its square): YaRN's attention scaling, 1 for the other kinds."""
    if not isinstance(scaling, YarnScaling):
        return 1.0
    if scaling.attention_factor is not None:
        return scaling.attention_factor
    if scaling.mscale and scaling.mscale_all_dim:
        return _yarn_mscale(scaling.factor, scaling.mscale) / _yarn_mscale(scaling.factor, scaling.mscale_all_dim)
    return _yarn_mscale(scaling.factor)


def _yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    """Eq. 21 of the YaRN paper: 0.1 · mscale · ln(factor) + 1 (1 for factor ≤ 1)."""
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def inverse_frequencies(args: ModelArgs, device: torch.device | str | None = None) -> torch.Tensor:
    """(head_dim / 2,) float32: the rotation speed of each pair of dimensions, after args.rope_scaling."""
    dim, scaling = args.head_dim, args.rope_scaling
    if isinstance(scaling, YarnScaling):
        return yarn_frequencies(args.rope_theta, dim, scaling, device)
    inv_freq = 1.0 / (args.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64, device=device).float() / dim))
    if isinstance(scaling, LinearScaling):
        return inv_freq / scaling.factor
    if isinstance(scaling, Llama3Scaling):
        return scale_frequencies(inv_freq, scaling)
    return inv_freq


def rope_tables(args: ModelArgs, device: torch.device | str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin tables, each (max_seq_len, head_dim), in float32, times YaRN's attention factor where it applies
    (as HF scales its cos and sin)."""
    inv_freq = inverse_frequencies(args, device)
    positions = torch.arange(args.max_seq_len, device=device, dtype=torch.float32)
    freqs = torch.outer(positions, inv_freq)  # (max_seq_len, head_dim / 2)
    angles = torch.cat((freqs, freqs), dim=-1)  # (max_seq_len, head_dim)
    scale = attention_factor(args.rope_scaling)
    if scale == 1.0:
        return angles.cos(), angles.sin()
    return angles.cos() * scale, angles.sin() * scale


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    first, second = x.chunk(2, dim=-1)
    return torch.cat((-second, first), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: (B, T, n_heads, head_dim); cos, sin: (T, head_dim), or (B, T, head_dim) for per-sequence positions.
    Computed in the tables' dtype (the model casts them to the compute dtype once per forward); x's dtype out."""
    cos = cos.unsqueeze(-2)  # (T, 1, head_dim) or (B, T, 1, head_dim): broadcast over the heads
    sin = sin.unsqueeze(-2)
    xc = x.to(cos.dtype)
    return (xc * cos + rotate_half(xc) * sin).to(x.dtype)
