"""Which attention kernel runs the causal attention of a training shape: measured, not assumed (`choose_attention`).

The kernels (`KERNELS`) are SDPA's four, as PyTorch names them (cuDNN, FlashAttention-2, memory-efficient, math), and
`flex`: `flex_attention` with a causal block mask, compiled. `auto` times the CUDA contenders (`CONTENDERS`; math is
left out: it stores the T×T scores and is never the fastest) forward and backward through the model's own attention
call (`causal_attention`, or the flex path) on random q, k, v of the run's shape and compute dtype, and takes the
fastest; a kernel that refuses the shape (flash and cuDNN in fp32, cuDNN on older GPUs, ...) is recorded as refused,
not as slow. A named kernel is timed the same way, so that one it cannot run stops the run before step 1. On a CPU
`auto` has nothing to choose: SDPA runs its own kernel, named by SDPA's own dispatch choice. A choice is applied by
`dlx.device.prefer_sdpa_kernel` (SDPA) and `Transformer.causal_kernel` (flex); its `header` is the line a run or a
benchmark prints.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from dlx import device as dev
from dlx import faults
from dlx.errors import UserError

KERNELS = ("cudnn", "flash", "efficient", "math", "flex")
"""The kernels train.attention may name: SDPA's cuDNN, FlashAttention-2, memory-efficient and math; flex_attention."""
CONTENDERS = ("cudnn", "flash", "efficient", "flex")
"""What `auto` times on CUDA."""
SETTINGS = ("auto", "default", *KERNELS)
"""train.attention: `auto` (the fastest, measured), `default` (PyTorch's own choice per call) or one kernel."""

Timer = Callable[[str], "float | None"]
"""A kernel's name → forward + backward milliseconds at the shape, None where it refuses the shape."""


@dataclass(frozen=True)
class AttentionShape:
    """One attention call of a training step: q (B, H, T, D), k and v (B, H_kv, T, D)."""

    batch: int
    n_heads: int
    n_kv_heads: int
    seq_len: int
    head_dim: int
    dtype: torch.dtype = torch.bfloat16

    def __str__(self) -> str:
        dims = (self.batch, self.n_heads, self.n_kv_heads, self.seq_len, self.head_dim)
        return f"(B, H, H_kv, T, D) = {dims} in {str(self.dtype).removeprefix('torch.')}"


@dataclass
class AttentionChoice:
    kernel: str | None
    """What is applied: cudnn, flash, efficient, math or flex; None leaves SDPA's own choice (default; auto on CPU)."""
    setting: str = "auto"
    """train.attention as written."""
    ms: dict[str, float | None] = field(default_factory=dict)
    """Forward + backward milliseconds per kernel timed (None: it refused the shape); empty when none was timed."""
    shape: AttentionShape | None = None
    cpu_kernel: str | None = None
    """On a CPU, the aten kernel SDPA runs under this choice (as the profiler saw it)."""

    @property
    def header(self) -> str:
        shape = f" at {self.shape}" if self.shape is not None else ""
        if self.setting == "auto" and len(self.ms) > 1:
            timings = ", ".join(f"{name} {'refused' if ms is None else f'{ms:.2f} ms'}" for name, ms in self.ms.items())
            return f"attention: {self.kernel}, the fastest fwd+bwd{shape}: {timings} (train.attention auto)"
        ran = f"; SDPA runs {self.cpu_kernel}" if self.cpu_kernel else ""
        if self.kernel is None:
            what = "CPU, no other kernel to choose from" if self.setting == "auto" else "PyTorch's own choice per call"
            return f"attention: {what}{ran} (train.attention {self.setting})"
        timed = self.ms.get(self.kernel)
        measured = f", fwd+bwd {timed:.2f} ms{shape}" if timed is not None else ""
        return f"attention: {self.kernel} (train.attention){measured}{ran}"


def choose_attention(
    setting: str, shape: AttentionShape, device: torch.device, timer: Timer | None = None
) -> AttentionChoice:
    """train.attention `setting` for `shape` on `device`: auto's fastest, a named kernel that runs the shape, or
    PyTorch's own choice (default; auto on a CPU). `timer` times one kernel (default `kernel_timer`, 10 passes);
    a named kernel that refuses the shape is a UserError naming the fix."""
    faults.raise_point("attention_choice")
    timer = timer or kernel_timer(shape, device, repeats=10 if setting == "auto" else 3)
    if setting == "default" or (setting == "auto" and device.type != "cuda"):
        return AttentionChoice(None, setting, {}, shape, cpu_sdpa_kernel() if device.type == "cpu" else None)
    if setting == "auto":
        ms = {name: timer(name) for name in CONTENDERS}
        return AttentionChoice(fastest(ms, shape, device), setting, ms, shape)
    if setting not in KERNELS:
        raise UserError(f"train.attention {setting!r}: choose one of {', '.join(SETTINGS)}")
    ms = {setting: timer(setting)}
    if ms[setting] is None:
        raise UserError(
            f"train.attention {setting}: the {setting} kernel does not run forward and backward at {shape} on "
            f"{dev.device_name(device)}; set train.attention auto (or default)"
        )
    return AttentionChoice(setting, setting, ms, shape, cpu_sdpa_kernel(setting) if device.type == "cpu" else None)


