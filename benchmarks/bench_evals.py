"""Evals: what downstream task evaluation in the loop costs, and the demo's task accuracy curve.

One run of the embedded demo's recipe (its model, data and schedule; `--steps` optimizer steps) with the shipped
lm-evaluation-harness task `dlx_stdlib_next_line` (`--limit` documents) every `--every` steps and at the end, as
`dlx pretrain` runs it. Measured in that run:

- each task evaluation's wall time (`tasks_s` of tasks.jsonl: lm-eval building the requests, the adapter's forwards,
  lm-eval's metrics), with the step clock paused;
- the run's wall time (pretrain called to returned: start-up, steps, validation, checkpoints, evaluations, report);
- the share: Σ tasks_s ÷ the run's wall time (target ≤ 2 %), and one evaluation in median optimizer steps;
- the start-up cost before step 1: importing lm-eval and resolving and loading the task, in a fresh interpreter;
- the accuracy curve: lm-eval's `acc`, `acc_norm` and `acc_mutual_info` ± standard error at each evaluation
  (chance: 25 %).

With `--compare-paths` instead: the adapter's two ways of scoring on a CPU, interleaved in one process on the demo's
model (random weights: the cost does not depend on them), `--limit` documents, `--rounds` rounds: contexts shared
through a KV cache (the CPU default) against batches of whole rows (the GPU and tensor-parallel path); wall and
process CPU seconds per evaluation. With `--untrained N`: the task's metrics for N random initialisations of the
demo's model (the floor: an untrained model is at chance only on `acc_mutual_info`).

Run:  .venv/bin/python benchmarks/bench_evals.py    (appends to BENCHMARKS.md; --no-record to only print)
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from dlx.evals.stdlib_task import STDLIB_NEXT_LINE
from dlx.metrics.logger import TASKS_FILE, read_jsonl
from dlx.train.config import build_config
from dlx.train.demo import DEMO_DATA, demo_recipe, prepare_demo_data
from dlx.train.loop.trainer import pretrain
from peers.record import environment, publish, record_section

METRICS = ("acc", "acc_norm", "acc_mutual_info")
STARTUP = f"""
import time
start = time.perf_counter()
from dlx.evals.harness import load_tasks
load_tasks([{STDLIB_NEXT_LINE!r}], None, 100)
print(time.perf_counter() - start)
"""


def run(data: Path, steps: int, every: int, limit: int) -> dict:
    manifest = prepare_demo_data(data)
    recipe = demo_recipe(manifest.vocab_size)
    recipe["data"]["path"] = str(data)
    recipe["train"]["max_steps"] = steps
    recipe["eval"].update(tasks=[STDLIB_NEXT_LINE], tasks_every=every, tasks_limit=limit)
    recipe["log"]["progress"] = False
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        result = pretrain(build_config(recipe), "bench-evals", Path(tmp) / "run")
        wall = time.perf_counter() - start
        tasks = read_jsonl(result.run_dir / TASKS_FILE)
        steps_s = [r["step_s"] for r in result.records[1:] if r.get("step_s")]
    return {"wall_s": wall, "tasks": tasks, "step_s": statistics.median(steps_s), "recipe": recipe}


def compare_paths(data: Path, limit: int, rounds: int) -> list[str]:
    import torch

    from dlx.evals.adapter import DlxLM, build_adapter
    from dlx.evals.harness import load_tasks
    from dlx.model.llama import Transformer
    from dlx.model.presets import resolve_model_args

    class WholeRows(DlxLM):
        shares_contexts = False

    model = Transformer(resolve_model_args("demo").model_copy(update={"vocab_size": 8192})).eval()
    shared = build_adapter(model, data / "tokenizer.json")
    whole = WholeRows(model, shared.tokenizer, shared.max_length, shared.prefix_token_id, shared.eos_id)
    tasks = load_tasks([STDLIB_NEXT_LINE], None, limit)
    tasks.run(shared)  # warm: datasets cache, lm-eval's templates
    times: dict[str, list[tuple[float, float]]] = {"shared contexts (KV cache)": [], "whole rows": []}
    for _ in range(rounds):
        for spent, lm in zip(times.values(), (shared, whole), strict=True):
            wall, cpu = time.perf_counter(), time.process_time()
            tasks.run(lm)
            spent.append((time.perf_counter() - wall, time.process_time() - cpu))
    lines = [
        f"Scoring paths on a CPU: `{STDLIB_NEXT_LINE}`, {limit} documents, demo model (random weights), "
        f"{rounds} interleaved rounds, torch threads {torch.get_num_threads()}.",
        "",
        "| path | wall s per evaluation, median (min) | process CPU s, median (min) |",
        "|---|---:|---:|",
    ]
    for name, spent in times.items():
        walls, cpus = [w for w, _ in spent], [c for _, c in spent]
        lines.append(
            f"| {name} | {statistics.median(walls):.2f} ({min(walls):.2f}) | "
            f"{statistics.median(cpus):.2f} ({min(cpus):.2f}) |"
        )
    return lines


def untrained(data: Path, limit: int, seeds: int) -> list[str]:
    """The shipped task's metrics for the demo's model at initialisation (`seeds` random inits): the floor an
    evaluation of a trained model is to be compared with."""
    import torch

    from dlx.evals.adapter import build_adapter
    from dlx.evals.harness import load_tasks
    from dlx.model.llama import Transformer
    from dlx.model.presets import resolve_model_args

    lines = [
        f"Untrained demo model (random initialisation, seeds 0–{seeds - 1}), `{STDLIB_NEXT_LINE}`, {limit} documents.",
        "",
        "| seed | acc | acc_norm | acc_mutual_info |",
        "|---:|---:|---:|---:|",
    ]
    for seed in range(seeds):
        torch.manual_seed(seed)
        model = Transformer(resolve_model_args("demo").model_copy(update={"vocab_size": 8192})).eval()
        result = load_tasks([STDLIB_NEXT_LINE], None, limit).run(build_adapter(model, data / "tokenizer.json"))
        metrics = result["results"][STDLIB_NEXT_LINE]
        cells = [f"{metrics[m + ',none']:.2f} ± {metrics[m + '_stderr,none']:.2f}" for m in METRICS]
        lines.append(f"| {seed} | {' | '.join(cells)} |")
    return lines


def startup_seconds() -> float:
    out = subprocess.run([sys.executable, "-c", STARTUP], capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def report(measured: dict, startup: float, every: int, limit: int) -> list[str]:
    tasks, wall, step_s = measured["tasks"], measured["wall_s"], measured["step_s"]
    spent = sum(r["tasks_s"] for r in tasks)
    per_eval = statistics.median(r["tasks_s"] for r in tasks)
    acc, norm, info = (f"{STDLIB_NEXT_LINE}/{m}" for m in ("acc", "acc_norm", "acc_mutual_info"))
    lines = [
        f"Demo recipe, {measured['recipe']['train']['max_steps']} steps, `{STDLIB_NEXT_LINE}` ({limit} documents, "
        f"4 choices) every {every} steps and at the end: {len(tasks)} evaluations.",
        "",
        "| figure | value |",
        "|---|---:|",
        f"| run wall time (pretrain called → returned) | {wall:.1f} s |",
        f"| median optimizer step | {1000 * step_s:.0f} ms |",
        f"| one task evaluation, median (min, max) | {per_eval:.2f} s ({min(r['tasks_s'] for r in tasks):.2f}, "
        f"{max(r['tasks_s'] for r in tasks):.2f}) = {per_eval / step_s:.1f} median steps |",
        f"| all task evaluations | {spent:.1f} s = **{100 * spent / wall:.2f} % of the run's wall time** |",
        f"| before step 1: import lm-eval, resolve and load the task (fresh interpreter) | {startup:.1f} s |",
        "",
        "| step | acc | acc_norm | acc_mutual_info |",
        "|---:|---:|---:|---:|",
    ]
    for r in tasks:
        lines.append(
            f"| {r['step']} | {r[acc]:.2f} ± {r[acc + '_stderr']:.2f} | {r[norm]:.2f} ± {r[norm + '_stderr']:.2f} | "
            f"{r[info]:.2f} ± {r[info + '_stderr']:.2f} |"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DEMO_DATA, help="the demo's dataset (prepared if missing)")
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--every", type=int, default=100)
    parser.add_argument("--limit", type=int, default=100)
    parser.add_argument("--compare-paths", action="store_true", help="only the two scoring paths, interleaved")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--untrained", type=int, default=0, help="only the metrics of this many random inits")
    parser.add_argument("--no-record", action="store_true", help="print only; leave BENCHMARKS.md alone")
    args = parser.parse_args()
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    if args.compare_paths or args.untrained:
        head = [f"### {when}", "", *environment(["src/dlx/evals"]), ""]
        measure = untrained(args.data, args.limit, args.untrained) if args.untrained else None
        lines = head + (measure or compare_paths(args.data, args.limit, args.rounds))
        publish("Evals", "", lines, record=not args.no_record)
        return
    startup = startup_seconds()
    measured = run(args.data, args.steps, args.every, args.limit)
    lines = [
        f"### {when}",
        "",
        *environment(["src/dlx/evals", "src/dlx/train"]),
        "",
        *report(measured, startup, args.every, args.limit),
    ]
    print("\n".join(lines))
    print(json.dumps([{k: v for k, v in r.items()} for r in measured["tasks"]]))
    if not args.no_record:
        intro = (
            "Downstream task evaluation in the loop (eval.tasks, lm-evaluation-harness through dlx's adapter): its "
            "cost as a share of a run's wall time (target ≤ 2 %), and the demo's task accuracy curve. Program: "
            "`benchmarks/bench_evals.py`."
        )
        record_section("Evals", intro, lines)


if __name__ == "__main__":
    main()
