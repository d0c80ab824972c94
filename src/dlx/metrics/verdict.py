"""The bottleneck verdict: which part of the step limits throughput, the evidence, and one thing to try.

Shares are each phase's total time over the total step time of the records used (`steady_records`: the first
`skip_first` records and the first record after each resume are warm-up: compilation, allocator growth, loader start-up;
records of profiled steps are left out too), so a share says where the run's time actually went.
`other` is step time in no phase (zero_grad, scheduler, logging, Python and kernel-launch gaps).

Rules, with the thresholds in THRESHOLDS:
  data-bound       data_wait ≥ 10 % of step time: the device waits for batches; nothing else matters until fixed.
  optimizer-bound  optimizer ≥ 30 %: AdamW's per-parameter passes rival the model's own math.
  overhead-bound   other + communication ≥ 20 %: time that is neither model math nor optimizer (Python, launches,
                   logging, exposed all-reduce).
  compute-bound    none of the above: forward and backward take the step. With MFU below LOW_MFU (30 %, attention
                   convention) the math itself runs inefficiently (fp32, small matmuls, unfused kernels, or
                   launch-bound small kernels, which on a GPU show up inside the forward/backward spans).
When several rules fire, the kind whose share exceeds its threshold by the largest factor wins.

Confidence: the coefficient of variation (standard deviation ÷ mean) of the per-step times judged. Above NOISY_CV the
step times moved more than the shares the rules compare, usually because other processes shared the device, so the
verdict says it is tentative instead of diagnosing with confidence. Advice names only what the device has: bf16 only
where it runs natively, GPU features only on GPUs.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from dlx.metrics.records import phase_seconds, unprofiled

THRESHOLDS = {"data-bound": 0.10, "optimizer-bound": 0.30, "overhead-bound": 0.20}
"""Share of step time at or above which a kind is flagged."""
LOW_MFU = 0.30
"""Compute-bound below this MFU (attention convention) means the model math itself is slow."""
NOISY_CV = 0.15
"""Step times whose coefficient of variation exceeds this make the verdict tentative."""
STARTUP_KEY = "first_of_process"
"""Set on the first record each process logs, a resumed run's too: its window holds that process's compilation and
start-up (a resume on an H200 logged 556 ms steps in it against 17 ms after), so summaries leave it out."""


def steady_records(records: Sequence[dict[str, Any]], skip_first: int = 1) -> list[dict[str, Any]]:
    """The records summaries judge: not the first `skip_first` (metrics files from before STARTUP_KEY), not the first
    of a process, not profiled; when that leaves none, the ones it can."""
    later = list(records[skip_first:]) if len(records) > skip_first else list(records)
    return unprofiled([r for r in later if not r.get(STARTUP_KEY)] or later)


@dataclass(frozen=True)
class Hardware:
    """What the advice may name: the device kind, the precision trained in, whether bf16 runs natively, and whether
    the model is already compiled (train.compile is then not advised)."""

    kind: str = "cuda"
    """torch device type: cuda or cpu."""
    precision: str = "bf16"
    native_bf16: bool = True
    compiled: bool = False


STRAGGLER_RATIO = 1.2
"""A rank whose own step time is this many times the median rank's is named a straggler."""


