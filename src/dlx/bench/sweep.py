"""The sweep: each point measured once, out-of-memory points marked instead of crashing, every result written as soon
as it exists, so an interrupted or extended sweep carries on where it stopped.

Out of memory, by device. On CUDA each point is tried; `torch.OutOfMemoryError` is caught, the memory released, the
row marked `oom`, and the larger micro-batches at the same seq len and precision are marked without being tried. On a
CPU running out of memory means swapping or the kernel's OOM killer, not an exception, so a point whose estimate
(`dlx plan`) exceeds the memory available is marked `oom_estimate` and not run (on CUDA too when a budget is given).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from dlx import device as dev
from dlx.bench.measure import measure_point
from dlx.bench.points import BenchPoint, BenchSetup
from dlx.bench.results import measured_row, point_row, read_rows, row_key, write_rows
from dlx.errors import UserError
from dlx.metrics.estimate import TrainingShape, plan_memory
from dlx.metrics.meter import peak_for
from dlx.metrics.peak import mfu_warning
from dlx.model.args import ModelArgs
from dlx.model.presets import resolve_model_args

CSV_NAME, TABLE_NAME, PLOT_NAME = "bench.csv", "bench.md", "bench.png"


@dataclass(frozen=True)
class MemoryBudget:
    gb: float
    """Memory a point may use: --memory-limit-gb, else the GPU's total or the CPU's available memory."""
    skip_by_estimate: bool
    """Mark points whose estimate exceeds `gb` as OOM without running them (CPUs, or a budget the user gave)."""


def estimate_gb(args: ModelArgs, point: BenchPoint, setup: BenchSetup) -> float:
    """`dlx plan`'s total for the point, for the kernels of the sweep's device."""
    shape = TrainingShape.of(
        setup,
        seq_len=point.seq_len,
        micro_batch=point.micro_batch,
        grad_accum=point.grad_accum,
        precision=point.precision,
        world_size=setup.world_size,
        device_type="cpu" if setup.device.type == "cpu" else "cuda",
    )
    return plan_memory(args, shape).total_gb


def check_micro_batch_one_fits(args: ModelArgs, setup: BenchSetup, points: list[BenchPoint], budget_gb: float) -> None:
    """One line instead of a sweep of OOM rows when even micro-batch 1 at the shortest seq len cannot fit."""
    seq_len = min(p.seq_len for p in points)
    smallest = min((estimate_gb(args, BenchPoint(seq_len, 1, 1, p.precision), setup), p.precision) for p in points)
    if smallest[0] > budget_gb:
        raise UserError(
            f"{setup.model} cannot fit even micro-batch 1 at seq len {seq_len} ({smallest[1]}): the estimate is "
            f"{smallest[0]:.1f} GB and {budget_gb:.1f} GB are available; see `dlx plan {setup.model}` for sharding "
            "and activation checkpointing"
        )


def run_sweep(
    setup: BenchSetup,
    points: list[BenchPoint],
    out_dir: Path,
    budget: MemoryBudget,
    say: Callable[[str], None],
) -> list[dict[str, Any]]:
    """Measure the points not already in out_dir/bench.csv; returns every row of the CSV."""
    args = resolve_model_args(setup.model)
    check_micro_batch_one_fits(args, setup, points, budget.gb)
    fixed = {
        "model": setup.model,
        "device": dev.device_name(setup.device),
        "data": setup.data,
        "compile": "on" if setup.compile else "off",
        "document_mask": "on" if setup.document_mask else "off",
    }
    csv_path = out_dir / CSV_NAME
    rows = {row_key(row): row for row in read_rows(csv_path)}
    oom_from: dict[tuple[str, int], int] = {}
    for point in points:
        key = row_key(point_row(fixed, point, "ok"))
        if key in rows and rows[key]["status"] != "oom_estimate":
            say(f"{point.label()}: in {csv_path} already ({rows[key]['status']}), skipped")
            continue
        rows[key] = bench_point(setup, args, fixed, point, budget, oom_from)
        write_rows(csv_path, rows.values())
        say(describe_row(point, rows[key]))
    return list(rows.values())


def bench_point(
    setup: BenchSetup,
    args: ModelArgs,
    fixed: dict[str, Any],
    point: BenchPoint,
    budget: MemoryBudget,
    oom_from: dict[tuple[str, int], int],
) -> dict[str, Any]:
    """Measure one point, or mark it OOM; `oom_from` remembers the smallest micro-batch that ran out per seq len."""
    estimate = estimate_gb(args, point, setup)
    if budget.skip_by_estimate and estimate > budget.gb:
        note = f"estimate {estimate:.2f} GB > {budget.gb:.2f} GB budget"
        return point_row(fixed, point, "oom_estimate", est_mem_gb=estimate, note=note)
    ran_out_at = oom_from.get((point.precision, point.seq_len))
    if ran_out_at is not None and point.micro_batch > ran_out_at:
        note = f"not tried: micro-batch {ran_out_at} ran out"
        return point_row(fixed, point, "oom", est_mem_gb=estimate, note=note)
    record = measure_or_none(setup, point)
    if record is None:
        oom_from[(point.precision, point.seq_len)] = point.micro_batch
        return point_row(fixed, point, "oom", est_mem_gb=estimate, note="out of memory")
    peak = peak_for(setup.device, point.precision)
    return measured_row(fixed, point, record, estimate, peak.tflops, peak.source, setup.steps)


def measure_or_none(setup: BenchSetup, point: BenchPoint) -> dict[str, Any] | None:
    """The point's record, or None when the device ran out of memory (the memory is released before returning)."""
    ran_out = False
    try:
        return measure_point(setup, point)
    except Exception as error:
        if not dev.is_out_of_memory(error):
            raise
        ran_out = True  # release outside the handler: the traceback holds the point's tensors until it ends
    finally:
        if ran_out:
            dev.release_memory(setup.device)
    return None


