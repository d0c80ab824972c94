"""Trainer overhead: `dlx pretrain`'s step loop against a bare PyTorch loop, and against HF Trainer, in fp32.

The three loops, the model (the `demo` preset with vocab 8192, seq 256, micro-batch 8, fused AdamW) and the interleaved
rounds are shared with the peers benchmark: see benchmarks/peers/contenders.py. Contenders take turns round by round
(the order rotates), so that noise from other processes on the machine hits all alike; each round's ratio is taken
against bare in the same round. The table shows the median and the spread. Also measured: what the PhaseTimer itself
costs per step (the "< 1 % of a step" requirement).

Run:  .venv/bin/python benchmarks/bench_trainer.py          (appends to BENCHMARKS.md; --no-record to only print)
"""

from __future__ import annotations

import datetime
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from dlx.metrics.timing import PhaseTimer
from peers.contenders import BARE, BATCH, DLX, HF, SEQ, TOKENS_PER_STEP, build, round_parser, rounds, spread
from peers.record import environment, publish


def timer_cost_per_step(repeats: int = 20_000, log_every: int = 10) -> float:
    """Seconds the PhaseTimer adds to one step: 4 phases entered (one micro-step), end_step, and a window read every
    `log_every` steps (the loop's default log.every), on the CPU."""
    timer = PhaseTimer(torch.device("cpu"))
    start = time.perf_counter()
    for index in range(repeats):
        for name in ("data_wait", "forward", "backward", "optimizer"):
            with timer.phase(name):
                pass
        timer.end_step()
        if index % log_every == 0:
            timer.window()
    return (time.perf_counter() - start) / repeats


def table(results: dict[str, list[float]]) -> list[str]:
    bare = results[f"{BARE} fp32"]
    rows = ["| loop | tokens/s (median) | ms / step | × bare, per round: median (min, max) |", "|---|---|---|---|"]
    for name, values in results.items():
        ratios = [v / b for v, b in zip(values, bare, strict=True)]
        median = statistics.median(values)
        rows.append(f"| {name} | {median:,.0f} | {1e3 * TOKENS_PER_STEP / median:.0f} | {spread(ratios)} |")
    if f"{HF} fp32" in results:
        ratios = [d / h for d, h in zip(results[f"{DLX} fp32"], results[f"{HF} fp32"], strict=True)]
        rows.append(f"| dlx ÷ HF Trainer | | | {spread(ratios)} |")
    return rows


def build_contenders(tmp: Path, with_hf: bool) -> list:
    contenders: list = [build(BARE, "fp32", tmp), build(DLX, "fp32", tmp)]
    if with_hf:
        try:
            contenders.append(build(HF, "fp32", tmp))
        except ImportError as e:
            print(f"HF Trainer skipped: {e} (pip install transformers accelerate)", file=sys.stderr)
    return contenders


def main() -> None:
    args = round_parser(__doc__.splitlines()[0], rounds=6, steps=6, warmup=3).parse_args()
    header = environment(["src/dlx/train", "src/dlx/metrics", "benchmarks"])
    with tempfile.TemporaryDirectory(prefix="dlx-bench-trainer-") as tmp:
        contenders = build_contenders(Path(tmp), not args.no_hf)
        try:
            results = rounds(contenders, args.rounds, args.steps, args.warmup)
        finally:
            for contender in contenders:
                contender.close()
    step_s = TOKENS_PER_STEP / statistics.median(results[f"{DLX} fp32"])
    cost = timer_cost_per_step()
    lines = [
        f"### {datetime.datetime.now().astimezone():%Y-%m-%d %H:%M %Z}",
        "",
        *header,
        "",
        f"demo model (seq {SEQ}, micro-batch {BATCH}, fp32, fused AdamW), synthetic tokens, {args.rounds} "
        f"interleaved rounds of {args.steps} steps after {args.warmup} warm-up steps each:",
        "",
        *table(results),
        "",
        f"PhaseTimer cost: {cost * 1e6:.1f} µs per step = {100 * cost / step_s:.4f} % of a dlx step "
        f"({1e3 * step_s:.0f} ms).",
    ]
    publish(
        "Trainer", "Measured by `benchmarks/bench_trainer.py`; see its docstring.", lines, record=not args.no_record
    )


if __name__ == "__main__":
    main()
