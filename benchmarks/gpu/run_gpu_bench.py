"""GPU throughput and MFU: `dlx bench` for `llama3.2-1b` and `small-125m` at seq 1024 and 2048, bf16, with
and without `--compile`, and the tables (with MFU in both conventions) appended to BENCHMARKS.md, section "GPU".

Each model × compile setting is one `dlx bench` sweep into runs/gpu-bench/ (a re-run skips points already measured, so
an interrupted run carries on). Micro-batches that run out of memory are marked OOM, not a crash. The target is
≥ 50 % MFU (attention-inclusive convention) for llama3.2-1b on an H200; the summary line says whether it was met.

Run:  .venv/bin/python benchmarks/gpu/run_gpu_bench.py             (needs a CUDA GPU; appends to BENCHMARKS.md)
      .venv/bin/python benchmarks/gpu/run_gpu_bench.py --dry-run   (prints the commands, runs nothing)
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
from peers.record import ROOT, environment, record_section

MODELS = ("llama3.2-1b", "small-125m")
MFU_TARGET = {"llama3.2-1b": 0.50}


def bench_commands(args: argparse.Namespace) -> list[tuple[Path, list[str]]]:
    """(output folder, `dlx bench` argv) per model and compile setting."""
    dlx = Path(sys.executable).with_name("dlx")
    dlx = str(dlx.relative_to(ROOT)) if dlx.is_relative_to(ROOT) else str(dlx)  # commands run from ROOT
    commands = []
    for model in args.models.split(","):
        for compiled in (False, True):
            out = args.out / f"{model}{'-compile' if compiled else ''}"
            argv = [
                dlx,
                "bench",
                "--model",
                model,
                "--seq-len",
                args.seq_len,
                "--micro-batch",
                args.micro_batch,
                "--precision",
                "bf16",
                "--steps",
                str(args.steps),
                "--warmup",
                str(args.warmup),
                "--out",
                str(out),
                *(["--compile"] if compiled else []),
            ]
            commands.append((out, argv))
    return commands


def summary(rows: list[dict]) -> list[str]:
    """The best MFU per model and compile setting, against the target where there is one."""
    lines = []
    for model in sorted({row["model"] for row in rows}):
        for compiled in ("off", "on"):
            ok = [r for r in rows if r["model"] == model and r["compile"] == compiled and r["status"] == "ok"]
            if not ok or ok[0]["mfu"] == "":
                continue
            best = max(ok, key=lambda r: r["mfu"])
            target = MFU_TARGET.get(model)
            met = target is not None and best["mfu"] >= target
            verdict = "" if target is None else f" (target ≥ {target:.0%}: {'met' if met else 'not met'})"
            lines.append(
                f"- {model}, compile {compiled}: best MFU {best['mfu']:.1%} (dense {best['mfu_dense']:.1%})"
                f" at seq {best['seq_len']}, micro-batch {best['micro_batch']}{verdict}"
            )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS), help="comma-separated presets")
    parser.add_argument("--seq-len", default="1024,2048")
    parser.add_argument("--micro-batch", default="1,2,4,8,16")
    parser.add_argument("--steps", type=int, default=10, help="timed steps per point")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps per point (covers compilation)")
    parser.add_argument("--out", type=Path, default=Path("runs/gpu-bench"), help="relative to the repository root")
    parser.add_argument("--dry-run", action="store_true", help="print the commands and exit")
    parser.add_argument("--no-record", action="store_true", help="print only; do not append to BENCHMARKS.md")
    args = parser.parse_args()
    commands = bench_commands(args)
    if args.dry_run:
        print("\n".join(shlex.join(argv) for _, argv in commands))
        return
    if not torch.cuda.is_available():
        sys.exit("error: no CUDA device here; this benchmark measures GPUs (--dry-run prints its commands)")
    header = environment(["src/dlx", "benchmarks/gpu"])
    failed = []
    for _, argv in commands:  # one failing sweep (a compile error, say) does not lose the others
        print(f"$ {shlex.join(argv)}", flush=True)
        code = subprocess.run(argv, cwd=ROOT).returncode
        if code != 0:
            failed.append(f"- failed (exit {code}): `{shlex.join(['dlx', *argv[1:]])}`")
    rows = [row for out, _ in commands for row in read_rows(ROOT / out / CSV_NAME)]
    stamp = f"### {datetime.datetime.now().astimezone():%Y-%m-%d %H:%M %Z}"
    commands_text = [f"- `{shlex.join(['dlx', *argv[1:]])}`" for _, argv in commands]
    head = [stamp, "", *header, "- the sweeps it ran:", *commands_text, "", *summary(rows), *failed]
    table = markdown_table(rows, head)
    print(table)
    if not args.no_record:
        record_section("GPU", "Measured by `benchmarks/gpu/run_gpu_bench.py`; see its docstring.", table.splitlines())


if __name__ == "__main__":
    main()
