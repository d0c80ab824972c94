"""`dlx tune` judged by what the user waits for: the tuned recipe's whole run against the recipe's own, and the whole
run tune predicted against the one measured.

In `--work` (the demo's dataset prepared there first): `dlx tune RECIPE --train.max_steps STEPS --budget-min B`, then
`--rounds` rounds of `dlx pretrain` of the tuned recipe and of the recipe as written (`--train.max_steps STEPS`), in
alternating order, each a process of its own with the same cache folder (the compile cache tune filled, as a user's
next command finds it). Per run: the command's wall seconds, and the run from its first step to its end (wall less
events.jsonl's `startup_s`: imports, build, preflight), which is what tune's whole-run figure prices (steps,
evaluations, task evaluations, saves, the compile warm-up).

Run:  .venv/bin/python benchmarks/bench_tune_run.py [--steps 20] [--budget-min 5] [--rounds 2]
      (appends to BENCHMARKS.md, section "Tune"; --no-record)
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1] / "src")]
from bench_first_step import dlx, events_of  # noqa: E402
from peers.record import environment, publish  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SECTION = "Tune"
INTRO = "`dlx tune` against the exhaustive sweep of the same space (`benchmarks/bench_tune.py`)."


def run_once(recipe: list[str], run_dir: Path, cache: Path, work: Path) -> dict[str, float]:
    wall, _ = dlx(["pretrain", *recipe, "--log.progress", "false", "--run-dir", str(run_dir)], cache, work)
    startup = next(e["startup_s"] for e in events_of(run_dir) if e["event"] == "start")
    return {"wall_s": wall, "run_s": wall - startup}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", default=str(ROOT / "recipes" / "demo.yaml"))
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--budget-min", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--work", type=Path, default=None)
    parser.add_argument("--no-record", action="store_true")
    args = parser.parse_args()
    header = environment(["src/dlx/bench", "src/dlx/train", "benchmarks/bench_tune_run.py"])
    with tempfile.TemporaryDirectory() as tmp:
        work = (args.work or Path(tmp)).absolute()
        work.mkdir(parents=True, exist_ok=True)
        cache = work / "cache"
        if not (work / "data" / "stdlib-8k" / "manifest.json").is_file():
            dlx(["prepare", "--corpus", "stdlib", "--train-tokenizer", "8192", "--out", "data/stdlib-8k"], cache, work)
        steps = ["--train.max_steps", str(args.steps)]
        out = work / "tune" / "tuned.yaml"
        tune_s, _ = dlx(["tune", args.recipe, *steps, "--budget-min", str(args.budget_min), "--out", str(out)],
                            cache, work)  # fmt: skip
        summary = json.loads(out.with_suffix(".json").read_text())
        runs: dict[str, list[dict]] = {"tuned": [], "own": []}
        for index in range(args.rounds):
            for kind in ("own", "tuned") if index % 2 == 0 else ("tuned", "own"):
                recipe = [str(out)] if kind == "tuned" else [args.recipe, *steps]
                runs[kind].append(run_once(recipe, work / f"{kind}-{index}", cache, work))
                print(kind, runs[kind][-1], flush=True)
    lines = report(summary, runs, tune_s, args)
    publish(SECTION, INTRO, ["### " + time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "", *header, *lines],
            record=not args.no_record)  # fmt: skip
    return 0


def report(summary: dict, runs: dict[str, list[dict]], tune_s: float, args: argparse.Namespace) -> list[str]:
    winner = summary["winner"]
    own = next((c for c in summary["candidates"] if c.get("recipe")), None)
    median = {kind: {key: statistics.median(r[key] for r in rs) for key in ("wall_s", "run_s")} for kind, rs in
              runs.items()}  # fmt: skip
    ratio_wall = median["tuned"]["wall_s"] / median["own"]["wall_s"]
    ratio_run = median["tuned"]["run_s"] / median["own"]["run_s"]
    per_round = ", ".join(f"{t['wall_s'] / o['wall_s']:.3f}" for t, o in zip(runs["tuned"], runs["own"], strict=True))
    predicted = winner["run"]["total_s"]
    error = predicted / median["tuned"]["run_s"] - 1
    measured = sum(c["measured_step_s"] is not None for c in summary["candidates"])
    lines = [
        f"- `dlx tune {Path(args.recipe).name} --train.max_steps {args.steps} --budget-min {args.budget_min:g}` took "
        f"{tune_s:.0f} s: winner {winner['label']}, measured {measured} of {len(summary['candidates'])} listed; "
        f"{args.rounds} rounds of both runs, alternating",
        "",
        "| run | wall s, median (per round) | first step → end s, median | tune's whole-run figure s |",
        "|---|---|---|---|",
    ]
    for kind, label, row in (("tuned", "the tuned recipe", winner), ("own", "the recipe as written", own)):
        walls = ", ".join(f"{r['wall_s']:.1f}" for r in runs[kind])
        figure = "" if row is None or row.get("run") is None else f"{row['run']['total_s']:.1f}"
        lines.append(f"| {label} | {median[kind]['wall_s']:.1f} ({walls}) | {median[kind]['run_s']:.1f} | {figure} |")
    lines += [
        "",
        f"- tuned ÷ own, whole command: **{ratio_wall:.3f}** (per round {per_round}); first step → end: "
        f"{ratio_run:.3f} (target ≤ 1.0)",
        f"- tune's whole-run prediction for its winner ÷ the measured first step → end − 1: **{error:+.1%}** "
        "(target within ±15 %)",
    ]
    return lines


if __name__ == "__main__":
    raise SystemExit(main())
