"""What a checkpoint costs the run: `checkpoint.async` against a synchronous save, each `dlx pretrain` a process of
its own, in alternating order per round.

A run: the setting's shape on synthetic tokens, `parallel.strategy fsdp` on one rank (DCP checkpoints: the format
checkpoint.async writes in the background), `--train.max_steps 12 --checkpoint.every 4`, `log.every 1`, no evaluation.
From its files: the seconds the steps waited for the save at step 4 (events.jsonl's `save_s`: the state copied to host
memory and, synchronous, written, hashed and published), the step after it (step 5) ÷ the median of steps 2, 3, 6, 7,
10 and 11, and the same for the save at step 8: the first async save starts the writer process, a later one finds it
running, as every save of a long run does (step 1 compiles nothing here but warms allocators; step 12 is followed by
the final save, synchronous in both).

Run:  .venv/bin/python benchmarks/bench_checkpoint_cost.py [--settings demo,1b-scaled] [--rounds 2]
      (appends to BENCHMARKS.md, section "Checkpoint cost"; --no-record; --json OUT writes the figures)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1] / "src")]
from peers.record import environment, publish  # noqa: E402
from peers.side_by_side import SCALED_1B  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SECTION = "Checkpoint cost"
INTRO = (
    "`checkpoint.async` against a synchronous save: the seconds the steps wait for a save, and the step after it "
    "against the steady step (`benchmarks/bench_checkpoint_cost.py`)."
)
SHAPES = {
    "demo": ("--model.preset", "demo", "--data.seq_len", "256", "--data.micro_batch_size", "8"),
    "1b-scaled": (*SCALED_1B, "--data.seq_len", "256", "--data.micro_batch_size", "8"),
    "gpu-1b": ("--model.preset", "llama3.2-1b", "--data.seq_len", "2048", "--data.micro_batch_size", "8"),
    "dry": ("--model.preset", "debug", "--data.seq_len", "32", "--data.micro_batch_size", "2"),
}
RUN = ("--data.path", "synthetic", "--train.max_steps", "12", "--checkpoint.every", "4", "--log.every", "1")
RUN += ("--eval.every", "0", "--log.progress", "false", "--parallel.strategy", "fsdp")
FIRST_SAVE, LATER_SAVE, STEADY = 4, 8, (2, 3, 6, 7, 10, 11)


def one_run(setting: str, mode: str, work: Path, extra: list[str]) -> dict[str, float]:
    """One run: each save's blocking seconds and the step after it; the steady step."""
    run_dir = work / f"{setting}-{mode}-{time.monotonic_ns()}"
    argv = [sys.executable, "-m", "dlx", "pretrain", *SHAPES[setting], *RUN, *extra]
    argv += ["--checkpoint.async", str(mode == "async").lower(), "--run-dir", str(run_dir)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(argv, cwd=work, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    steps = {r["step"]: r["step_s"] for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())}
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    saves = {e["step"]: e["save_s"] for e in events if e["event"] == "checkpoint"}
    steady = statistics.median(steps[s] for s in STEADY)
    return {
        "blocking_s": saves[FIRST_SAVE],
        "next_step_s": steps[FIRST_SAVE + 1],
        "later_blocking_s": saves[LATER_SAVE],
        "later_next_step_s": steps[LATER_SAVE + 1],
        "steady_step_s": steady,
    }


def measure(settings: list[str], rounds: int, work: Path, extra: list[str]) -> dict[str, dict[str, list[dict]]]:
    """{setting: {mode: [run, ...]}}, the two modes alternating which goes first."""
    results: dict[str, dict[str, list[dict]]] = {}
    for setting in settings:
        results[setting] = {"sync": [], "async": []}
        for index in range(rounds):
            for mode in ("sync", "async") if index % 2 == 0 else ("async", "sync"):
                results[setting][mode].append(one_run(setting, mode, work, extra))
                print(setting, mode, results[setting][mode][-1], flush=True)
    return results


def summary(runs: list[dict]) -> dict[str, float]:
    def median(key: str) -> float:
        return statistics.median(r[key] for r in runs)

    def slowdown(key: str) -> float:
        return statistics.median(r[key] / r["steady_step_s"] - 1 for r in runs)

    return {
        "blocking_s": median("blocking_s"),
        "next_step_slowdown": slowdown("next_step_s"),
        "later_blocking_s": median("later_blocking_s"),
        "later_next_step_slowdown": slowdown("later_next_step_s"),
        "steady_step_s": median("steady_step_s"),
    }


def table(results: dict[str, dict[str, list[dict]]]) -> list[str]:
    lines = [
        "| shape | save | first save: blocking s | next step ÷ steady − 1 (per run) | a later save: blocking s "
        "| next step ÷ steady − 1 (per run) | steady step s |",
        "|---|---|---|---|---|---|---|",
    ]
    for setting, modes in results.items():
        for mode, runs in modes.items():
            s = summary(runs)

            def per_run(key: str, runs: list[dict] = runs) -> str:
                return ", ".join(f"{r[key] / r['steady_step_s'] - 1:+.0%}" for r in runs)

            lines.append(
                f"| {setting} | {mode} | {s['blocking_s']:.2f} | {s['next_step_slowdown']:+.1%} "
                f"({per_run('next_step_s')}) | {s['later_blocking_s']:.2f} | {s['later_next_step_slowdown']:+.1%} "
                f"({per_run('later_next_step_s')}) | {s['steady_step_s']:.2f} |"
            )
    lines.append("")
    lines.append("Medians over the runs; the first save's figures include starting the writer process (async).")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--settings", default="demo,1b-scaled")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--json", type=Path, default=None, help="write the figures here")
    parser.add_argument("--no-record", action="store_true")
    args, extra = parser.parse_known_args()
    header = environment(["src/dlx/train", "src/dlx/parallel", "benchmarks/bench_checkpoint_cost.py"])
    with tempfile.TemporaryDirectory() as tmp:
        results = measure(args.settings.split(","), args.rounds, Path(tmp), extra)
    if args.json is not None:
        figures = {s: {m: summary(runs) for m, runs in modes.items()} for s, modes in results.items()}
        args.json.write_text(json.dumps({"summary": figures, "runs": results}, indent=2) + "\n")
    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    note = f"- {args.rounds} round(s) per setting; shapes: " + "; ".join(
        f"{s}: `{' '.join(SHAPES[s])}`" for s in args.settings.split(",")
    )
    lines = ["### " + stamp, "", *header, note, f"- each run: `{' '.join(RUN)}`", "", *table(results)]
    publish(SECTION, INTRO, lines, record=not args.no_record)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
