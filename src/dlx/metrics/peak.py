"""Peak dense matmul throughput by device and dtype, for MFU.

GPU figures are the vendors' dense (no sparsity) tensor-core numbers for bf16/fp16, and the plain FP32 (non-tensor-core)
numbers for fp32, since PyTorch computes fp32 matmuls in fp32 unless TF32 is allowed (then the tf32 entry is used).
On a CPU there is no trustworthy datasheet figure, so dlx measures one: the best of a few large matmuls in the dtype,
timed after a warm-up (`measure_cpu_peak`). An unknown GPU gets no peak, and MFU is then omitted with the reason.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass

import torch

# TFLOPS, dense. Keys are matched as substrings of torch.cuda.get_device_name(), most specific first.
GPU_PEAK_TFLOPS: dict[str, dict[str, float]] = {
    "H200": {"bf16": 989.4, "fp16": 989.4, "tf32": 494.7, "fp32": 66.9},
    "H100 PCIe": {"bf16": 756.0, "fp16": 756.0, "tf32": 378.0, "fp32": 51.2},
    "H100": {"bf16": 989.4, "fp16": 989.4, "tf32": 494.7, "fp32": 66.9},
    "B200": {"bf16": 2250.0, "fp16": 2250.0, "tf32": 1100.0, "fp32": 80.0},
    "A100": {"bf16": 312.0, "fp16": 312.0, "tf32": 156.0, "fp32": 19.5},
    "L4": {"bf16": 121.0, "fp16": 121.0, "tf32": 60.0, "fp32": 30.3},
    "V100": {"fp16": 125.0, "fp32": 15.7},
}


@dataclass(frozen=True)
class Peak:
    tflops: float | None
    """Peak TFLOPS for the device and dtype, or None when unknown."""
    source: str
    """Where the figure comes from (datasheet entry, CPU probe), or why there is none."""


def gpu_peak(device_name: str, precision: str, tf32_allowed: bool = False) -> Peak:
    key = "tf32" if precision == "fp32" and tf32_allowed else precision
    for name, table in GPU_PEAK_TFLOPS.items():
        if name in device_name:
            if key in table:
                return Peak(table[key], f"datasheet {name} {key} dense")
            return Peak(None, f"{name} has no {key} tensor cores in the peak table; MFU omitted")
    return Peak(None, f"'{device_name}' is not in dlx's peak table (metrics/peak.py); MFU omitted")


@functools.cache
def measure_cpu_peak(precision: str, size: int = 1024, repeats: int = 20) -> Peak:
    """Best achieved TFLOPS of a (size × size) @ (size × size) matmul in the precision's dtype, on all threads.
    Best of 20 (about 0.3 s in fp32 on 2 cores): with 5, a probe taken while the machine was briefly busy read 0.092
    TFLOPS against 0.126-0.141 quiet, and the demo's MFU showed above 100 %."""
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[precision]
    a = torch.randn(size, size).to(dtype)
    b = torch.randn(size, size).to(dtype)
    torch.mm(a, b)  # warm-up: thread pool start, kernel selection
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - start)
    tflops = 2 * size**3 / best / 1e12
    return Peak(tflops, f"CPU matmul probe {size}³ {precision}, {torch.get_num_threads()} threads")


def peak_for(device: torch.device, precision: str) -> Peak:
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        return gpu_peak(name, precision, torch.backends.cuda.matmul.allow_tf32)
    if device.type == "cpu":
        from dlx.device import supports_native_bf16

        if precision == "bf16" and not supports_native_bf16(device):
            # emulated bf16: a lone torch.mm probe runs slower than autocast training, and MFU came out at 160-330 %
            return Peak(None, "bf16 is emulated on this CPU (no AVX512-BF16 or AMX), so it has no peak; MFU omitted")
        return measure_cpu_peak(precision)
    return Peak(None, f"no peak known for device type '{device.type}'; MFU omitted")


def mfu(achieved_tflops: float, peak: Peak) -> float | None:
    """Model FLOPs utilisation in [0, 1], or None without a peak. Above 1 is reported, never clipped: it means the
    peak or the FLOPs count is wrong, and `mfu_warning` says so."""
    if peak.tflops is None or peak.tflops <= 0:
        return None
    return max(achieved_tflops, 0.0) / peak.tflops


def mfu_warning(value: float | None) -> str | None:
    if value is not None and value > 1.0:
        return f"MFU {value:.0%} exceeds 100%: the peak table or the FLOPs convention does not fit this device"
    return None
