"""`dlx bench`: throughput tables (it/s, memory, FLOPS across seq len, batch and accumulation) in one command, each
measured point beside `dlx plan`'s estimate."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Annotated

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
    strategy: Annotated[
        str, typer.Option(help="Under torchrun: none, ddp, fsdp or hsdp (parallel.strategy).")
    ] = "none",
    tp: Annotated[int, typer.Option(help="Under torchrun: tensor-parallel ranks per replica (parallel.tp).")] = 1,
    cp: Annotated[int, typer.Option(help="Under torchrun: context-parallel ranks per replica (parallel.cp).")] = 1,
    cp_path: Annotated[
        bool, typer.Option("--cp-path", help="The context-parallel code path also at cp 1 (parallel.cp_path).")
    ] = False,
    dp_replicate: Annotated[int, typer.Option(help="hsdp: replicas, each sharded (parallel.dp_replicate).")] = 1,
    document_mask: Annotated[
        bool,
        typer.Option(
            "--document-mask", help="Attention inside each document of --data (data.document_mask; needs a dataset)."
        ),
    ] = False,
) -> None:
    from dlx.bench.command import run_bench
    from dlx.bench.points import BenchSetup, expand_points, parse_positive_ints, parse_precisions
    from dlx.data import SYNTHETIC
    from dlx.device import training_device
    from dlx.errors import UserError
    from dlx.parallel.distributed import env_from_torchrun
    from dlx.parallel.traits import STRATEGY_TRAITS
    from dlx.precision import resolve_precision

    if steps < 1 or warmup < 0:
        raise UserError(f"--steps must be at least 1 and --warmup at least 0, got {steps} and {warmup}")
    benched = [name for name, traits in STRATEGY_TRAITS.items() if traits.benched]
    if strategy not in benched or tp < 1:
        raise UserError(f"--strategy must be {', '.join(benched)} and --tp at least 1, got {strategy!r} and {tp}")
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
    setup = replace(setup, cp=cp, cp_path=cp_path, dp_replicate=dp_replicate)
    points = expand_points(
        seq_lens,
        parse_positive_ints("--micro-batch", micro_batch),
        parse_positive_ints("--grad-accum", grad_accum),
        precisions,
    )
    out_dir = out or Path("runs") / "bench" / (Path(model).stem + (f"-{strategy}-tp{tp}" if world_size > 1 else ""))
    run_bench(setup, points, out_dir, memory_limit_gb, find_max_batch)


def register(app: typer.Typer) -> None:
    app.command("bench", help=BENCH_HELP)(bench)
