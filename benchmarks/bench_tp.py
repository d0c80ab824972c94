"""Tensor parallelism and sharded checkpoints on CPU: three measurements, appended to BENCHMARKS.md ("Tensor
parallelism, meta-device build, asynchronous checkpoints").

1. state: per-rank bytes of parameters, gradients and AdamW state after one optimizer step (fp32, the `demo` preset),
   for tp 1 and 2, FSDP over 2 ranks, fsdp × tp 2 and ddp × tp 2 on 4 ranks (gloo), beside `dlx plan`'s estimate of
   the same three terms. Counted from the tensors each rank holds (its local shards), the largest rank reported.
2. meta: llama3-8b built on the meta device, tensor-parallelised and FSDP2-wrapped as rank 0 of dp 8 × tp 2 = 16 ranks
   (torch's fake process group: one process, real shapes, no communication); the process's peak resident set size
   without materialising anything, and after materialising rank 0's shards (fp32), against one full fp32 copy.
3. saves: `dlx pretrain` with FSDP on 2 ranks saving every 2 steps, `checkpoint.async` false vs true in interleaved
   rounds; the wall time the step loop waits for each periodic save (the stall), and the mean step time.

Run:  .venv/bin/python benchmarks/bench_tp.py [--only state,meta,saves] [--rounds 3] [--no-record]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchmarks/, so that `peers` imports as a package
from dlx.metrics.estimate import TrainingShape, plan_memory
from dlx.model.presets import resolve_model_args
from peers.record import environment, record_section

WORKER = Path(__file__).with_name("tp_worker.py")
SECTION = "Tensor parallelism, meta-device build, asynchronous checkpoints"
STATE_MODEL, SEQ, MICRO = "demo", 64, 2
LAYOUTS = [  # (label, ranks, strategy, tp)
    ("one process", 1, "none", 1),
    ("fsdp 2", 2, "fsdp", 1),
    ("tp 2", 2, "none", 2),
    ("fsdp 2 × tp 2", 4, "fsdp", 2),
    ("ddp 2 × tp 2", 4, "ddp", 2),
]
SAVE_RUN = shlex.split(
    "--model.preset demo --data.seq_len 256 --data.micro_batch_size 4 --train.precision fp32"
    " --train.max_steps 12 --checkpoint.every 2 --checkpoint.keep_last 2 --eval.every 0"
    " --log.every 1 --log.progress false --parallel.strategy fsdp"
)


def launch(args: list[str], ranks: int, cwd: Path, timeout: float = 1200) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    runner = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(ranks)]
    command = (runner if ranks > 1 else [sys.executable]) + [str(WORKER), *args]
    result = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{result.stderr[-4000:]}")


def measure_state(work: Path) -> list[str]:
    rows = [
        "| layout | ranks | params MB | grads MB | AdamW MB | total MB per rank | `dlx plan` MB | measured / plan |",
        "|---|---|---|---|---|---|---|---|",
    ]
    args = resolve_model_args(STATE_MODEL)
    for label, ranks, strategy, tp in LAYOUTS:
        out = work / f"state-{ranks}-{strategy}-{tp}.json"
        overrides = [
            "--model.preset",
            STATE_MODEL,
            "--data.seq_len",
            str(SEQ),
            "--data.micro_batch_size",
            str(MICRO),
            "--train.precision",
            "fp32",
            "--train.max_steps",
            "1",
            "--parallel.strategy",
            strategy,
            "--parallel.tp",
            str(tp),
        ]
        launch(["state", str(out), *overrides], ranks, work)
        per_rank = json.loads(out.read_text())
        worst = max(per_rank, key=lambda r: r["params"] + r["grads"] + r["optimizer"])
        total = worst["params"] + worst["grads"] + worst["optimizer"]
        shape = TrainingShape(SEQ, MICRO, precision="fp32", strategy=strategy, world_size=ranks, tp=tp)
        plan = plan_memory(args, shape)
        planned = (plan.weights_gb + plan.grads_gb + plan.optimizer_gb) * 1e9
        mb = [f"{worst[k] / 1e6:.2f}" for k in ("params", "grads", "optimizer")]
        rows.append(
            f"| {label} | {ranks} | {' | '.join(mb)} | {total / 1e6:.2f} | {planned / 1e6:.2f} | "
            f"{total / planned:.3f} |"
        )
        print(rows[-1], flush=True)
    return rows


def measure_meta(work: Path) -> list[str]:
    args = resolve_model_args("llama3-8b")
    full_gb = plan_memory(args, TrainingShape(1, 1, precision="fp32")).weights_gb
    rows = ["| llama3-8b, rank 0 of dp 8 × tp 2 | peak RSS GB | rank 0's shards GB | seconds |", "|---|---|---|---|"]
    steps = (("meta build + TP + FSDP2 wrap", []), ("… + materialise rank 0's shards (fp32)", ["--materialize"]))
    for label, flag in steps:
        out = work / f"meta{len(flag)}.json"
        launch(["meta", str(out), "llama3-8b", "8", "2", *flag], 1, work)
        result = json.loads(out.read_text())
        rows.append(f"| {label} | {result['peak_rss_gb']:.2f} | {result['shard_gb']:.2f} | {result['seconds']:.0f} |")
        print(rows[-1], flush=True)
    rows.append(f"| one full fp32 copy of the weights (for scale) | {full_gb:.2f} | | |")
    return rows


def measure_saves(work: Path, rounds: int) -> list[str]:
    stalls: dict[str, list[float]] = {"sync": [], "async": []}
    steps: dict[str, list[float]] = {"sync": [], "async": []}
    for index in range(rounds):
        for mode in ("sync", "async") if index % 2 == 0 else ("async", "sync"):
            run_dir = work / f"saves-{mode}-{index}"
            out = work / f"saves-{mode}-{index}.json"
            flags = ["--checkpoint.async", "true" if mode == "async" else "false", "--run-dir", str(run_dir)]
            launch(["saves", str(out), *SAVE_RUN, *flags], 2, work)
            stalls[mode] += json.loads(Path(f"{out}.rank0").read_text())
            records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
            steps[mode] += [r["step_s"] for r in records if r["step"] > 1]
            print(f"round {index + 1} {mode}: stalls {[round(s, 3) for s in stalls[mode][-5:]]}", flush=True)
    rows = [
        "| checkpoint.async | periodic saves | stall per save, median ms (min–max) | mean step ms |",
        "|---|---|---|---|",
    ]
    for mode, flag in (("sync", "false"), ("async", "true")):
        s = stalls[mode]
        rows.append(
            f"| {flag} | {len(s)} | {1e3 * statistics.median(s):.0f} ({1e3 * min(s):.0f}–{1e3 * max(s):.0f}) | "
            f"{1e3 * statistics.mean(steps[mode]):.0f} |"
        )
    ratio = statistics.median(stalls["async"]) / statistics.median(stalls["sync"])
    rows.append("")
    rows.append(f"Median stall, async ÷ sync: {ratio:.2f}.")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="state,meta,saves", help="comma-separated: state, meta, saves")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved sync/async rounds for `saves`")
    parser.add_argument("--no-record", action="store_true", help="print only; do not append to BENCHMARKS.md")
    options = parser.parse_args()
    parts = options.only.split(",")
    lines = [f"### {datetime.date.today().isoformat()}", "", *environment(["src", "benchmarks"]), ""]
    with tempfile.TemporaryDirectory(prefix="dlx-bench-tp-") as tmp:
        work = Path(tmp)
        if "state" in parts:
            intro = f"Per-rank state after one AdamW step, `{STATE_MODEL}` preset, fp32:"
            lines += [intro, "", *measure_state(work), ""]
        if "meta" in parts:
            lines += ["llama3-8b on the meta device:", "", *measure_meta(work), ""]
        if "saves" in parts:
            lines += [
                "Checkpoint stall, FSDP on 2 ranks, `demo` preset, a save every 2 of 12 steps:",
                "",
                *measure_saves(work, options.rounds),
                "",
            ]
    print("\n".join(lines))
    if not options.no_record:
        record_section(SECTION, INTRO, lines)


INTRO = (
    "Measured by `benchmarks/bench_tp.py` on CPU with gloo; times are compared only within one run (each entry "
    "states the machine's load). Byte counts are exact."
)

if __name__ == "__main__":
    main()