def describe_row(point: BenchPoint, row: dict[str, Any]) -> str:
    """The console line for a finished point: measurement beside estimate."""
    if row["status"] != "ok":
        return f"{point.label()}: OOM ({row['note']})"
    mfu = "n/a" if row["mfu"] == "" else f"{100 * row['mfu']:.1f}% (dense {100 * row['mfu_dense']:.1f}%)"
    warning = mfu_warning(row["mfu"] or None)
    return (
        f"{point.label()}: {row['it_per_s']:.3g} it/s, {row['tokens_per_s']:,.0f} tokens/s, step "
        f"{1e3 * row['step_s']:.0f} ms (fwd {1e3 * row['forward_s']:.0f} / bwd {1e3 * row['backward_s']:.0f} / opt "
        f"{1e3 * row['optimizer_s']:.0f}), peak {row['peak_mem_gb']:.3g} GB (estimate {row['est_mem_gb']:.3g}), "
        f"{row['tflops']:.3g} TFLOPS, MFU {mfu}" + (f" [{warning}]" if warning else "")
    )


def find_max_batch(
    setup: BenchSetup,
    seq_lens: list[int],
    precisions: list[str],
    budget: MemoryBudget,
    limit: int = 4096,
) -> list[dict[str, Any]]:
    """The largest micro-batch per precision and seq len: searched with OOM recovery on CUDA (one step per try), and
    from the estimate everywhere (the `estimated` column)."""
    args = resolve_model_args(setup.model)
    check_micro_batch_one_fits(args, setup, [BenchPoint(s, 1, 1, p) for p in precisions for s in seq_lens], budget.gb)
    return [
        max_batch_row(setup, args, seq_len, precision, budget, limit)
        for precision in precisions
        for seq_len in seq_lens
    ]


def max_batch_row(
    setup: BenchSetup, args: ModelArgs, seq_len: int, precision: str, budget: MemoryBudget, limit: int
) -> dict[str, Any]:
    def point(batch: int) -> BenchPoint:
        return BenchPoint(seq_len, batch, 1, precision)

    estimated = largest_fitting(lambda batch: estimate_gb(args, point(batch), setup) <= budget.gb, limit)
    measured = None
    if setup.device.type == "cuda":
        one_step = replace(setup, steps=1, warmup=0)
        measured = largest_fitting(lambda batch: measure_or_none(one_step, point(batch)) is not None, limit)
    return {"precision": precision, "seq_len": seq_len, "measured": measured, "estimated": estimated, "limit": limit}


def largest_fitting(fits: Callable[[int], bool], limit: int) -> int:
    """The largest n in [1, limit] with fits(n), assuming fits is monotone (0 when 1 does not fit): doubling until one
    fails, then bisection, so a search to n costs about 2·log2(n) tries."""
    low, high = 0, 1
    while high <= limit and fits(high):
        low, high = high, 2 * high
    high = min(high, limit + 1)
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (mid, high) if fits(mid) else (low, mid)
    return low
