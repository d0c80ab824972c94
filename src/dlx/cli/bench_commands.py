"""`dlx bench`: throughput tables (it/s, memory, FLOPS across seq len, batch and accumulation) in one command, each
measured point beside `dlx plan`'s estimate."""

from __future__ import annotations

import datetime
import shlex
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

BENCH_HELP = """Sweep seq len × micro-batch × grad accum × precision and measure each point as `dlx pretrain` trains:
warm-up steps, then timed steps; it/s, tokens/s, forward / backward / optimizer time, peak memory, TFLOPS and MFU
(both conventions), beside the estimate. Writes bench.csv, bench.md and bench.png into --out; a re-run skips the
points already in bench.csv. Points that cannot fit are marked OOM.
"""


def bench(
    model: Annotated[str, typer.Option(help="A preset name or a YAML/JSON of ModelArgs.")],
    seq_len: Annotated[str, typer.Option(help="Comma-separated sequence lengths.")] = "512,1024,2048",
    micro_batch: Annotated[str, typer.Option(help="Comma-separated micro-batch sizes.")] = "1,4,8",
    grad_accum: Annotated[str, typer.Option(help="Comma-separated gradient-accumulation counts.")] = "1",
    precision: Annotated[str, typer.Option(help="Comma-separated: auto, bf16, fp16, fp32.")] = "auto",
    steps: Annotated[int, typer.Option(help="Timed optimizer steps per point.")] = 5,
    warmup: Annotated[int, typer.Option(help="Untimed optimizer steps per point first.")] = 2,
    out: Annotated[Path | None, typer.Option(help="Output folder (default runs/bench/MODEL).")] = None,
    data: Annotated[str, typer.Option(help="`synthetic` or a dataset folder from `dlx prepare`.")] = "synthetic",
    compile_blocks: Annotated[bool, typer.Option("--compile", help="torch.compile each block (train.compile).")] = (
        False
    ),
    device: Annotated[str, typer.Option(help="auto, cpu, cuda or cuda:N.")] = "auto",
    memory_limit_gb: Annotated[
        float | None, typer.Option(help="Mark points whose estimate exceeds this as OOM without running them.")
    ] = None,
    find_max_batch: Annotated[
        bool, typer.Option("--find-max-batch", help="Only find the largest micro-batch per seq len and precision.")
    ] = False,
) -> None:
    from dlx.bench.points import BenchSetup, expand_points, parse_positive_ints, parse_precisions
    from dlx.device import resolve_device
    from dlx.errors import UserError
    from dlx.precision import resolve_precision

    if steps < 1 or warmup < 0:
        raise UserError(f"--steps must be at least 1 and --warmup at least 0, got {steps} and {warmup}")
    torch_device = resolve_device(device)
    seq_lens = parse_positive_ints("--seq-len", seq_len)
    precisions = parse_precisions(precision, resolve_precision("auto", torch_device))
    setup = BenchSetup(model, torch_device, data, compile_blocks, steps, warmup)
    points = expand_points(
        seq_lens,
        parse_positive_ints("--micro-batch", micro_batch),
        parse_positive_ints("--grad-accum", grad_accum),
        precisions,
    )
    check_inputs(setup, points)
    out_dir = out or Path("runs") / "bench" / Path(model).stem
    budget = memory_budget(torch_device, memory_limit_gb)
    if find_max_batch:
        report_max_batch(setup, seq_lens, precisions, budget, out_dir)
    else:
        sweep(setup, points, budget, out_dir)


def check_inputs(setup: Any, points: list) -> None:
    """The model and the dataset, checked before anything runs (a UserError names what is wrong)."""
    from dlx.train.data import inspect_dataset
    from dlx.train.measure import point_config

    inspect_dataset(point_config(setup, max(points, key=lambda p: p.seq_len)))


def memory_budget(device: Any, limit_gb: float | None) -> Any:
    from dlx import device as dev
    from dlx.bench.sweep import MemoryBudget
    from dlx.errors import UserError

    if limit_gb is not None:
        if limit_gb <= 0:
            raise UserError(f"--memory-limit-gb must be positive, got {limit_gb}")
        return MemoryBudget(limit_gb, skip_by_estimate=True)
    return MemoryBudget(dev.memory_budget_gb(device), skip_by_estimate=device.type != "cuda")


def sweep(setup: Any, points: list, budget: Any, out_dir: Path) -> None:
    from dlx.atomic import atomic_write_text
    from dlx.bench.plot import plot_sweep
    from dlx.bench.results import markdown_table
    from dlx.bench.sweep import CSV_NAME, PLOT_NAME, TABLE_NAME, run_sweep
    from dlx.train.measure import measure_point

    rows = run_sweep(setup, points, out_dir, budget, say=print, measure=measure_point)
    atomic_write_text(out_dir / TABLE_NAME, markdown_table(rows, environment_lines(setup.device)) + "\n")
    plot = plot_sweep(out_dir / PLOT_NAME, rows)
    written = [out_dir / CSV_NAME, out_dir / TABLE_NAME, *([plot] if plot else [])]
    print("wrote " + ", ".join(str(path) for path in written))


def report_max_batch(setup: Any, seq_lens: list[int], precisions: list[str], budget: Any, out_dir: Path) -> None:
    from dlx.atomic import atomic_write_text
    from dlx.bench.sweep import find_max_batch
    from dlx.train.measure import measure_point

    rows = find_max_batch(setup, seq_lens, precisions, budget, measure_point)
    method = "searched with OOM recovery, one step per try" if setup.device.type == "cuda" else "not measured (CPU)"
    lines = [
        *environment_lines(setup.device),
        f"- measured: {method}; estimated: `dlx plan`'s estimate within {budget.gb:.1f} GB",
        "",
        "| precision | seq len | largest micro-batch, measured | largest micro-batch, estimated |",
        "|---|---|---|---|",
    ]
    for row in rows:
        measured, estimated = (_at_least(row[name], row["limit"]) for name in ("measured", "estimated"))
        lines.append(f"| {row['precision']} | {row['seq_len']} | {measured} | {estimated} |")
    text = "\n".join(lines) + "\n"
    print(text, end="")
    atomic_write_text(out_dir / "max_batch.md", text)
    print(f"wrote {out_dir / 'max_batch.md'}")


def _at_least(batch: int | None, limit: int) -> str:
    """The search stops at `limit`: reaching it means at least that many fit."""
    return "" if batch is None else f"≥ {batch}" if batch == limit else str(batch)


def environment_lines(device: Any) -> list[str]:
    """The command, versions, device and memory method, for the head of every table."""
    import platform

    import torch

    import dlx
    from dlx.device import device_name, peak_memory_method

    return [
        f"# dlx bench, {datetime.datetime.now().astimezone():%Y-%m-%d %H:%M %Z}",
        "",
        f"- command: `{shlex.join(['dlx', *sys.argv[1:]])}`",
        f"- dlx {dlx.__version__}, python {platform.python_version()}, torch {torch.__version__}",
        f"- device: {device_name(device)}",
        f"- peak memory: {peak_memory_method(device)}",
    ]


def register(app: typer.Typer) -> None:
    app.command("bench", help=BENCH_HELP)(bench)