@dataclass(frozen=True)
class Verdict:
    kind: str
    """One of data-bound, compute-bound, optimizer-bound, overhead-bound."""
    reason: str
    """Why this kind, in one clause with the deciding number."""
    suggestion: str
    """One concrete thing to try first."""
    evidence: dict[str, float | None] = field(default_factory=dict)
    """<phase>_pct shares (other_pct included), median_step_s, median_tokens_per_s, median_mfu(_dense) over the
    records judged, records, steps (the optimizer steps those records average), step_cv (coefficient of variation of
    the per-step times)."""
    straggler: str | None = None
    """Under torchrun: the rank whose own step time (without communication) is at least STRAGGLER_RATIO × the median
    rank's, in most of the records judged; None when no rank is."""

    @property
    def confident(self) -> bool:
        return (self.evidence.get("step_cv") or 0.0) <= NOISY_CV

    def confidence_line(self) -> str:
        cv = self.evidence.get("step_cv") or 0.0
        if self.confident:
            return f"step times vary by {cv:.0%} (coefficient of variation, at most {NOISY_CV:.0%} for a firm verdict)"
        return (
            f"tentative: step times vary by {cv:.0%} (coefficient of variation, above {NOISY_CV:.0%}), so other "
            "processes likely shared the device; rerun on a quiet machine before acting on this verdict"
        )

    def evidence_line(self) -> str:
        ev = self.evidence
        shares = " · ".join(f"{k[:-4]} {v:.0f}%" for k, v in ev.items() if k.endswith("_pct") and v is not None)
        mfu = "MFU n/a" if ev["median_mfu"] is None else f"MFU {100 * ev['median_mfu']:.1f}%"
        if ev.get("median_mfu_dense") is not None:
            mfu += f" (dense {100 * ev['median_mfu_dense']:.1f}%)"
        return (
            f"{shares}; median step {1e3 * ev['median_step_s']:.1f} ms, "
            f"{ev['median_tokens_per_s']:,.0f} tokens/s, {mfu}, over {ev['steps']:.0f} steps "
            f"({ev['records']:.0f} logged records)"
        )

    def __str__(self) -> str:
        kind = self.kind if self.confident else f"{self.kind} (tentative)"
        text = (
            f"Bottleneck: {kind}: {self.reason}.\nEvidence: {self.evidence_line()}\n"
            f"Confidence: {self.confidence_line()}\nTry: {self.suggestion}"
        )
        return text + (f"\nStraggler: {self.straggler}" if self.straggler else "")


def bottleneck_verdict(
    records: Sequence[dict[str, Any]], skip_first: int = 1, hardware: Hardware | None = None
) -> Verdict:
    """Judge the step records (ThroughputMeter.record dicts, or metrics.jsonl lines) of one run on `hardware`
    (default: a CUDA device training in bf16)."""
    if not records:
        raise ValueError("no step records to judge: the run logged no steps")
    evidence = _evidence(steady_records(records, skip_first))
    share = {k[:-4]: (v or 0.0) / 100 for k, v in evidence.items() if k.endswith("_pct")}
    flagged = {
        "data-bound": share["data_wait"],
        "optimizer-bound": share["optimizer"],
        "overhead-bound": share["other"] + share["communication"],
    }
    ratios = {kind: s / THRESHOLDS[kind] for kind, s in flagged.items() if s >= THRESHOLDS[kind]}
    kind = max(ratios, key=ratios.__getitem__) if ratios else "compute-bound"
    reason, suggestion = _ADVICE[kind](share, evidence["median_mfu"], hardware or Hardware())
    straggler = find_straggler(steady_records(records, skip_first))
    return Verdict(kind=kind, reason=reason, suggestion=suggestion, evidence=evidence, straggler=straggler)


def find_straggler(records: Sequence[dict[str, Any]]) -> str | None:
    """The rank slowest in most records, when its median ratio to the median rank is ≥ STRAGGLER_RATIO."""
    ranked = [r for r in records if r.get("rank_step_s_median")]
    if not ranked:
        return None
    slowest = statistics.mode(int(r["slowest_rank"]) for r in ranked)
    ratios = [r["rank_step_s_max"] / r["rank_step_s_median"] for r in ranked if r["slowest_rank"] == slowest]
    ratio = statistics.median(ratios)
    if ratio < STRAGGLER_RATIO:
        return None
    return (
        f"rank {slowest} takes {ratio:.2f}x the median rank's step time (without communication) in {len(ratios)} of "
        f"{len(ranked)} records; the other ranks wait for it in every all-reduce: check its device, host and data"
    )


def _evidence(records: list[dict[str, Any]]) -> dict[str, float | None]:
    totals: dict[str, float] = {}
    for rec in records:
        for name, seconds in phase_seconds(rec).items():
            totals[name] = totals.get(name, 0.0) + seconds
    step_total = sum(float(rec["step_s"]) for rec in records)
    totals["other"] = max(step_total - sum(totals.values()), 0.0)
    evidence: dict[str, float | None] = {f"{name}_pct": 100 * s / step_total for name, s in totals.items()}
    evidence["median_step_s"] = statistics.median(float(rec["step_s"]) for rec in records)
    evidence["median_tokens_per_s"] = statistics.median(float(rec["tokens_per_s"]) for rec in records)
    evidence["median_mfu"] = _median([rec.get("mfu") for rec in records])
    evidence["median_mfu_dense"] = _median([rec.get("mfu_dense") for rec in records])
    evidence["records"] = float(len(records))
    evidence["steps"] = float(sum(rec.get("window_steps") or 1 for rec in records))
    evidence["step_cv"] = step_time_cv(records)
    return evidence


