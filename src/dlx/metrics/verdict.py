"""The bottleneck verdict: which part of the step limits throughput, the evidence, and one thing to try.

Shares are each phase's total time over the total step time of the records used (the first `skip_first` records are
warm-up: compilation, allocator growth, loader start-up; records of profiled steps are left out too), so a share says
where the run's time actually went.
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
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from dlx.metrics.meter import phase_seconds
from dlx.metrics.profiler import unprofiled

THRESHOLDS = {"data-bound": 0.10, "optimizer-bound": 0.30, "overhead-bound": 0.20}
"""Share of step time at or above which a kind is flagged."""
LOW_MFU = 0.30
"""Compute-bound below this MFU (attention convention) means the model math itself is slow."""


@dataclass(frozen=True)
class Verdict:
    kind: str
    """One of data-bound, compute-bound, optimizer-bound, overhead-bound."""
    reason: str
    """Why this kind, in one clause with the deciding number."""
    suggestion: str
    """One concrete thing to try first."""
    evidence: dict[str, float | None] = field(default_factory=dict)
    """<phase>_pct shares (other_pct included), median_step_s, median_tokens_per_s, median_mfu(_dense), steps."""

    def evidence_line(self) -> str:
        ev = self.evidence
        shares = " · ".join(f"{k[:-4]} {v:.0f}%" for k, v in ev.items() if k.endswith("_pct") and v is not None)
        mfu = "MFU n/a" if ev["median_mfu"] is None else f"MFU {100 * ev['median_mfu']:.1f}%"
        if ev.get("median_mfu_dense") is not None:
            mfu += f" (dense {100 * ev['median_mfu_dense']:.1f}%)"
        return (
            f"{shares}; median step {1e3 * ev['median_step_s']:.1f} ms, "
            f"{ev['median_tokens_per_s']:,.0f} tokens/s, {mfu}, over {ev['steps']:.0f} steps"
        )

    def __str__(self) -> str:
        return f"Bottleneck: {self.kind}: {self.reason}.\nEvidence: {self.evidence_line()}\nTry: {self.suggestion}"


def bottleneck_verdict(records: Sequence[dict[str, Any]], skip_first: int = 1) -> Verdict:
    """Judge the step records (ThroughputMeter.record dicts, or metrics.jsonl lines) of one run."""
    if not records:
        raise ValueError("no step records to judge: the run logged no steps")
    used = list(records[skip_first:]) if len(records) > skip_first else list(records)
    evidence = _evidence(unprofiled(used))
    share = {k[:-4]: (v or 0.0) / 100 for k, v in evidence.items() if k.endswith("_pct")}
    flagged = {
        "data-bound": share["data_wait"],
        "optimizer-bound": share["optimizer"],
        "overhead-bound": share["other"] + share["communication"],
    }
    ratios = {kind: s / THRESHOLDS[kind] for kind, s in flagged.items() if s >= THRESHOLDS[kind]}
    kind = max(ratios, key=ratios.__getitem__) if ratios else "compute-bound"
    reason, suggestion = _ADVICE[kind](share, evidence["median_mfu"])
    return Verdict(kind=kind, reason=reason, suggestion=suggestion, evidence=evidence)


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
    evidence["steps"] = float(len(records))
    return evidence


def _median(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def _data(share: dict[str, float], mfu: float | None) -> tuple[str, str]:
    return (
        f"the device waits for data {share['data_wait']:.0%} of each step (threshold {THRESHOLDS['data-bound']:.0%})",
        "raise data.workers and the loader's prefetch depth so batches are ready before the step asks; "
        "if batches are tokenized on the fly, prepare the dataset into shards first",
    )


def _optimizer(share: dict[str, float], mfu: float | None) -> tuple[str, str]:
    return (
        f"the optimizer takes {share['optimizer']:.0%} of each step (threshold {THRESHOLDS['optimizer-bound']:.0%})",
        "use fused (CUDA) or foreach AdamW, and raise train.grad_accum so each optimizer step serves more tokens",
    )


def _overhead(share: dict[str, float], mfu: float | None) -> tuple[str, str]:
    if share["communication"] > share["other"]:
        return (
            f"exposed communication takes {share['communication']:.0%} of each step",
            "raise train.grad_accum (gradients are all-reduced once per optimizer step) so the all-reduce is "
            "amortised over more tokens, and let DDP's buckets overlap it with backward",
        )
    return (
        f"{share['other']:.0%} of each step is outside data, forward, backward and optimizer "
        f"(threshold {THRESHOLDS['overhead-bound']:.0%}): Python, kernel launches, logging",
        "raise data.micro_batch_size for larger kernels, enable train.compile (or CUDA graphs on a GPU), "
        "and log less often",
    )


def _compute(share: dict[str, float], mfu: float | None) -> tuple[str, str]:
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
            "train in bf16 if not already, enable train.compile, and make the matmuls larger "
            "(bigger micro-batch or sequence length)",
        )
    return (
        f"forward and backward take {math_share:.0%} of each step at {mfu:.1%} MFU: the device is doing model math",
        "what remains is fused kernels (flash attention, train.compile) or more devices",
    )


_ADVICE = {"data-bound": _data, "optimizer-bound": _optimizer, "overhead-bound": _overhead, "compute-bound": _compute}
