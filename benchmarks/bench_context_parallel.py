"""Context parallelism: appended to BENCHMARKS.md ("Context parallelism").

1. communication: the `demo` model (4 layers, 2 kv heads × 64, fp32, micro-batch 2 × 256 tokens) trained on cp gloo
   ranks (1 = parallel.cp_path in one process, 2, 4); the bytes the cp attention's all-gathers produce and its
   reduce-scatters take per step, counted at the calls (benchmarks/cp_worker.py), and what each rank sends of them
   in a ring ((cp − 1)/cp), against `dlx.metrics.communication.cp_communication_bytes`; the step time beside it.
2. plan: `dlx plan`'s memory and communication per GPU for llama3.2-1b and llama3-8b at 32k, 64k and 128k tokens on
   8 GPUs (fsdp, cp 8, full activation checkpointing, bf16, micro-batch 1), against cp 1.
3. torch: PyTorch's experimental `context_parallel` on 2 gloo ranks with causal SDPA on the CPU: what it raises.

Run:  .venv/bin/python benchmarks/bench_context_parallel.py [--no-record]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchmarks/, so that `peers` imports as a package
from dlx.metrics.communication import communication_bytes, cp_communication_bytes
from dlx.metrics.estimate import TrainingShape, plan_memory
from dlx.model.presets import resolve_model_args
from peers.record import environment, record_section

WORKER = Path(__file__).with_name("cp_worker.py")
SECTION = "Context parallelism"
INTRO = (
    "parallel.cp: each rank holds 1/cp of every sequence (chunks i and 2·cp−1−i), attention all-gathers keys and "
    "values over the cp group and reduce-scatters their gradients (dlx.parallel.context). Measured on gloo CPU ranks "
    "and on paper with `dlx plan`; benchmarks/bench_context_parallel.py."
)


def run_worker(ranks: int, mode: str, work: Path) -> dict:
    out = work / f"{mode}.json"
    runner = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(ranks)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    command = [*runner, str(WORKER), str(out), mode]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
    if result.returncode != 0:
        raise SystemExit(f"cp_worker {mode} failed:\n{result.stderr[-4000:]}")
    return json.loads(out.read_text())


def communication_rows(work: Path) -> list[str]:
    rows = [
        "| cp | gathered MB/step | reduce-scattered MB/step | sent per rank MB (measured) | formula MB | "
        "measured / formula | step ms |",
        "|---|---|---|---|---|---|---|",
    ]
    args = resolve_model_args("demo")
    for cp in (1, 2, 4):
        found = run_worker(cp, str(cp), work)
        sent = (found["gathered"] + found["scattered"]) * (cp - 1) / cp
        shape = TrainingShape(seq_len=256, micro_batch=2, precision="fp32", strategy="ddp", world_size=cp, cp=cp)
        formula = cp_communication_bytes(args, shape)
        ratio = f"{sent / formula:.4f}" if formula else "— (nothing sent)"
        rows.append(
            f"| {cp} | {found['gathered'] / 1e6:.3f} | {found['scattered'] / 1e6:.3f} | {sent / 1e6:.3f} | "
            f"{formula / 1e6:.3f} | {ratio} | {found['step_ms']:.0f} |"
        )
    return rows


def plan_rows() -> list[str]:
    header = [
        "| model | seq len | cp | peak GB per GPU | activations GB | cp sent GB/step | FSDP sent GB/step |",
        "|---|---|---|---|---|---|---|",
    ]
    models, seq_lens = ("llama3.2-1b", "llama3-8b"), (32768, 65536, 131072)
    return header + [plan_row(model, seq_len, cp) for model in models for seq_len in seq_lens for cp in (1, 8)]


def plan_row(model: str, seq_len: int, cp: int) -> str:
    """`dlx plan`'s peak memory and communication for one model at one sequence length and cp degree (8 GPUs)."""
    args = resolve_model_args(model)
    shape = TrainingShape(
        seq_len=seq_len, micro_batch=1, strategy="fsdp", world_size=8, cp=cp, activation_checkpointing="full"
    )
    plan, sent = plan_memory(args, shape), communication_bytes(args, shape)
    return (
        f"| {model} | {seq_len:,} | {cp} | {plan.total_gb:.1f} | {plan.activations_gb:.2f} | "
        f"{sent.context_parallel / 1e9:.2f} | {sent.sharding / 1e9:.2f} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-record", action="store_true", help="Print only; do not append to BENCHMARKS.md.")
    options = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        communication = communication_rows(Path(tmp))
        torch_cp = run_worker(2, "probe", Path(tmp))["outcome"]
    lines = [
        *environment(["src/dlx/parallel", "src/dlx/metrics", "benchmarks/bench_context_parallel.py", str(WORKER)]),
        "",
        "Communication per step on gloo CPU ranks (the `demo` model, fp32, 2 × 256 tokens), counted at the calls:",
        "",
        *communication,
        "",
        "On paper (`dlx plan`, 8 GPUs, fsdp, full activation checkpointing, bf16, micro-batch 1; CUDA kernels):",
        "",
        *plan_rows(),
        "",
        f"PyTorch's `torch.distributed.tensor.experimental.context_parallel`, gloo CPU, causal SDPA: `{torch_cp}`",
    ]
    print("\n".join(lines))
    if not options.no_record:
        record_section(SECTION, INTRO, lines)


if __name__ == "__main__":
    main()
