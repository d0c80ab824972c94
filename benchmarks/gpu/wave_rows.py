"""next_contact.py's rows for the context-parallel path, `dlx tune` and a stage boundary, one worker per row, each
writing OUT.json.

    python benchmarks/gpu/wave_rows.py cp-path gpu|dry OUT.json
        `dlx bench` twice on one device, the plain path and the context-parallel code path at degree 1
        (`--cp-path true`): llama3.2-1b bf16 compiled at 16,384 tokens, micro-batch 1; the ratio of their tokens/s.
    python benchmarks/gpu/wave_rows.py tune gpu|dry OUT.json
        `dlx tune recipes/llama3.2-1b.yaml --json` within the minutes the script can spare; the winner's layout,
        tokens/s and MFU, and the search's own time.
    python benchmarks/gpu/wave_rows.py stages gpu|dry OUT.json
        `dlx pretrain` llama3.2-1b bf16 (eager) on synthetic tokens with data.stages: 8 steps at seq_len 2,048
        (micro-batch 4), then 8 at 4,096 (micro-batch 2, the same tokens per step) with another RoPE base; the step
        that crosses the boundary against the median of the stage it enters (its first step excluded from neither).

    python benchmarks/gpu/wave_rows.py first-step gpu|dry OUT.json
        benchmarks/bench_first_step.py's runs at llama3.2-1b bf16 compiled, seq 2048, micro-batch 8: seconds from
        launch to the first logged step cold, warm (the compile cache), resumed, and eager; then a warm compiled run
        with two evaluations: their seconds and the recompiles named in events.jsonl (one: the no-gradient graph).
    python benchmarks/gpu/wave_rows.py async-save gpu|dry OUT.json
        benchmarks/bench_checkpoint_cost.py at the same shape, fsdp on one rank: a save's blocking seconds and the next
        step's slowdown, checkpoint.async against a synchronous save.

Dry (on the CPU, in CI): the debug model, a few steps, no compile, the same commands.
"""

from __future__ import annotations

import csv
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "benchmarks")]  # bench_first_step and bench_checkpoint_cost
TUNE_BUDGET_MIN = 2.0
"""The search's budget in the GPU run: the whole script stays under 9.5 minutes on one H200."""


def bench_tokens_per_s(out: Path, dry: bool, cp_path: bool) -> dict[str, float]:
    """One `dlx bench` point (the plain path, or the cp path at degree 1): its tokens/s, MFU and peak memory."""
    model, seq, precision = ("debug", "64", "fp32") if dry else ("llama3.2-1b", "16384", "bf16")
    argv = [sys.executable, "-m", "dlx", "bench", "--model", model, "--seq-len", seq, "--micro-batch", "1"]
    argv += ["--precision", precision, "--steps", "2" if dry else "6", "--warmup", "1" if dry else "3"]
    argv += ["--compile", "false" if dry else "true", "--cp-path", str(cp_path).lower(), "--out", str(out)]
    subprocess.run(argv, check=True, cwd=ROOT)
    with open(out / "bench.csv") as f:
        row = next(csv.DictReader(f))
    return {key: float(row[key]) for key in ("tokens_per_s", "mfu", "peak_mem_gb") if row.get(key)}


def cp_path_row(dry: bool) -> dict:
    with tempfile.TemporaryDirectory(prefix="dlx-cp-row-") as tmp:
        plain = bench_tokens_per_s(Path(tmp) / "plain", dry, cp_path=False)
        cp = bench_tokens_per_s(Path(tmp) / "cp", dry, cp_path=True)
    return {"plain": plain, "cp_path": cp, "cp_over_plain": cp["tokens_per_s"] / plain["tokens_per_s"]}


def tune_row(dry: bool) -> dict:
    recipe = ROOT / "recipes" / ("debug.yaml" if dry else "llama3.2-1b.yaml")
    with tempfile.TemporaryDirectory(prefix="dlx-tune-row-") as tmp:
        argv = [sys.executable, "-m", "dlx", "tune", str(recipe), "--json", "--out", str(Path(tmp) / "tuned.yaml")]
        argv += ["--budget-min", str(0.4 if dry else TUNE_BUDGET_MIN)]
        if dry:
            argv += ["--train.device", "cpu", "--keep", "train.compile"]
        start = time.perf_counter()
        result = subprocess.run(argv, check=True, cwd=ROOT, capture_output=True, text=True)
        seconds = time.perf_counter() - start
    tuned = json.loads(result.stdout)
    winner = tuned["winner"]
    return {
        "seconds": seconds,
        "label": winner["label"],
        "tokens_per_s": winner["tokens_per_s"],
        "mfu": winner["mfu"],
        "measured": tuned["measured"],
        "candidates": len(tuned["candidates"]),
    }


