"""`dlx tune` against the exhaustive sweep of the same space, on this machine, in one process.

The exhaustive sweep is `dlx tune`'s own search with its stop rule and caps off: every layout the memory rule admits
is measured with the same real step (`measure_config`). Then `dlx tune` runs as a user runs it (`--budget-min`).
Reported: the wall time of each; tune's pick's tokens/s against the sweep's best, both as the sweep measured them (one
round, so the ratio is not a comparison across two moments of a shared machine) and as tune measured its pick; and,
for every layout tune measured, the prediction it made just before measuring it against the measurement (out of
sample: the model had not seen that point). Last, because the sweep's best is the largest of many noisy
measurements (and so flattered by the noise that made it the largest), the pick and the sweep's best are measured
again, alternately, `--repeats` times each with `--recheck-steps` timed steps, and their median tokens/s compared: the
ratio the 3 % goal is judged on. Run from the repository root:

    python benchmarks/bench_tune.py [--budget-min 1] [--repeats 5] [--no-record]
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RECIPE = "recipes/demo.yaml"
OVERRIDES = ("--data.seq_len", "128", "--train.global_batch_size", "8", "--train.precision", "auto")
KEEP = ("train.compile",)
"""The default space is what `dlx tune` searches for the recipe on one CPU process, torch.compile aside (Inductor's
compile alone is about a minute per layout here, which would make the sweep hours): strategy (none, ddp, fsdp,
deepspeed ZeRO 1/2/3 where DeepSpeed is installed) × activation checkpointing × micro-batch (1, 2, 4, 8) ×
attention (default, math): 144 layouts with DeepSpeed, 72 without. `--small` keeps parallel.strategy and
train.attention too and halves the batch (4 sequences of 64 tokens): 9 layouts, for a loaded machine."""
SMALL_OVERRIDES = ("--data.seq_len", "64", "--train.global_batch_size", "4", "--train.precision", "auto")
SMALL_KEEP = (*KEEP, "parallel.strategy", "train.attention")
INTRO = (
    "`benchmarks/bench_tune.py`: `dlx tune` against the exhaustive sweep of the same space (every layout the memory "
    "rule admits, measured with the same real step), on this CPU with the demo model. Goals: tune's pick within 3 % "
    "of the sweep's best tokens/s, in at most 10 % of the sweep's time; predictions within ±10 % of measurements."
)


def run(settings_kwargs: dict, exhaustive: bool):
    from dlx.bench.tune import search as tune_module
    from dlx.bench.tune.search import TuneSettings, run_tune

    saved = tune_module.STOP_MARGIN
    if exhaustive:
        tune_module.STOP_MARGIN = float("inf")
    try:
        start = time.monotonic()
        result = run_tune(TuneSettings(RECIPE, OVERRIDES, **settings_kwargs))
        return result, time.monotonic() - start
    finally:
        tune_module.STOP_MARGIN = saved


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--budget-min", type=float, default=1.0, help="dlx tune's budget.")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--small", action="store_true", help="The 9-layout space (see SMALL_KEEP).")
    parser.add_argument("--repeats", type=int, default=5, help="Alternate re-measurements of pick and best, each.")
    parser.add_argument("--recheck-steps", type=int, default=6, help="Timed steps per re-measurement.")
    parser.add_argument("--no-record", action="store_true", help="Print only; do not append to BENCHMARKS.md.")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from peers.record import environment, publish

    global OVERRIDES, KEEP
    if args.small:
        OVERRIDES, KEEP = SMALL_OVERRIDES, SMALL_KEEP
    header = environment(["src/dlx", "benchmarks"])
    common = {"keep": KEEP, "steps": args.steps, "warmup": args.warmup}
    tuned, tune_s = run({**common, "budget_s": 60 * args.budget_min}, exhaustive=False)
    sweep, sweep_s = run({**common, "budget_s": 1e9, "max_measured": 10**6}, exhaustive=True)
    recheck = remeasure(tuned, sweep, args)
    lines = [*header, *report(tuned, tune_s, sweep, sweep_s, args), *recheck]
    publish("Tune", INTRO, lines, record=not args.no_record)


def sweep_best(sweep):
    return max((c for c in sweep.candidates if c.record is not None), key=lambda c: c.record["tokens_per_s"])


def remeasure(tuned, sweep, args) -> list[str]:
    """The pick and the sweep's best measured again, alternately, in one process: their median tokens/s."""
    import torch

    from dlx.bench.tune.search import Candidate, TuneSettings, measure_one, needs_group
    from dlx.parallel import distributed

    best, pick = sweep_best(sweep), tuned.winner
    if best.layout == pick.layout:
        return ["", f"- re-measured: not needed (the pick is the sweep's best, {best.layout.label()})"]
    settings = TuneSettings(RECIPE, OVERRIDES, warmup=args.warmup, steps=args.recheck_steps)
    device = torch.device(sweep.device)
    rates: dict[str, list[float]] = {"pick": [], "best": []}
    group = needs_group([pick, best]) and not distributed.group_active()
    if group:
        distributed.init_distributed(device, True, timeout_s=600.0)
    try:
        for _ in range(args.repeats):
            for name, original in (("pick", pick), ("best", best)):
                candidate = Candidate(original.layout, config=original.config)
                measure_one(candidate, settings, device)
                if candidate.record is None:
                    return ["", f"- re-measured: {name} failed: {candidate.drop}"]
                rates[name].append(float(candidate.record["tokens_per_s"]))
    finally:
        if group:
            distributed.teardown()
    pick_median, best_median = statistics.median(rates["pick"]), statistics.median(rates["best"])
    spread = {name: (max(values) - min(values)) / statistics.median(values) for name, values in rates.items()}
    return [
        "",
        f"- re-measured alternately, {args.repeats} × {args.recheck_steps} timed steps each: pick "
        f"{pick_median:,.0f} tokens/s (spread {spread['pick']:.0%}), sweep's best {best_median:,.0f} (spread "
        f"{spread['best']:.0%}); **pick ÷ best {pick_median / best_median:.3f}** (goal ≥ 0.97)",
    ]


