"""A CPU's theoretical dense peak, stated like a datasheet entry: cores × clock × FLOPs per cycle per core.

FLOPs per cycle come from the vector units the CPU has for the dtype (one fused multiply-add = 2 FLOPs per lane):

| CPU (detected from /proc/cpuinfo)                          | fp32 | bf16 (native)             | source |
|---|---:|---:|---|
| Intel with AVX-512 (Skylake-SP and later Xeon Scalable)    | 64   | 128 AVX512-BF16, 1024 AMX | [1] [2] |
| Intel/AMD with AVX2 + FMA (Haswell+, Zen 2, Zen 3)         | 32   | emulated                  | [1] [3] |
| AMD Zen 4 (family 19h with AVX-512: 256-bit datapaths)     | 32   | 64 AVX512-BF16            | [3] |
| AMD Zen 5 (family 1Ah: 512-bit datapaths)                  | 64   | 128 AVX512-BF16           | [4] |
| AMD Zen / Zen+ (family 17h, models below 30h)              | 16   | emulated                  | [5] |
| AVX without FMA (Sandy/Ivy Bridge)                         | 16   | emulated                  | [1] |
| Arm with NEON/SVE (up to four 128-bit FMA pipes)           | 32   | 128 with BF16 (BFMMLA)    | [6] |

[1] Intel 64 and IA-32 Architectures Optimization Reference Manual: two 512-bit FMA units (ports 0+1 fused and 5) on
Xeon Scalable Gold/Platinum; two 256-bit FMA units since Haswell; separate 256-bit add and multiply on Sandy Bridge.
[2] Intel Architecture Day 2021, Sapphire Rapids: AMX TMUL does 1,024 bf16 FLOPs per cycle per core; VDPBF16PS
(AVX512-BF16) does two multiply-adds per fp32 lane, twice the fp32 FMA rate on the same units.
[3] AMD Software Optimization Guide for Family 19h (pub. 56665): four 256-bit FP pipes, FMA on two; a 512-bit op
occupies a pipe pair, so AVX-512 does not double Zen 4's FLOPs. [4] AMD Software Optimization Guide for Family 1Ah
(pub. 58455): 512-bit FP datapaths. [5] AMD Software Optimization Guide for Family 17h (pub. 55723): two 128-bit FMA
pipes on Zen and Zen+. [6] Arm Neoverse V1/V2 Software Optimization Guides.

Where an entry covers parts with fewer units (Xeon Silver/Bronze with one 512-bit FMA unit, mobile Zen 5, Neoverse
N1), the table gives the larger figure: the peak is a ceiling, so MFU is understated there, never above 100 %.
Emulated bf16/fp16 runs its matmuls as fp32 FMAs (after conversion), so its ceiling is the fp32 figure.

The clock is the highest the OS reports: cpufreq's `cpuinfo_max_freq` (boost included), else psutil, else
/proc/cpuinfo's `cpu MHz` (in a VM without cpufreq that is the host's nominal rate; boost may be higher). Cores are
the threads torch computes with, at most the physical cores this process may run on. A best-of-20 1024³ matmul in
the dtype is also run once per process and shown as "attainable"; should it beat the formula (a clock reported
below the boost clock), the clock is raised to the one the matmul proves, and the source says so.
"""

from __future__ import annotations

import functools
import glob
import os
import time
from collections.abc import Callable
from dataclasses import dataclass

import psutil
import torch

from dlx import device as device_mod
from dlx.metrics.peak import Peak

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


@dataclass(frozen=True)
class VectorUnits:
    name: str
    """The row of the module's table, in words."""
    fp32: int
    """fp32 FLOPs per cycle per core."""
    bf16: int | None
    """Native bf16 FLOPs per cycle per core; None when bf16 is emulated."""
    fp16: int | None
    """Native fp16 FLOPs per cycle per core; None when fp16 is emulated."""

    def per_cycle(self, precision: str) -> tuple[int, bool]:
        """FLOPs per cycle per core for the precision, and whether the precision runs natively."""
        native = {"fp32": self.fp32, "bf16": self.bf16, "fp16": self.fp16}[precision]
        return (native, True) if native is not None else (self.fp32, False)


def vector_units(info: dict[str, str]) -> VectorUnits | None:
    """The table row for a /proc/cpuinfo processor block (`flags`, or `Features` on Arm), or None if unknown."""
    flags = set((info.get("flags") or info.get("Features") or "").split())
    vendor, family, model = info.get("vendor_id", ""), _int(info.get("cpu family")), _int(info.get("model"))
    amx = 1024 if "amx_bf16" in flags else None
    if "asimd" in flags:
        return VectorUnits("Arm NEON/SVE, four 128-bit FMA pipes at most", 32, 128 if "bf16" in flags else None, 32)
    if vendor == "AuthenticAMD" and family == 0x19 and "avx512f" in flags:
        return VectorUnits("AMD Zen 4, AVX-512 on 256-bit datapaths", 32, 64 if "avx512_bf16" in flags else None, None)
    if vendor == "AuthenticAMD" and family >= 0x1A and "avx512f" in flags:
        return VectorUnits("AMD Zen 5, 512-bit datapaths", 64, 128 if "avx512_bf16" in flags else None, None)
    if "avx512f" in flags:
        bf16 = amx or (128 if "avx512_bf16" in flags else None)
        fp16 = 1024 if "amx_fp16" in flags else (128 if "avx512_fp16" in flags else None)
        units = "AMX" if amx else "AVX512-BF16" if bf16 else "no native bf16"
        return VectorUnits(f"AVX-512, two 512-bit FMA units ({units})", 64, bf16, fp16)
    if vendor == "AuthenticAMD" and family == 0x17 and model < 0x30:
        return VectorUnits("AMD Zen/Zen+, two 128-bit FMA pipes", 16, None, None)
    if "avx2" in flags and "fma" in flags:
        return VectorUnits("AVX2, two 256-bit FMA units", 32, None, None)
    if "avx" in flags:
        return VectorUnits("AVX, 256-bit add and multiply units", 16, None, None)
    return None


