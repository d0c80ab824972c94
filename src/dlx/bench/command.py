"""What `dlx bench` does once its options are parsed: check the model and the dataset, share the sweep among
torchrun's ranks, measure every point (`sweep`, `measure`) and write the tables with the command, versions and device
at their head."""

from __future__ import annotations

import contextlib
import datetime
import io
import os
import platform
import shlex
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import torch

import dlx
from dlx import device as dev
from dlx.atomic import atomic_write_text
from dlx.bench.measure import point_config
from dlx.bench.plot import plot_sweep
from dlx.bench.points import BenchPoint, BenchSetup
from dlx.bench.results import markdown_table, read_rows, write_rows
from dlx.bench.sweep import CSV_NAME, PLOT_NAME, TABLE_NAME, MemoryBudget, find_max_batch, run_sweep
from dlx.data import SYNTHETIC
from dlx.data.shards import read_manifest
from dlx.errors import UserError
from dlx.parallel import distributed
from dlx.parallel.tensor import check_layout
from dlx.train.build.data import inspect_dataset


def run_bench(
    setup: BenchSetup, points: list[BenchPoint], out_dir: Path, memory_limit_gb: float | None, max_batch: bool
) -> None:
    """The sweep of `points` into `out_dir`; with `max_batch`, the largest micro-batch per seq len and precision."""
    check_inputs(setup, points)
    budget = memory_budget(setup.device, memory_limit_gb)
    with ranks_share_the_sweep(setup, out_dir) as folder:
        if max_batch:
            seq_lens = list(dict.fromkeys(point.seq_len for point in points))
            precisions = list(dict.fromkeys(point.precision for point in points))
            report_max_batch(setup, seq_lens, precisions, budget, folder)
        else:
            write_sweep(setup, points, budget, folder)


@contextlib.contextmanager
def ranks_share_the_sweep(setup: BenchSetup, out_dir: Path) -> Iterator[Path]:
    """Under torchrun every rank runs the same sweep in step (each point is one distributed measurement); rank 0 writes
    and prints, the others work in a temporary folder holding rank 0's earlier rows (so that all skip the same
    points) and print nothing. Without torchrun: `out_dir` itself."""
    if setup.world_size == 1:
        yield out_dir
        return
    distributed.init_distributed(setup.device, False, timeout_s=600.0, tp=setup.tp, cp=setup.cp)
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


def check_inputs(setup: BenchSetup, points: list[BenchPoint]) -> None:
    """The model and the dataset, checked before anything runs (a UserError names what is wrong)."""
    config = point_config(setup, max(points, key=lambda p: p.seq_len))
    check_layout(config.parallel, setup.world_size)
    if setup.data != SYNTHETIC:
        check_vocab_fits(Path(setup.data), setup.model, config.model.args.vocab_size)
    inspect_dataset(config)


def check_vocab_fits(data: Path, model: str, model_vocab: int) -> None:
    """bench's own line for a dataset whose ids outgrow the model (`dlx pretrain`'s names a flag bench lacks)."""
    vocab = read_manifest(data).vocab_size
    if vocab > model_vocab:
        raise UserError(
            f"--data {data} has vocab_size {vocab:,}, larger than the {model_vocab:,} of --model {model}; give --model "
            f"a YAML/JSON of ModelArgs with vocab_size {vocab} (`dlx params {model} --json` prints its model_args)"
        )


def memory_budget(device: torch.device, limit_gb: float | None) -> MemoryBudget:
    if limit_gb is not None:
        if limit_gb <= 0:
            raise UserError(f"--memory-limit-gb must be positive, got {limit_gb}")
        return MemoryBudget(limit_gb, skip_by_estimate=True)
    return MemoryBudget(dev.memory_budget_gb(device), skip_by_estimate=device.type != "cuda")


def write_sweep(setup: BenchSetup, points: list[BenchPoint], budget: MemoryBudget, out_dir: Path) -> None:
    """Measure the points and write bench.csv (row by row), bench.md and bench.png."""
    rows = run_sweep(setup, points, out_dir, budget, say=print)
    header = environment_lines(setup.device)
    if setup.compile:
        header.append("- torch.compile: each point compiled afresh (torch._dynamo.reset() before it), static shapes")
    atomic_write_text(out_dir / TABLE_NAME, markdown_table(rows, header) + "\n")
    plot = plot_sweep(out_dir / PLOT_NAME, rows)
    written = [out_dir / CSV_NAME, out_dir / TABLE_NAME, *([plot] if plot else [])]
    print("wrote " + ", ".join(str(path) for path in written))


def report_max_batch(
    setup: BenchSetup, seq_lens: list[int], precisions: list[str], budget: MemoryBudget, out_dir: Path
) -> None:
    """The largest micro-batch per precision and seq len, measured and estimated, printed and in max_batch.md."""
    rows = find_max_batch(setup, seq_lens, precisions, budget)
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


def environment_lines(device: torch.device) -> list[str]:
    """The command, versions, device and memory method, for the head of every table."""
    allocator = [f"{name}={os.environ[name]}" for name in dev.ALLOC_CONF_VARIABLES if os.environ.get(name)]
    return [
        f"# dlx bench, {datetime.datetime.now().astimezone():%Y-%m-%d %H:%M %Z}",
        "",
        f"- command: `{shlex.join(['dlx', *sys.argv[1:]])}`",
        f"- dlx {dlx.__version__}, python {platform.python_version()}, torch {torch.__version__}",
        f"- device: {dev.device_name(device)}",
        f"- peak memory: {dev.peak_memory_method(device)}",
        *([f"- CUDA allocator: {', '.join(allocator) or 'default settings'}"] if device.type == "cuda" else []),
    ]
