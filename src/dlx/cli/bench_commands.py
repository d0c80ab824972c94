"""`dlx bench`: throughput tables (it/s, memory, FLOPS across seq len, batch and accumulation) in one command, each
measured point beside `dlx plan`'s estimate."""

from __future__ import annotations

import contextlib
import datetime
import io
import os
import shlex
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

import typer

BENCH_HELP = """Sweep seq len × micro-batch × grad accum × precision and measure each point as `dlx pretrain` trains:
warm-up steps, then timed steps; it/s, tokens/s, forward / backward / optimizer time, peak memory, TFLOPS and MFU
(both conventions), beside the estimate. Writes bench.csv, bench.md and bench.png into --out; a re-run skips the
points already in bench.csv. Points that cannot fit are marked OOM. With --compile each point is compiled afresh
(Dynamo reset before it). On CUDA the allocator runs with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True unless
that variable (or PYTORCH_ALLOC_CONF) is set.
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
    strategy: Annotated[str, typer.Option(help="Under torchrun: none, ddp or fsdp (parallel.strategy).")] = "none",
    tp: Annotated[int, typer.Option(help="Under torchrun: tensor-parallel ranks per replica (parallel.tp).")] = 1,
    document_mask: Annotated[
        bool,
        typer.Option(
            "--document-mask", help="Attention inside each document of --data (data.document_mask; needs a dataset)."
        ),
    ] = False,
) -> None:
    from dlx.bench.points import BenchSetup, expand_points, parse_positive_ints, parse_precisions
    from dlx.data import SYNTHETIC
    from dlx.device import training_device
    from dlx.errors import UserError
    from dlx.parallel.distributed import env_from_torchrun
    from dlx.precision import resolve_precision

    if steps < 1 or warmup < 0:
        raise UserError(f"--steps must be at least 1 and --warmup at least 0, got {steps} and {warmup}")
    if strategy not in ("none", "ddp", "fsdp") or tp < 1:
        raise UserError(f"--strategy must be none, ddp or fsdp and --tp at least 1, got {strategy!r} and {tp}")
    launched = env_from_torchrun()
    world_size = launched.world_size
    torch_device = training_device(device, launched.local_rank, world_size, "--device")
    seq_lens = parse_positive_ints("--seq-len", seq_len)
    precisions = parse_precisions(precision, resolve_precision("auto", torch_device))
    if document_mask and data == SYNTHETIC:
        raise UserError("--document-mask needs --data DATASET: synthetic tokens have no document boundaries")
    setup = BenchSetup(
        model, torch_device, data, compile_blocks, steps, warmup, strategy, tp, world_size, document_mask
    )
    points = expand_points(
        seq_lens,
        parse_positive_ints("--micro-batch", micro_batch),
        parse_positive_ints("--grad-accum", grad_accum),
        precisions,
    )
    check_inputs(setup, points)
    out_dir = out or Path("runs") / "bench" / (Path(model).stem + (f"-{strategy}-tp{tp}" if world_size > 1 else ""))
    budget = memory_budget(torch_device, memory_limit_gb)
    with ranks_share_the_sweep(setup, out_dir) as out_dir:
        if find_max_batch:
            report_max_batch(setup, seq_lens, precisions, budget, out_dir)
        else:
            sweep(setup, points, budget, out_dir)


@contextlib.contextmanager
def ranks_share_the_sweep(setup: Any, out_dir: Path) -> Iterator[Path]:
    """Under torchrun every rank runs the same sweep in step (each point is one distributed measurement); rank 0 writes
    and prints, the others work in a temporary folder holding rank 0's earlier rows (so that all skip the same
    points) and print nothing. Without torchrun: `out_dir` itself."""
    from dlx.bench.results import read_rows, write_rows
    from dlx.bench.sweep import CSV_NAME
    from dlx.parallel import distributed

    if setup.world_size == 1:
        yield out_dir
        return
    distributed.init_distributed(setup.device, False, timeout_s=600.0, tp=setup.tp)
    try:
        rows = distributed.main_decides(lambda: read_rows(out_dir / CSV_NAME))
        if distributed.env_from_torchrun().is_main:
            yield out_dir
        else:
            with tempfile.TemporaryDirectory() as tmp, contextlib.redirect_stdout(io.StringIO()):
                write_rows(Path(tmp) / CSV_NAME, rows)
                yield Path(tmp)
    finally:
        distributed.teardown()


def check_inputs(setup: Any, points: list) -> None:
    """The model and the dataset, checked before anything runs (a UserError names what is wrong)."""
    from dlx.data import SYNTHETIC
    from dlx.parallel.tensor import check_layout
    from dlx.train.data import inspect_dataset
    from dlx.train.measure import point_config

    config = point_config(setup, max(points, key=lambda p: p.seq_len))
    check_layout(config.parallel, setup.world_size)
    if setup.data != SYNTHETIC:
        check_vocab_fits(Path(setup.data), setup.model, config.model.args.vocab_size)
    inspect_dataset(config)


def check_vocab_fits(data: Path, model: str, model_vocab: int) -> None:
    """bench's own line for a dataset whose ids outgrow the model (`dlx pretrain`'s names a flag bench lacks)."""
    from dlx.data.shards import read_manifest
    from dlx.errors import UserError

    vocab = read_manifest(data).vocab_size
    if vocab > model_vocab:
        raise UserError(
            f"--data {data} has vocab_size {vocab:,}, larger than the {model_vocab:,} of --model {model}; give --model "
            f"a YAML/JSON of ModelArgs with vocab_size {vocab} (`dlx params {model} --json` prints its model_args)"
        )


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
    header = environment_lines(setup.device)
    if setup.compile:
        header.append("- torch.compile: each point compiled afresh (torch._dynamo.reset() before it), static shapes")
    atomic_write_text(out_dir / TABLE_NAME, markdown_table(rows, header) + "\n")
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
    from dlx.device import ALLOC_CONF_VARIABLES, device_name, peak_memory_method

    allocator = [f"{name}={os.environ[name]}" for name in ALLOC_CONF_VARIABLES if os.environ.get(name)]
    return [
        f"# dlx bench, {datetime.datetime.now().astimezone():%Y-%m-%d %H:%M %Z}",
        "",
        f"- command: `{shlex.join(['dlx', *sys.argv[1:]])}`",
        f"- dlx {dlx.__version__}, python {platform.python_version()}, torch {torch.__version__}",
        f"- device: {device_name(device)}",
        f"- peak memory: {peak_memory_method(device)}",
        *([f"- CUDA allocator: {', '.join(allocator) or 'default settings'}"] if device.type == "cuda" else []),
    ]


def register(app: typer.Typer) -> None:
    app.command("bench", help=BENCH_HELP)(bench)