def step_time_cv(records: Sequence[dict[str, Any]]) -> float:
    """Coefficient of variation of the per-step times behind the records. A record averages `window_steps` steps
    (1 when absent) whose times had standard deviation `step_s_std` (0 when absent); pooled exactly:
    variance = Σ nᵢ (sᵢ² + (mᵢ − m)²) / Σ nᵢ over records i with nᵢ steps of mean mᵢ, m the overall mean."""
    counts = [float(rec.get("window_steps") or 1) for rec in records]
    means = [float(rec["step_s"]) for rec in records]
    stds = [float(rec.get("step_s_std") or 0.0) for rec in records]
    total = sum(counts)
    mean = sum(n * m for n, m in zip(counts, means, strict=True)) / total
    variance = sum(n * (s * s + (m - mean) ** 2) for n, m, s in zip(counts, means, stds, strict=True)) / total
    return math.sqrt(variance) / mean if mean > 0 else 0.0


def _median(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def _data(share: dict[str, float], mfu: float | None, hw: Hardware) -> tuple[str, str]:
    reason = (
        f"the device waits for data {share['data_wait']:.0%} of each step (threshold {THRESHOLDS['data-bound']:.0%})"
    )
    if hw.kind == "cpu":
        return reason, (
            "raise data.prefetch so batches are ready before the step asks; on a CPU the loader's workers take cores "
            "from training, so raise data.num_workers only while cores are idle"
        )
    return reason, "raise data.num_workers and data.prefetch so batches are ready before the step asks"


def _optimizer(share: dict[str, float], mfu: float | None, hw: Hardware) -> tuple[str, str]:
    return (
        f"the optimizer takes {share['optimizer']:.0%} of each step (threshold {THRESHOLDS['optimizer-bound']:.0%})",
        "raise train.grad_accum or data.micro_batch_size so each optimizer step serves more tokens",
    )


def _overhead(share: dict[str, float], mfu: float | None, hw: Hardware) -> tuple[str, str]:
    if share["communication"] > share["other"]:
        return (
            f"exposed communication takes {share['communication']:.0%} of each step",
            "raise train.grad_accum (gradients are all-reduced once per optimizer step) so the all-reduce is "
            "amortised over more tokens",
        )
    return (
        f"{share['other']:.0%} of each step is outside data, forward, backward and optimizer "
        f"(threshold {THRESHOLDS['overhead-bound']:.0%}): Python, kernel launches, logging",
        "raise data.micro_batch_size for larger kernels and raise log.every"
        if hw.compiled
        else "raise data.micro_batch_size for larger kernels, enable train.compile, and raise log.every",
    )


def _compute(share: dict[str, float], mfu: float | None, hw: Hardware) -> tuple[str, str]:
    math_share = share["forward"] + share["backward"]
    if mfu is None:
        return (
            f"forward and backward take {math_share:.0%} of each step (no peak known, so no MFU)",
            "profile one step with torch.profiler to find the largest kernels; a peak-table entry for this device "
            "would give MFU",
        )
    if mfu < LOW_MFU:
        return (
            f"forward and backward take {math_share:.0%} of each step, at only {mfu:.1%} MFU",
            _faster_math(hw),
        )
    more = "more GPUs (parallel.strategy fsdp)" if hw.kind == "cuda" else "more cores or a GPU"
    return (
        f"forward and backward take {math_share:.0%} of each step at {mfu:.1%} MFU: the device is doing model math",
        f"what remains is {more}" if hw.compiled else f"what remains is train.compile (fused kernels) or {more}",
    )


def _faster_math(hw: Hardware) -> str:
    """Ways to run the model math faster that this device has."""
    ways = []
    if hw.precision == "fp32" and hw.native_bf16:
        ways.append("train.precision bf16 (this device runs bf16 natively)")
    if not hw.compiled:
        ways.append("train.compile")
    ways.append("larger matmuls (data.micro_batch_size or data.seq_len)")
    advice = ", ".join(ways[:-1]) + f" and {ways[-1]}" if len(ways) > 1 else ways[0]
    if hw.kind == "cpu" and not hw.native_bf16:
        advice += "; stay in fp32: bf16 is emulated on this CPU (no AVX512-BF16 or AMX) and trains 10-30x slower"
    return advice


_ADVICE = {"data-bound": _data, "optimizer-bound": _optimizer, "overhead-bound": _overhead, "compute-bound": _compute}