def fastest(ms: dict[str, float | None], shape: AttentionShape, device: torch.device) -> str:
    """The kernel with the fewest milliseconds; a UserError when every one refused the shape."""
    timed = {name: value for name, value in ms.items() if value is not None}
    if not timed:
        raise UserError(
            f"train.attention auto: none of {', '.join(ms)} ran forward and backward at {shape} on "
            f"{dev.device_name(device)}; set train.attention default (PyTorch's own choice, math as the last resort)"
        )
    return min(timed, key=timed.__getitem__)


CPU_SDPA_KERNELS = {0: "scaled_dot_product_attention_math", 1: "scaled_dot_product_flash_attention_for_cpu"}
"""SDPBackend index → the aten kernel a CPU runs for it (what torch.profiler records, less its `aten::_`)."""


def cpu_sdpa_kernel(kernel: str | None = None) -> str:
    """The aten kernel behind a causal grouped-query SDPA call on this CPU under `dlx.device.prefer_sdpa_kernel(
    kernel)` (None: PyTorch's own choice), asked of `torch._fused_sdp_choice`, the function SDPA's dispatch asks;
    tests/integration/test_attention_choice.py checks the answer against what the profiler sees run."""
    q, k = torch.randn(1, 4, 32, 16), torch.randn(1, 2, 32, 16)
    with dev.prefer_sdpa_kernel(kernel):
        choice = torch._fused_sdp_choice(q, k, k, is_causal=True, enable_gqa=True)
    return CPU_SDPA_KERNELS.get(choice, f"SDPA backend {choice}")


def kernel_timer(shape: AttentionShape, device: torch.device, repeats: int = 10) -> Timer:
    """Times a kernel by name on random q, k, v of `shape` (made once, on first use)."""
    qkv: list[torch.Tensor] = []

    def timer(name: str) -> float | None:
        if not qkv:
            qkv.extend(_random_qkv(shape, device))
        return _time_ms(_kernel(name), *qkv, device=device, repeats=repeats)

    return timer


def causal_flex(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """q (B, T, H, D), k and v (B, T, H_kv, D) → (B, H, T, D): the model's flex path (`masked_attention` with the
    causal block mask, compiled on CUDA)."""
    from dlx.model.document_mask import causal_block_mask, masked_attention

    return masked_attention(*(t.transpose(1, 2) for t in (q, k, v)), causal_block_mask(q.shape[1], q.device))


def _kernel(name: str) -> Callable:
    """The model's own attention call under kernel `name` alone: `causal_attention` (which shares kv heads inside
    SDPA or repeats them, as the model does for this dtype, device and kernel) or `causal_flex`."""
    if name == "flex":
        return causal_flex
    from dlx.model.llama import causal_attention

    def run(q, k, v):
        with dev.prefer_sdpa_kernel(name, fallback=False):
            return causal_attention(q, k, v, name)

    return run


def _random_qkv(shape: AttentionShape, device: torch.device) -> list[torch.Tensor]:
    """q, k, v as the model's attention takes them, (B, T, heads, D)."""
    sizes = [(shape.batch, shape.seq_len, heads, shape.head_dim) for heads in (shape.n_heads, *[shape.n_kv_heads] * 2)]
    return [torch.randn(s, device=device, dtype=shape.dtype, requires_grad=True) for s in sizes]


def _time_ms(run: Callable, q, k, v, device: torch.device, repeats: int) -> float | None:
    """Mean milliseconds of `repeats` forward + backward passes after one untimed warm-up (compiles flex); None
    where the kernel refuses the shape (no kernel, no backward on this device, out of memory)."""
    try:
        run(q, k, v).sum().backward()  # warm-up
    except (RuntimeError, NotImplementedError):  # torch.OutOfMemoryError and Dynamo's errors are RuntimeErrors
        return None
    dev.synchronize(device)
    start = time.perf_counter()
    for _ in range(repeats):
        run(q, k, v).sum().backward()
    dev.synchronize(device)
    return (time.perf_counter() - start) * 1e3 / repeats