def _int(text: str | None) -> int:
    try:
        return int(text or "0", 0)
    except ValueError:
        return 0


def max_clock_ghz(info: dict[str, str]) -> tuple[float | None, str]:
    """The highest clock the OS reports, and where it was read."""
    khz = [_read_number(path) for path in glob.glob("/sys/devices/system/cpu/cpu[0-9]*/cpufreq/cpuinfo_max_freq")]
    if max(khz, default=0) > 0:
        return max(khz) / 1e6, "cpufreq cpuinfo_max_freq"
    freq = psutil.cpu_freq()
    if freq is not None and freq.max > 0:
        return freq.max / 1e3, "psutil max frequency"
    mhz = _float(info.get("cpu MHz"))
    if mhz > 0:
        return mhz / 1e3, "/proc/cpuinfo cpu MHz (no cpufreq here: a VM reports the nominal rate, boost may be higher)"
    return None, "no clock reported"


def _read_number(path: str) -> float:
    try:
        with open(path) as f:
            return float(f.read().strip())
    except (OSError, ValueError):
        return 0.0


def _float(text: str | None) -> float:
    try:
        return float(text or 0)
    except ValueError:
        return 0.0


def compute_cores() -> int:
    """The threads torch computes with, at most the physical cores this process may run on (two hyperthreads share
    one core's vector units)."""
    logical = psutil.cpu_count(logical=True) or 1
    physical = psutil.cpu_count(logical=False) or logical
    allowed = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else logical
    usable = max(1, -(-allowed * physical // logical))
    return max(1, min(torch.get_num_threads(), usable))


def measure_matmul_tflops(precision: str, size: int = 1024, repeats: int = 20) -> float:
    """Best achieved TFLOPS of a (size × size) @ (size × size) matmul in the precision's dtype, on torch's threads
    (about 0.3 s in fp32 on 2 cores), once per process and thread count. What the machine attains now, not its peak:
    a busy neighbour lowers it."""
    return _measure_matmul(precision, size, repeats, torch.get_num_threads())


@functools.cache
def _measure_matmul(precision: str, size: int, repeats: int, threads: int) -> float:
    a = torch.randn(size, size).to(DTYPES[precision])
    b = torch.randn(size, size).to(DTYPES[precision])
    torch.mm(a, b)  # warm-up: thread pool start, kernel selection
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - start)
    return 2 * size**3 / best / 1e12


def cpu_peak(precision: str) -> Peak:
    """The theoretical peak for the precision on this CPU, with the formula filled in as its source (once per process
    and torch thread count: the cores are the threads torch computes with)."""
    return _cpu_peak(precision, torch.get_num_threads())


@functools.cache
def _cpu_peak(precision: str, threads: int) -> Peak:
    info = device_mod.cpu_info()
    return theoretical_peak(info, max_clock_ghz(info), compute_cores(), precision, measure_matmul_tflops)


def theoretical_peak(
    info: dict[str, str],
    clock: tuple[float | None, str],
    cores: int,
    precision: str,
    probe: Callable[[str], float],
) -> Peak:
    """cores × clock × FLOPs/cycle for `info` (a /proc/cpuinfo block); `probe(precision)`: attainable TFLOPS."""
    units = vector_units(info)
    ghz, clock_source = clock
    if units is None or ghz is None:
        why = "no FLOPs/cycle entry for this CPU" if units is None else clock_source
        return Peak(None, f"CPU peak unknown ({why}; dlx.metrics.cpu_peak); MFU omitted")
    per_cycle, native = units.per_cycle(precision)
    # Emulated bf16/fp16 matmuls run far below the fp32 ceiling (10-30x slower): probing them would take seconds.
    attainable = probe(precision) if native else None
    proven = attainable * 1e3 / (cores * per_cycle) if attainable else 0.0
    if proven > ghz:
        ghz, clock_source = proven, f"raised from {ghz:.2f} GHz ({clock_source}) to what the matmul attained"
    kind = precision if native else f"fp32 ({precision} emulated)"
    plural = "" if cores == 1 else "s"
    source = (
        f"CPU theoretical: {cores} core{plural} × {ghz:.2f} GHz × {per_cycle} {kind} FLOPs/cycle [{units.name}; "
        f"{info.get('model name', 'CPU').strip()}; clock: {clock_source}]"
    )
    return Peak(cores * ghz * per_cycle / 1e3, source, attainable)
