"""bottleneck_verdict: each kind from synthetic step records."""

from __future__ import annotations

from typing import Any

import pytest

from dlx.metrics.verdict import NOISY_CV, Hardware, bottleneck_verdict, step_time_cv


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


def test_compute_bound_low_mfu_suggests_bf16_only_where_it_is_native() -> None:
    gpu_fp32 = bottleneck_verdict(run(mfu=0.08), hardware=Hardware("cuda", "fp32", native_bf16=True))
    assert gpu_fp32.kind == "compute-bound" and "train.precision bf16" in gpu_fp32.suggestion
    assert "train.compile" in gpu_fp32.suggestion
    cpu_emulated = bottleneck_verdict(run(mfu=0.08), hardware=Hardware("cpu", "fp32", native_bf16=False))
    assert "train.precision bf16" not in cpu_emulated.suggestion and "stay in fp32" in cpu_emulated.suggestion
    cpu_native = bottleneck_verdict(run(mfu=0.08), hardware=Hardware("cpu", "fp32", native_bf16=True))
    assert "train.precision bf16" in cpu_native.suggestion and "emulated" not in cpu_native.suggestion
    already_bf16 = bottleneck_verdict(run(mfu=0.08), hardware=Hardware("cuda", "bf16", native_bf16=True))
    assert "bf16" not in already_bf16.suggestion


def test_a_compiled_run_is_not_advised_to_compile() -> None:
    low_mfu = bottleneck_verdict(run(mfu=0.08), hardware=Hardware("cpu", "bf16", native_bf16=True, compiled=True))
    assert low_mfu.suggestion == "larger matmuls (data.micro_batch_size or data.seq_len)"
    high_mfu = bottleneck_verdict(run(), hardware=Hardware("cuda", "bf16", native_bf16=True, compiled=True))
    assert high_mfu.suggestion == "what remains is more GPUs (parallel.strategy fsdp)"
    overhead = bottleneck_verdict(run(opt=0.0, fwd=0.1), hardware=Hardware(compiled=True))
    assert overhead.suggestion == "raise data.micro_batch_size for larger kernels and raise log.every"


@pytest.mark.parametrize("kw", [{}, {"mfu": 0.08}, {"data": 0.5}, {"opt": 0.5}, {"opt": 0.0, "fwd": 0.1}])
def test_cpu_advice_names_no_gpu_feature(kw) -> None:
    suggestion = bottleneck_verdict(run(**kw), hardware=Hardware("cpu", "fp32", native_bf16=False)).suggestion
    for gpu_only in ("CUDA", "GPUs", "fused AdamW", "flash", "NCCL", "graphs"):
        assert gpu_only not in suggestion


def test_compute_bound_without_peak() -> None:
    v = bottleneck_verdict(run(mfu=None))
    assert v.kind == "compute-bound" and v.evidence["median_mfu"] is None and "MFU n/a" in str(v)


def test_data_bound() -> None:
    v = bottleneck_verdict(run(data=0.25, fwd=0.25, bwd=0.45, step_s=1.0))
    assert v.kind == "data-bound" and "data.num_workers" in v.suggestion and "data.prefetch" in v.suggestion
    assert v.evidence["data_wait_pct"] == pytest.approx(25.0)


def test_optimizer_bound() -> None:
    v = bottleneck_verdict(run(fwd=0.2, bwd=0.4, opt=0.4, step_s=1.0))
    assert v.kind == "optimizer-bound" and "train.grad_accum" in v.suggestion


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
    assert text.startswith("Bottleneck: compute-bound:") and text.count("\n") == 3
    assert "Confidence: step times vary by 0%" in text and "over 5 steps (5 logged records)" in text
    windows = [record(step=0), *[{**record(step=10 * i), "window_steps": 10, "step_s_std": 0.0} for i in (1, 2)]]
    assert bottleneck_verdict(windows).evidence["steps"] == 20 and "over 20 steps (2 logged records)" in str(
        bottleneck_verdict(windows)
    )
    with pytest.raises(ValueError, match="no step records"):
        bottleneck_verdict([])


def test_noisy_step_times_make_the_verdict_tentative() -> None:
    quiet = bottleneck_verdict(run(step_s=1.0))
    assert quiet.confident and quiet.evidence["step_cv"] == 0.0
    # Steps of 1.0 s and 1.5 s alternate: mean 1.25, standard deviation 0.25, CV 0.2 > 0.15. The extra half second
    # is in no phase, as when another process takes the cores: the shares say overhead, tentatively.
    records = [record(step=0, step_s=5.0)] + [record(step=i, step_s=1.0 + 0.5 * (i % 2)) for i in range(1, 7)]
    noisy = bottleneck_verdict(records)
    assert noisy.evidence["step_cv"] == pytest.approx(0.2) and NOISY_CV < 0.2
    assert not noisy.confident and str(noisy).startswith("Bottleneck: overhead-bound (tentative):")
    assert "rerun on a quiet machine" in str(noisy)


def test_step_time_cv_pools_windows_exactly() -> None:
    """Two windows: 3 steps of mean 1.0 (std 0.1) and 1 step of 2.0. All four steps: mean 1.25,
    variance (3 · (0.01 + 0.0625) + 1 · (0 + 0.5625)) / 4 = 0.195."""
    records = [{"step_s": 1.0, "window_steps": 3, "step_s_std": 0.1}, {"step_s": 2.0, "window_steps": 1}]
    assert step_time_cv(records) == pytest.approx(0.195**0.5 / 1.25, rel=1e-12)
    assert step_time_cv([{"step_s": 2.0}, {"step_s": 2.0}]) == 0.0


def test_the_first_record_after_a_resume_is_left_out_like_the_first_of_the_run() -> None:
    from dlx.metrics.verdict import STARTUP_KEY

    resumed = {**record(step=4, fwd=5.0, bwd=0.1, opt=0.1, step_s=5.2), STARTUP_KEY: True}  # the resume's compilation
    records = [*run()[:4], resumed, *[record(step=i) for i in (5, 6)]]
    verdict = bottleneck_verdict(records)
    assert verdict.evidence["records"] == 5 and verdict.confident  # steps 1-3, 5, 6
    assert verdict.evidence["median_step_s"] == 1.0 and verdict.evidence["forward_pct"] == pytest.approx(30.0)
    assert bottleneck_verdict(records, skip_first=0).evidence["records"] == 6  # only the marked one is left out
    only_startups = [{**record(step=1), STARTUP_KEY: True}, {**record(step=2), STARTUP_KEY: True}]
    assert bottleneck_verdict(only_startups).evidence["records"] == 1  # nothing steady: what there is
