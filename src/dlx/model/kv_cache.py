"""A preallocated key/value cache for one attention layer, used by generation."""

from __future__ import annotations

import torch


class KVCache:
    def __init__(self, batch: int, max_len: int, n_kv_heads: int, head_dim: int, dtype: torch.dtype, device):
        shape = (batch, max_len, n_kv_heads, head_dim)
        self.keys = torch.zeros(shape, dtype=dtype, device=device)
        self.values = torch.zeros(shape, dtype=dtype, device=device)

    def update(self, k: torch.Tensor, v: torch.Tensor, start_pos: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Store k, v (B, T, n_kv_heads, head_dim) at start_pos; return every key and value up to start_pos + T."""
        end = start_pos + k.shape[1]
        self.keys[:, start_pos:end] = k
        self.values[:, start_pos:end] = v
        return self.keys[:, :end], self.values[:, :end]
