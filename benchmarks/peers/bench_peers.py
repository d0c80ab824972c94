"""Peers: the same model and synthetic tokens trained by a bare PyTorch loop, by `dlx pretrain` and by HF
Trainer with transformers.LlamaForCausalLM, in fp32 and in bf16 autocast, in one run, as a ratio table.

See peers/contenders.py for what each loop does. All six (three loops × two precisions) take turns round by round, the
order rotating; each ratio is taken within a round, and the table shows its median and range over the rounds. Targets:
dlx ≥ 0.97× the bare loop and ≥ 1.0× HF Trainer at equal precision; dlx at its default precision ≥ 1.5× HF Trainer at
its default (fp32). dlx's default is `train.precision: auto`: bf16 where the CPU runs it natively (AVX512-BF16 or
AMX), else fp32; where auto gives fp32, bf16 passed explicitly is compared as well.

Run:  .venv/bin/python benchmarks/peers/bench_peers.py   (appends to BENCHMARKS.md, "Peers"; --no-record: print only)
"""

from __future__ import annotations

import datetime
import statistics
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/, so that `peers` imports as a package
from dlx.precision import resolve_precision
from peers.contenders import BARE, BATCH, DLX, HF, SEQ, TOKENS_PER_STEP, build, round_parser, rounds, spread
from peers.record import PEERS_SECTION, environment, publish

WATCHED = ["src/dlx/train", "src/dlx/metrics", "src/dlx/model", "benchmarks/peers"]


def ratio(results: dict[str, list[float]], top: str, bottom: str) -> list[float]:
    return [a / b for a, b in zip(results[top], results[bottom], strict=True)]


def speed_table(results: dict[str, list[float]]) -> list[str]:
    rows = ["| loop | tokens/s, median (min, max) | ms / step (median) |", "|---|---|---|"]
    for name, values in results.items():
        median = statistics.median(values)
        rows.append(
            f"| {name} | {median:,.0f} ({min(values):,.0f}, {max(values):,.0f}) "
            f"| {1e3 * TOKENS_PER_STEP / median:.0f} |"
        )
    return rows


def ratio_table(results: dict[str, list[float]], precisions: list[str], auto: str) -> list[str]:
    """The three comparisons, per precision where it applies, each against its target. dlx's default is what
    `auto` gives on this CPU; where that is fp32, bf16 passed explicitly is compared too."""
    checks = []
    for precision in precisions:
        checks.append((f"dlx ÷ bare loop, {precision}", f"{DLX} {precision}", f"{BARE} {precision}", 0.97))
        checks.append((f"dlx ÷ HF Trainer, {precision}", f"{DLX} {precision}", f"{HF} {precision}", 1.0))
    default = f"dlx at its default (`auto` = {auto} here) ÷ HF Trainer at its default (fp32)"
    checks.append((default, f"{DLX} {auto}", f"{HF} fp32", 1.5))
    if auto != "bf16":
        checks.append(("dlx bf16 (passed explicitly) ÷ HF Trainer fp32", f"{DLX} bf16", f"{HF} fp32", 1.5))
    rows = ["| comparison | ratio per round: median (min, max) | target | met (median) |", "|---|---|---|---|"]
    for label, top, bottom, target in checks:
        if top in results and bottom in results:
            values = ratio(results, top, bottom)
            met = "yes" if statistics.median(values) >= target else "**no**"
            rows.append(f"| {label} | {spread(values)} | ≥ {target:g} | {met} |")
    return rows


def precision_note(auto: str) -> str:
    if auto == "bf16":
        return "dlx's default (`train.precision: auto`) is bf16 on this CPU"
    return (
        "dlx's default (`train.precision: auto`) is fp32 on this CPU (no AVX512-BF16 or AMX: bf16 matmuls are "
        "emulated); bf16 rows, where measured, pass `--train.precision bf16` explicitly"
    )


def main() -> None:
    parser = round_parser(__doc__.splitlines()[0], rounds=5, steps=4, warmup=2)
    parser.add_argument("--precisions", default="fp32,bf16", help="comma-separated: fp32, bf16")
    args = parser.parse_args()
    precisions = [p.strip() for p in args.precisions.split(",")]
    auto = resolve_precision("auto", torch.device("cpu"))
    header = environment(WATCHED)
    kinds = [BARE, DLX] + ([] if args.no_hf else [HF])
    with tempfile.TemporaryDirectory(prefix="dlx-bench-peers-") as tmp:
        contenders = [build(kind, precision, Path(tmp)) for precision in precisions for kind in kinds]
        try:
            results = rounds(contenders, args.rounds, args.steps, args.warmup)
        finally:
            for contender in contenders:
                contender.close()
    lines = [
        f"### {datetime.datetime.now().astimezone():%Y-%m-%d %H:%M %Z}",
        "",
        *header,
        "",
        f"demo model (dim 256, 4 layers, vocab 8192), seq {SEQ}, micro-batch {BATCH}, fused AdamW, synthetic "
        f"tokens; {args.rounds} interleaved rounds of {args.steps} steps after {args.warmup} warm-up steps each; "
        f"{precision_note(auto)}:",
        "",
        *speed_table(results),
        "",
        *ratio_table(results, precisions, auto),
    ]
    publish(*PEERS_SECTION, lines, record=not args.no_record)


if __name__ == "__main__":
    main()
