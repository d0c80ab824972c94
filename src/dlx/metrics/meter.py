"""ThroughputMeter: the one place that turns a step's token count and phase timings into the logged numbers.

The trainer only feeds it numbers (torchtitan's split). For one optimizer step, with `tokens` counted over all ranks:

    tokens_per_s   = tokens / step_s                                   (whole job)
    tflops         = tokens_per_s / world_size × (6·N + 12·L·H·Q·T) / 1e12    per device, attention convention
    tflops_dense   = tokens_per_s / world_size × 6·N / 1e12                   per device, dense convention
    mfu, mfu_dense = tflops / peak_tflops, tflops_dense / peak_tflops  (fractions; None without a peak;
                     above 1 reported as it is, with a warning, never clipped)
    data_wait_pct  = 100 · data_wait_s / step_s
    other_s        = step_s − Σ phases (≥ 0): time spent in no phase (zero_grad, scheduler, logging, Python)
    peak_mem_gb    = the device's peak since the previous record (`record` resets the counter after reading it)

N, L, H, Q, T and both conventions are defined in `dlx.metrics.flops`; the peak comes from `dlx.metrics.peak`.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from dlx import device as device_mod
from dlx.metrics.cpu_peak import cpu_peak
from dlx.metrics.flops import CONVENTIONS, matmul_params, training_flops_per_token
from dlx.metrics.gpu_monitor import format_columns
from dlx.metrics.peak import Peak, gpu_peak, mfu, mfu_warning
from dlx.metrics.records import PROFILED_KEY, STANDARD_PHASES, phase_seconds
from dlx.model.args import ModelArgs


def peak_for(device: torch.device, precision: str) -> Peak:
    """The ceiling MFU divides by: the datasheet's for a GPU (`dlx.metrics.peak`), the formula's for a CPU
    (`dlx.metrics.cpu_peak`); none for another device type."""
    if device.type == "cuda":
        return gpu_peak(device_mod.device_name(device), precision, torch.backends.cuda.matmul.allow_tf32)
    if device.type == "cpu":
        return cpu_peak(precision)
    return Peak(None, f"no peak known for device type '{device.type}'; MFU omitted")


class Ema:
    """Exponential moving average with TensorBoard's debiasing: after values x₁…xₙ it is
    Σ wⁿ⁻ⁱ (1 − w) xᵢ / (1 − wⁿ), so the first value is itself and early values are not pulled towards 0.
    Non-finite values (a NaN loss) are skipped."""

    def __init__(self, weight: float) -> None:
        if not 0 <= weight < 1:
            raise ValueError(f"weight must be in [0, 1), got {weight}")
        self.weight = weight
        self._biased = 0.0
        self._count = 0

    def update(self, value: float) -> float | None:
        if math.isfinite(value):
            self._biased = self.weight * self._biased + (1 - self.weight) * value
            self._count += 1
        return self.value

    @property
    def value(self) -> float | None:
        return self._biased / (1 - self.weight**self._count) if self._count else None


class ThroughputMeter:
    """Per-step throughput, TFLOPS, MFU (both conventions), data-wait share and peak memory."""

    def __init__(
        self,
        model_args: ModelArgs,
        seq_len: int,
        device: torch.device,
        precision: str,
        world_size: int = 1,
        peak: Peak | None = None,
    ) -> None:
        """`peak` overrides the table/probe lookup (tests, or a figure the user knows better)."""
        if world_size < 1:
            raise ValueError(f"world_size must be >= 1, got {world_size}")
        self.model_args = model_args
        self.seq_len = seq_len
        self.device = device
        self.precision = precision
        self.world_size = world_size
        self.flops = training_flops_per_token(model_args, seq_len)
        self.peak = peak if peak is not None else peak_for(device, precision)
        self.first_warning: str | None = None
        """The first MFU-above-100 % warning of the run, for the end-of-run summary (each record carries its own)."""

    def record(
        self,
        *,
        step: int,
        loss: float | torch.Tensor | None,
        lr: float | None,
        grad_norm: float | torch.Tensor | None,
        tokens: int,
        timings: dict[str, float],
        seq_len: int | None = None,
    ) -> dict[str, Any]:
        """One flat, JSON-serialisable record for the optimizer step that produced `timings` (PhaseTimer.end_step).
        `seq_len`: the step's sequence length when it is not the meter's (a stage of data.stages)."""
        step_s = float(timings["step_s"])
        if step_s <= 0:
            raise ValueError(f"step_s must be positive, got {step_s}: pass the dict PhaseTimer.end_step returned")
        phases = {name: float(seconds) for name, seconds in timings.items() if name != "step_s"}
        phases = {**dict.fromkeys(STANDARD_PHASES, 0.0), **phases}
        tokens_per_s = tokens / step_s
        flops = self.flops if seq_len in (None, self.seq_len) else training_flops_per_token(self.model_args, seq_len)
        tflops = tokens_per_s / self.world_size * flops.attention / 1e12
        tflops_dense = tokens_per_s / self.world_size * flops.dense / 1e12
        rec: dict[str, Any] = {
            "step": int(step),
            "loss": _scalar(loss),
            "lr": _scalar(lr),
            "grad_norm": _scalar(grad_norm),
            "tokens": int(tokens),
            "tokens_per_s": tokens_per_s,
            **{f"{name}_s": seconds for name, seconds in phases.items()},
            "other_s": max(step_s - sum(phases.values()), 0.0),
            "step_s": step_s,
            "data_wait_pct": 100.0 * phases["data_wait"] / step_s,
            "tflops": tflops,
            "tflops_dense": tflops_dense,
            "mfu": mfu(tflops, self.peak),
            "mfu_dense": mfu(tflops_dense, self.peak),
            "peak_mem_gb": device_mod.peak_memory_gb(self.device),
        }
        device_mod.reset_peak_memory(self.device)  # the next record holds its own window's peak
        warning = mfu_warning(rec["mfu"])
        if warning is not None:
            rec["warning"] = warning
            self.first_warning = self.first_warning or warning
        return rec

    def header(self) -> list[str]:
        """How every number in the records is counted: FLOPs formulas filled in, the peak and its source, memory."""
        a, t = self.model_args, self.seq_len
        n = matmul_params(a)
        attention_term = f"12·{a.n_layers}·{a.n_heads}·{a.head_dim}·{t}"
        lines = [
            f"FLOPs/token, attention convention (tflops, mfu): 6·N + 12·L·H·Q·T = 6·{n:,} + {attention_term}"
            f" = {self.flops.attention:.4e}",
            f"FLOPs/token, dense convention (tflops_dense, mfu_dense): 6·N = 6·{n:,} = {self.flops.dense:.4e}",
            f"  N = {CONVENTIONS['dense'].split('N = ', 1)[1]}; L layers, H query heads, Q head dim, T seq len",
            f"TFLOPS are per device: tokens/s ÷ {self.world_size} device(s) × FLOPs/token ÷ 1e12",
        ]
        if self.peak.tflops is None:
            lines.append(f"MFU omitted: {self.peak.source}")
        else:
            lines.append(f"MFU = TFLOPS ÷ peak {self.peak.tflops:.4g} TFLOPS ({self.precision}; {self.peak.source})")
            lines += attainable_lines(self.peak, self.precision)
        lines.append(f"Peak memory: {device_mod.peak_memory_method(self.device)}; reset after every record")
        return lines

    def format_line(self, record: dict[str, Any]) -> str:
        """One compact log line: loss, lr, throughput, TFLOPS, MFU, every phase and peak memory."""
        phases = " · ".join(f"{_SHORT.get(k, k)} {_ms(s)}" for k, s in phase_seconds(record).items())
        parts = [
            f"step {record['step']}",
            f"loss {_fmt(record.get('loss'), '.4f')}",
            f"lr {_fmt(record.get('lr'), '.2e')}",
            f"gnorm {_fmt(record.get('grad_norm'), '.3g')}",
            f"{record['tokens_per_s']:,.0f} tok/s",
            f"{record['tflops']:.3g} TFLOPS",
            f"MFU {_pct(record.get('mfu'))} (dense {_pct(record.get('mfu_dense'))})",
            f"step {_ms(record['step_s'])} ms: {phases} · other {_ms(record['other_s'])}",
            f"mem {record['peak_mem_gb']:.2f} GB",
        ]
        gpu = format_columns(record)
        if gpu:
            parts.insert(-1, gpu)  # beside the step's phases, data wait among them
        if "warning" in record:
            parts.append("! MFU > 100%")
        if record.get(PROFILED_KEY):
            parts.append(f"profiled steps {record[PROFILED_KEY]}: left out of the summary")
        return " | ".join(parts)


BUSY_AT_START = 0.5
"""An attainable matmul below this share of the CPU peak at start-up is called out: the machine was likely busy."""


def attainable_lines(peak: Peak, precision: str) -> list[str]:
    """The CPU matmul probe beside the theoretical peak, and what a low ratio means."""
    if peak.attainable_tflops is None or not peak.tflops:
        return []
    share = peak.attainable_tflops / peak.tflops
    line = (
        f"  attainable at start-up: {peak.attainable_tflops:.4g} TFLOPS "
        f"(best 1024³ {precision} matmul, {share:.0%} of peak)"
    )
    if share < BUSY_AT_START:
        line += "; below half the peak: other processes were likely using these cores"
    return [line]


_SHORT = {"data_wait": "data", "forward": "fwd", "backward": "bwd", "optimizer": "opt", "communication": "comm"}


def _scalar(value: float | torch.Tensor | None) -> float | None:
    if value is None:
        return None
    # Non-finite values stay as they are here (the trainer checks them); MetricsLogger writes them as null.
    return float(value.item() if hasattr(value, "item") else value)


def _fmt(value: float | None, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.1f}%"


def _ms(seconds: float) -> str:
    ms = 1e3 * seconds
    return f"{ms:.0f}" if ms >= 10 else f"{ms:.1f}"