def report(tuned, tune_s: float, sweep, sweep_s: float, args) -> list[str]:
    by_label = {c.layout.label(): c for c in sweep.candidates if c.record is not None}
    best = sweep_best(sweep)
    pick = tuned.winner
    pick_in_sweep = by_label.get(pick.layout.label())
    measured = [c for c in tuned.candidates if c.record is not None]
    command = shlex.join(["python", "benchmarks/bench_tune.py", *sys.argv[1:]])
    lines = [
        f"- command: `{command}`; recipe `{RECIPE} {' '.join(OVERRIDES)}`, --keep {', '.join(KEEP)}, "
        f"{args.warmup} warm-up + {args.steps} timed steps per layout",
        f"- space: {len(sweep.candidates)} layouts, {len(by_label)} admitted by the memory rule and measured by the "
        f"sweep; tune measured {len(measured)}",
        "",
        "| | wall s | layout | tokens/s |",
        "|---|---|---|---|",
        f"| exhaustive sweep | {sweep_s:.0f} | best: {best.layout.label()} | {best.record['tokens_per_s']:,.0f} |",
        f"| dlx tune | {tune_s:.0f} | pick: {pick.layout.label()} | {pick.record['tokens_per_s']:,.0f} (tune's own "
        f"run); {pick_in_sweep.record['tokens_per_s']:,.0f} in the sweep |"
        if pick.record and pick_in_sweep
        else f"| dlx tune | {tune_s:.0f} | pick: {pick.layout.label()} | (not measured) |",
        "",
    ]
    if pick_in_sweep:
        ratio = pick_in_sweep.record["tokens_per_s"] / best.record["tokens_per_s"]
        lines.append(
            f"- tune's pick ÷ sweep's best, tokens/s within the sweep's round: {ratio:.3f} (goal ≥ 0.97); "
            f"tune's time ÷ sweep's: {tune_s / sweep_s:.3f} (goal ≤ 0.10)"
        )
    lines += ["", "| layout tune measured | predicted before, s | measured, s | error |", "|---|---|---|---|"]
    for c in measured:
        error = c.predicted_before_s / c.measured_step_s - 1 if c.predicted_before_s else float("nan")
        lines.append(f"| {c.layout.label()} | {c.predicted_before_s:.4g} | {c.measured_step_s:.4g} | {error:+.1%} |")
    ranked = sorted(by_label.values(), key=lambda c: -c.record["tokens_per_s"])
    lines += ["", "| sweep rank | layout | step s | tokens/s | peak GB (est.) |", "|---|---|---|---|---|"]
    for rank, c in enumerate(ranked, 1):
        lines.append(
            f"| {rank} | {c.layout.label()} | {c.measured_step_s:.4g} | {c.record['tokens_per_s']:,.0f} | "
            f"{c.record['peak_mem_gb']:.3g} ({c.estimate_gb:.3g}) |"
        )
    return lines


if __name__ == "__main__":
    main()
