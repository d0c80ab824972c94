"""Real-valued rotary position embeddings.

We rotate the two halves of each head (`rotate_half`, as Hugging Face's Llama does) rather than adjacent pairs through
complex numbers (Meta's reference code). Both are the same rotation up to a fixed permutation of the rows of wq and wk,
so dlx weights map onto HF's `q_proj`/`k_proj` with no permutation, and no complex tensors appear in the graph.
"""

from __future__ import annotations

import math

import torch

from dlx.model.args import ModelArgs, RopeScaling


def scale_frequencies(inv_freq: torch.Tensor, scaling: RopeScaling) -> torch.Tensor:
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


def rope_tables(args: ModelArgs, device: torch.device | str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin tables, each (max_seq_len, head_dim), in float32."""
    dim = args.head_dim
    inv_freq = 1.0 / (args.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64, device=device).float() / dim))
    if args.rope_scaling is not None:
        inv_freq = scale_frequencies(inv_freq, args.rope_scaling)
    positions = torch.arange(args.max_seq_len, device=device, dtype=torch.float32)
    freqs = torch.outer(positions, inv_freq)  # (max_seq_len, head_dim / 2)
    angles = torch.cat((freqs, freqs), dim=-1)  # (max_seq_len, head_dim)
    return angles.cos(), angles.sin()


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
