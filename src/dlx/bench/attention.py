"""Which attention kernel is fastest for a shape: measured, not assumed (`choose_attention_backend`).

On CUDA the contenders are SDPA's cuDNN kernel, SDPA's FlashAttention-2 kernel and a compiled `flex_attention` with a
causal block mask, each timed forward and backward on random bf16 q, k, v of the training shape (causal, grouped
kv heads). A kernel that refuses the shape (cuDNN on older GPUs, flash on fp32, ...) is recorded as unavailable,
not as slow. On a CPU there is no choice to make: SDPA runs its own kernel, named by what the profiler saw run.
The result's `header` is the one line a benchmark prints above its table.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from dlx import device as dev


@dataclass
class AttentionChoice:
    backend: str
    """cudnn, flash or flex on CUDA; on a CPU the aten kernel SDPA ran."""
    ms: dict[str, float | None] = field(default_factory=dict)
    """Forward + backward milliseconds per contender (None: it refused the shape)."""
    shape: tuple[int, ...] = ()
    """(batch, n_heads, n_kv_heads, seq_len, head_dim)."""

    @property
    def header(self) -> str:
        if not self.ms:
            return f"attention: CPU, SDPA ran {self.backend} (no other kernel to choose from)"
        timings = ", ".join(f"{name} {'refused' if ms is None else f'{ms:.2f} ms'}" for name, ms in self.ms.items())
        return f"attention: {self.backend}, the fastest fwd+bwd at (B, H, H_kv, T, D) = {self.shape}: {timings}"


def choose_attention_backend(
    batch: int, n_heads: int, n_kv_heads: int, seq_len: int, head_dim: int, device: torch.device, repeats: int = 10
) -> AttentionChoice:
    shape = (batch, n_heads, n_kv_heads, seq_len, head_dim)
    if device.type != "cuda":
        return AttentionChoice(cpu_sdpa_kernel(), {}, shape)
    q, k, v = _random_qkv(shape, device)
    ms = {name: _time_ms(run, q, k, v, device, repeats) for name, run in _contenders().items()}
    timed = {name: value for name, value in ms.items() if value is not None}
    if not timed:
        raise RuntimeError(f"no attention kernel ran the shape {shape} on {dev.device_name(device)}")
    return AttentionChoice(min(timed, key=timed.__getitem__), ms, shape)


def cpu_sdpa_kernel() -> str:
    """The aten kernel behind a causal grouped-query SDPA call on this CPU, as the profiler records it."""
    from torch.profiler import profile

    q, k = torch.randn(1, 4, 32, 16), torch.randn(1, 2, 32, 16)
    with profile() as prof:
        F.scaled_dot_product_attention(q, k, k, is_causal=True, enable_gqa=True)
    kernels = [e.key for e in prof.key_averages() if e.key.startswith("aten::_scaled_dot_product")]
    return kernels[0].removeprefix("aten::_") if kernels else "scaled_dot_product_attention (math)"


def _random_qkv(shape: tuple[int, ...], device: torch.device) -> list[torch.Tensor]:
    batch, n_heads, n_kv_heads, seq_len, head_dim = shape
    sizes = [(batch, n_heads, seq_len, head_dim), *[(batch, n_kv_heads, seq_len, head_dim)] * 2]
    return [torch.randn(s, device=device, dtype=torch.bfloat16, requires_grad=True) for s in sizes]


def _contenders() -> dict[str, Callable]:
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    def sdpa(backend: SDPBackend) -> Callable:
        def run(q, k, v):
            with sdpa_kernel([backend]):
                return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)

        return run

    compiled_flex = torch.compile(flex_attention, dynamic=False, fullgraph=True)
    masks: dict[int, object] = {}  # one causal block mask per length, built before the timed passes

    def causal(b, h, q_idx, kv_idx):
        return q_idx >= kv_idx

    def flex(q, k, v):
        seq_len = q.shape[2]
        if seq_len not in masks:
            masks[seq_len] = create_block_mask(causal, None, None, seq_len, seq_len, device=q.device)
        return compiled_flex(q, k, v, block_mask=masks[seq_len], enable_gqa=True)

    return {"cudnn": sdpa(SDPBackend.CUDNN_ATTENTION), "flash": sdpa(SDPBackend.FLASH_ATTENTION), "flex": flex}


def _time_ms(run: Callable, q, k, v, device: torch.device, repeats: int) -> float | None:
    """Mean milliseconds of `repeats` forward + backward passes after one untimed warm-up (compiles flex)."""
    try:
        run(q, k, v).sum().backward()  # warm-up; raises where the kernel refuses the shape
    except RuntimeError:
        return None
    dev.synchronize(device)
    start, end = dev.timing_event(device), dev.timing_event(device)
    start.record()
    for _ in range(repeats):
        run(q, k, v).sum().backward()
    end.record()
    dev.synchronize(device)
    return dev.event_elapsed_s(start, end) * 1e3 / repeats