def stages_row(dry: bool) -> dict:
    """The seconds of the step that crosses a seq_len and RoPE boundary, beside the stages' median steps."""
    model, seq, micro, precision = ("debug", 32, 2, "fp32") if dry else ("llama3.2-1b", 2048, 4, "bf16")
    per_stage = 2 if dry else 8
    stages = [{"until": per_stage}, {"seq_len": 2 * seq, "rope_theta": 1e6}]
    with tempfile.TemporaryDirectory(prefix="dlx-stages-row-") as tmp:
        run = Path(tmp) / "run"
        argv = [sys.executable, "-m", "dlx", "pretrain", "--run-dir", str(run), "--model.preset", model]
        argv += ["--model.max_seq_len", str(2 * seq), "--data.seq_len", str(seq), "--data.micro_batch_size", str(micro)]
        argv += ["--data.stages", json.dumps(stages), "--train.max_steps", str(2 * per_stage), "--train.precision"]
        argv += [precision, "--train.warmup_ratio", "0", "--eval.every", "0", "--log.every", "1"]
        argv += ["--log.progress", "false", "--checkpoint.keep_last", "1"]
        done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"dlx pretrain with data.stages: exit {done.returncode}\n{done.stderr[-3000:]}")
        records = {r["step"]: r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())}
    crossing = records[per_stage + 1]
    before = statistics.median(records[s]["step_s"] for s in range(2, per_stage + 1))
    after = statistics.median(records[s]["step_s"] for s in range(per_stage + 2, 2 * per_stage + 1))
    return {
        "crossing_s": crossing["step_s"],
        "crossing_data_wait_s": crossing["data_wait_s"],
        "stage0_median_s": before,
        "stage1_median_s": after,
        "extra_steps": (crossing["step_s"] - after) / after,
    }


def first_step_row(dry: bool) -> dict:
    """Cold, warm, resumed and eager first steps, then evaluations in a warm compiled run (dry: the first three and
    no evaluated run: nothing compiles on the CPU dry run)."""
    import bench_first_step

    setting = "dry" if dry else "gpu-1b"
    with tempfile.TemporaryDirectory(prefix="dlx-first-step-") as tmp:
        work = Path(tmp)
        rows = bench_first_step.measure_setting(setting, work, compiled=not dry)
        if dry:
            return {"first_step": {row["case"]: row for row in rows}, "eval_s": [], "eval_recompiles": []}
        run_dir = work / "evaluated"
        argv = ["pretrain", *bench_first_step.SHAPES[setting], *bench_first_step.COMMON, "--train.max_steps", "4"]
        argv += ["--train.compile", str(not dry).lower(), "--eval.every", "2", "--eval.batches", "4"]
        bench_first_step.dlx([*argv, "--run-dir", str(run_dir)], work / f"{setting}-cache", work)
        evals = [json.loads(line) for line in (run_dir / "eval.jsonl").read_text().splitlines()]
        events = bench_first_step.events_of(run_dir)
    recompiles = [r for e in events if e["event"] == "compile" for r in e.get("recompiles", [])]
    return {
        "first_step": {row["case"]: row for row in rows},
        "eval_s": [e["eval_s"] for e in evals],
        "eval_recompiles": [f"{r['function']}: {r['reason']}" for r in recompiles],
    }


def async_save_row(dry: bool) -> dict:
    """checkpoint.async against a synchronous save, one run each."""
    import bench_checkpoint_cost

    setting = "dry" if dry else "gpu-1b"
    with tempfile.TemporaryDirectory(prefix="dlx-async-save-") as tmp:
        runs = bench_checkpoint_cost.measure([setting], 1, Path(tmp), [])[setting]
    return {mode: bench_checkpoint_cost.summary(mode_runs) for mode, mode_runs in runs.items()}


def main(argv: list[str]) -> int:
    name, shape, out = argv
    dry = shape == "dry"
    rows = {"cp-path": cp_path_row, "tune": tune_row, "stages": stages_row, "first-step": first_step_row}
    rows["async-save"] = async_save_row
    results = rows[name](dry)
    Path(out).write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
