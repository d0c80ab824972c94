"""GPU points for FSDP × tensor parallelism: `dlx bench` under torchrun for the llama3.2-3b and llama3-8b shapes, FSDP2
over the data-parallel ranks and tp 1 (plain FSDP, the baseline), 2, 4 and 8 within each replica, bf16, on one node.

Each (model, tp) is one sweep into runs/gpu-bench/MODEL-fsdp-tpT/ (a re-run skips points already measured). The
tables (tokens/s over all ranks; TFLOPS, MFU and peak memory per rank, beside `dlx plan`'s per-rank estimate) are
appended to BENCHMARKS.md, section "GPU, FSDP × TP". `tp_commands` is what run_gpu_bench.py may call to add these
points to its own run.

Run:  .venv/bin/python benchmarks/gpu/tp_points.py --gpus 8             (needs 8 CUDA GPUs on one node)
      .venv/bin/python benchmarks/gpu/tp_points.py --gpus 8 --dry-run   (prints the commands, runs nothing)
"""

from __future__ import annotations

import argparse
import datetime
import shlex
import subprocess
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/, so that `peers` imports as a package
from dlx.bench.results import markdown_table, read_rows
from dlx.bench.sweep import CSV_NAME
from peers.record import ROOT, environment, publish

MODELS = ("llama3.2-3b", "llama3-8b")
TPS = (1, 2, 4, 8)


def tp_commands(
    models: list[str], gpus: int, seq_len: str, micro_batch: str, steps: int, warmup: int, out: Path
) -> list[tuple[Path, list[str]]]:
    """(output folder, torchrun argv) per model and tp; tp values that do not divide `gpus` are left out."""
    commands = []
    for model in models:
        for tp in (t for t in TPS if gpus % t == 0):
            folder = out / f"{model}-fsdp-tp{tp}"
            argv = [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--standalone",
                "--nproc_per_node",
                str(gpus),
                "-m",
                "dlx",
                "bench",
                "--model",
                model,
                "--strategy",
                "fsdp",
                "--tp",
                str(tp),
                "--seq-len",
                seq_len,
                "--micro-batch",
                micro_batch,
                "--precision",
                "bf16",
                "--steps",
                str(steps),
                "--warmup",
                str(warmup),
                "--out",
                str(folder),
            ]
            commands.append((folder, argv))
    return commands


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS), help="comma-separated presets")
    parser.add_argument("--gpus", type=int, default=8, help="GPUs on this node (torchrun --nproc_per_node)")
    parser.add_argument("--seq-len", default="2048,4096")
    parser.add_argument("--micro-batch", default="1,2,4")
    parser.add_argument("--steps", type=int, default=10, help="timed steps per point")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps per point")
    parser.add_argument("--out", type=Path, default=Path("runs/gpu-bench"), help="relative to the repository root")
    parser.add_argument("--dry-run", action="store_true", help="print the commands and exit")
    parser.add_argument("--no-record", action="store_true", help="print only; do not append to BENCHMARKS.md")
    args = parser.parse_args()
    models = args.models.split(",")
    commands = tp_commands(models, args.gpus, args.seq_len, args.micro_batch, args.steps, args.warmup, args.out)
    if args.dry_run:
        print("\n".join(shlex.join(argv) for _, argv in commands))
        return
    if torch.cuda.device_count() < args.gpus:
        sys.exit(f"error: {args.gpus} CUDA GPUs needed, {torch.cuda.device_count()} here (--dry-run prints commands)")
    failed = []
    for _, argv in commands:
        print(f"$ {shlex.join(argv)}", flush=True)
        code = subprocess.run(argv, cwd=ROOT).returncode
        if code != 0:
            failed.append(f"- failed (exit {code}): `{shlex.join(argv[3:])}`")
    stamp = f"### {datetime.datetime.now().astimezone():%Y-%m-%d %H:%M %Z}"
    lines = [stamp, "", *environment(["src/dlx", "benchmarks/gpu"]), *failed, ""]
    for folder, argv in commands:
        lines += [f"`{shlex.join(argv[3:])}`", "", markdown_table(read_rows(ROOT / folder / CSV_NAME), []), ""]
    publish(
        "GPU, FSDP × TP",
        "Measured by `benchmarks/gpu/tp_points.py`; see its docstring.",
        lines,
        record=not args.no_record,
    )


if __name__ == "__main__":
    main()
