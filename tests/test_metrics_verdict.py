"""bottleneck_verdict: each kind from synthetic step records."""

from __future__ import annotations

from typing import Any

import pytest

from dlx.metrics.verdict import bottleneck_verdict


def record(step: int = 1, data=0.0, fwd=0.3, bwd=0.6, opt=0.05, comm=0.0, step_s=1.0, mfu=0.45) -> dict[str, Any]:
    phases = {"data_wait_s": data, "forward_s": fwd, "backward_s": bwd, "optimizer_s": opt, "communication_s": comm}
    other = max(step_s - sum(phases.values()), 0.0)
    return {
        "step": step,
        **phases,
        "other_s": other,
        "step_s": step_s,
        "tokens_per_s": 1000 / step_s,
        "mfu": mfu,
        "mfu_dense": None if mfu is None else 0.9 * mfu,
    }


def run(**kw: Any) -> list[dict[str, Any]]:
    warmup = record(step=0, fwd=5.0, bwd=0.1, opt=0.1, step_s=5.2)  # compilation: must be skipped
    return [warmup] + [record(step=i, **kw) for i in range(1, 6)]


def test_compute_bound_high_mfu() -> None:
    v = bottleneck_verdict(run())
    assert v.kind == "compute-bound" and "fused kernels" in v.suggestion
    assert v.evidence["forward_pct"] == pytest.approx(30.0)
    assert v.evidence["median_step_s"] == pytest.approx(1.0) and v.evidence["steps"] == 5


def test_compute_bound_low_mfu_suggests_bf16_and_compile() -> None:
    v = bottleneck_verdict(run(mfu=0.08))
    assert v.kind == "compute-bound" and "bf16" in v.suggestion and "compile" in v.suggestion


def test_compute_bound_without_peak() -> None:
    v = bottleneck_verdict(run(mfu=None))
    assert v.kind == "compute-bound" and v.evidence["median_mfu"] is None and "MFU n/a" in str(v)


def test_data_bound() -> None:
    v = bottleneck_verdict(run(data=0.25, fwd=0.25, bwd=0.45, step_s=1.0))
    assert v.kind == "data-bound" and "workers" in v.suggestion and "prefetch" in v.suggestion
    assert v.evidence["data_wait_pct"] == pytest.approx(25.0)


def test_optimizer_bound() -> None:
    v = bottleneck_verdict(run(fwd=0.2, bwd=0.4, opt=0.4, step_s=1.0))
    assert v.kind == "optimizer-bound" and "AdamW" in v.suggestion


def test_overhead_bound_from_unaccounted_time() -> None:
    v = bottleneck_verdict(run(fwd=0.2, bwd=0.4, opt=0.05, step_s=1.0))  # 35 % in no phase
    assert v.kind == "overhead-bound" and "compile" in v.suggestion
    assert v.evidence["other_pct"] == pytest.approx(35.0)


def test_overhead_bound_from_communication() -> None:
    v = bottleneck_verdict(run(fwd=0.2, bwd=0.4, opt=0.05, comm=0.35, step_s=1.0))
    assert v.kind == "overhead-bound" and "grad_accum" in v.suggestion


def test_largest_excess_wins() -> None:
    # data 12 % (1.2× its 10 % threshold) vs optimizer 45 % (1.5× its 30 %): optimizer-bound.
    v = bottleneck_verdict(run(data=0.12, fwd=0.13, bwd=0.3, opt=0.45, step_s=1.0))
    assert v.kind == "optimizer-bound"


def test_skip_first_and_str() -> None:
    records = run()
    assert bottleneck_verdict(records, skip_first=0).evidence["steps"] == 6
    assert bottleneck_verdict(records[:1]).evidence["steps"] == 1  # too few to skip: all are used
    text = str(bottleneck_verdict(records))
    assert text.startswith("Bottleneck: compute-bound") and 2 <= text.count("\n") <= 3
    with pytest.raises(ValueError, match="no step records"):
        bottleneck_verdict([])
