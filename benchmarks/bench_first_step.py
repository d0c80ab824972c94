"""First step and whole run under train.compile, each `dlx pretrain` a process of its own as a user starts it.

First step (`--settings demo,1b-scaled`): seconds from launching `dlx pretrain` to its first logged step, on
synthetic tokens at seq 256 × micro-batch 8, `train.precision auto`, compiled: cold (a new cache folder,
`XDG_CACHE_HOME` of the benchmark's own), warm (the same command again: the compile cache under
`~/.cache/dlx/compile` of the first run), resumed (`--resume` of the warm run with more steps: its first new step),
and eager (no compile) for reference; beside each, the run header's compile line, the process's start-up (import,
build, preflight: events.jsonl's `startup_s`) and the first step itself (metrics.jsonl's step 1).

Whole run (`--whole-run`): the demo recipe (`recipes/demo.yaml`: its evaluation, the shipped lm-eval task and a
checkpoint) for `--steps` steps, eager against compiled cold and compiled warm, wall time of each command, on the
stdlib dataset prepared in `--work` first.

Run:  .venv/bin/python benchmarks/bench_first_step.py [--settings demo,1b-scaled] [--whole-run --steps 20]
      (appends to BENCHMARKS.md, section "First step"; --no-record)
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1] / "src")]
from peers.record import environment, publish  # noqa: E402
from peers.side_by_side import SCALED_1B  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SECTION = "First step"
INTRO = (
    "Seconds from launching `dlx pretrain` to its first logged step under train.compile: cold, warm (the compile "
    "cache under `~/.cache/dlx/compile`), after a resume, and eager for reference; and the demo recipe's whole run "
    "with its evaluations, compiled against eager (`benchmarks/bench_first_step.py`)."
)
BATCH = ("--data.seq_len", "256", "--data.micro_batch_size", "8")
SHAPES = {
    "demo": ("--model.preset", "demo", *BATCH),
    "1b-scaled": (*SCALED_1B, *BATCH),
    "gpu-1b": ("--model.preset", "llama3.2-1b", "--data.seq_len", "2048", "--data.micro_batch_size", "8"),
    "dry": ("--model.preset", "debug", "--data.seq_len", "32", "--data.micro_batch_size", "2"),
}
"""demo and 1b-scaled: this CPU's; gpu-1b and dry: next_contact.py's GPU row and its CPU dry run."""
COMMON = ("--data.path", "synthetic", "--log.every", "1", "--log.progress", "false", "--eval.every", "0")
COMMON += ("--checkpoint.every", "2")


def dlx(args: list[str], cache: Path, cwd: Path) -> tuple[float, str]:
    """`dlx ARGS` to its end: (its wall seconds, its standard output); a failure ends the benchmark with its stderr."""
    env = {
        **os.environ,
        "XDG_CACHE_HOME": str(cache),
        "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]),
    }
    env.pop("TORCHINDUCTOR_CACHE_DIR", None)
    began = time.time()
    proc = subprocess.run([sys.executable, "-m", "dlx", *args], cwd=cwd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"dlx {' '.join(args)} exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    return time.time() - began, proc.stdout


def first_step(run_dir: Path, step: int, launched: float) -> dict[str, float]:
    """The first new step's record: seconds from the launch to it being logged, the step's own seconds, and what
    came before the step (imports, build, preflight: their difference; events.jsonl's `startup_s` counts from the
    process's creation time, which Linux gives to the second)."""
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    record = next(r for r in records if r["step"] == step)
    to_first = record["time"] - launched
    return {"to_first_step_s": to_first, "step_s": record["step_s"], "startup_s": to_first - record["step_s"]}


def compile_line(stdout: str) -> str:
    found = [line for line in stdout.splitlines() if line.startswith("compile: ")]
    return re.sub(r" \(model, shapes.*| cache /\S+.*|; kept in .*", "", found[0]) if found else "(eager)"


def measure_setting(name: str, work: Path, compiled: bool = True) -> list[dict]:
    """Cold, warm, resumed and eager first steps of one shape (`compiled` False, a dry run's: the first three)."""
    cache, eager_cache, rows = work / f"{name}-cache", work / f"{name}-eager-cache", []
    shape = [*SHAPES[name], *COMMON]
    on = ["--train.compile", str(compiled).lower()]
    cases = [
        ("cold", "cold", [*on, "--train.max_steps", "2"], cache, 1),
        ("warm", "warm", [*on, "--train.max_steps", "2"], cache, 1),
        ("resumed", "warm", [*on, "--train.max_steps", "4", "--resume"], cache, 3),
        ("eager", "eager", ["--train.compile", "false", "--train.max_steps", "2"], eager_cache, 1),
    ]
    for label, run, extra, cache_dir, step in cases if compiled else cases[:3]:
        run_dir = work / f"{name}-{run}"
        launched = time.time()
        _, stdout = dlx(["pretrain", *shape, *extra, "--run-dir", str(run_dir)], cache_dir, work)
        rows.append(
            {"setting": name, "case": label, "header": compile_line(stdout), **first_step(run_dir, step, launched)}
        )
        print(rows[-1], flush=True)
    return rows


def whole_runs(work: Path, steps: int) -> list[dict]:
    """The demo recipe's run of `steps` steps: eager, compiled cold, compiled warm (wall seconds of each command)."""
    if not (work / "data" / "stdlib-8k" / "manifest.json").is_file():
        dlx(["prepare", "--corpus", "stdlib", "--train-tokenizer", "8192", "--out", "data/stdlib-8k"], work / "c", work)
    recipe = [str(ROOT / "recipes" / "demo.yaml"), "--train.max_steps", str(steps), "--log.progress", "false"]
    rows = []
    for label, compiled, cache in (
        ("eager", "false", work / "whole-eager-cache"),
        ("compiled, cold", "true", work / "whole-cache"),
        ("compiled, warm", "true", work / "whole-cache"),
    ):
        run_dir = work / f"whole-{label.replace(', ', '-')}"
        wall, stdout = dlx(["pretrain", *recipe, "--train.compile", compiled, "--run-dir", str(run_dir)], cache, work)
        evals = [json.loads(line) for line in (run_dir / "eval.jsonl").read_text().splitlines()]
        tasks = [json.loads(line) for line in (run_dir / "tasks.jsonl").read_text().splitlines()]
        recompiles = sum(len(e.get("recompiles", [])) for e in events_of(run_dir) if e["event"] == "compile")
        rows.append(
            {
                "case": label,
                "wall_s": wall,
                "eval_s": sum(e["eval_s"] for e in evals),
                "tasks_s": sum(t["tasks_s"] for t in tasks),
                "recompiles": recompiles,
                "header": compile_line(stdout),
            }
        )
        print(rows[-1], flush=True)
    return rows


def events_of(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]


def table(first: list[dict], whole: list[dict], steps: int) -> list[str]:
    lines = []
    if first:
        lines += [
            "",
            "| shape | case | header says | launch → first step logged, s | of it start-up, s | the first step, s |",
            "|---|---|---|---|---|---|",
        ]
        for r in first:
            lines.append(
                f"| {r['setting']} | {r['case']} | {r['header']} | {r['to_first_step_s']:.1f} | "
                f"{r['startup_s']:.1f} | {r['step_s']:.1f} |"
            )
    if whole:
        eager = next(r for r in whole if r["case"] == "eager")["wall_s"]
        lines += [
            "",
            f"demo recipe, {steps} steps with its evaluations (validation and the lm-eval task at the end, one save):",
            "",
            "| run | wall s | ÷ eager | validation s | tasks s | recompiles | header says |",
            "|---|---|---|---|---|---|---|",
        ]
        for r in whole:
            lines.append(
                f"| {r['case']} | {r['wall_s']:.1f} | {r['wall_s'] / eager:.3f} | {r['eval_s']:.1f} | "
                f"{r['tasks_s']:.1f} | {r['recompiles']} | {r['header']} |"
            )
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--settings", default="demo,1b-scaled", help="shapes for the first-step table ('' for none)")
    parser.add_argument("--whole-run", action="store_true", help="also the demo recipe's run, compiled vs eager")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--work", type=Path, default=None, help="a folder to work in (default: a temporary one)")
    parser.add_argument("--no-record", action="store_true")
    args = parser.parse_args()
    header = environment(["src/dlx/train", "src/dlx/metrics", "benchmarks/bench_first_step.py"])
    with tempfile.TemporaryDirectory() as tmp:
        work = (args.work or Path(tmp)).absolute()
        work.mkdir(parents=True, exist_ok=True)
        first = [row for name in filter(None, args.settings.split(",")) for row in measure_setting(name, work)]
        whole = whole_runs(work, args.steps) if args.whole_run else []
    shapes = "; ".join(f"{name}: `{' '.join(SHAPES[name])}`" for name in filter(None, args.settings.split(",")))
    note = f"- synthetic tokens, seq 256 × micro-batch 8, train.precision auto; {shapes}" if first else ""
    publish(SECTION, INTRO, ["### " + time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "", *header, note,
                             *table(first, whole, args.steps)], record=not args.no_record)  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
