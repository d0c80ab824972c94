"""Trust: kill and resume a 2-source mixture run at many points while other processes load every core, and compare
every logged loss with an uninterrupted run's, bit for bit.

The run: the debug model (dim 64, 2 layers, vocab 512) on two synthetic prepared datasets mixed 1 : 3 (`data.mix`),
document masking, z-loss, a WSD schedule, gradient accumulation 2, one loader worker, an evaluation every 8 steps, a
checkpoint every 4 steps, `log.every 1`, 24 steps. The reference is one uninterrupted run. Each iteration starts one
spinning process per core, starts the run, stops it once metrics.jsonl holds a chosen step (drawn at random), in one
of three ways (cycled): SIGKILL to the whole process group (a scheduler's kill: the loader worker dies too), SIGTERM
to the trainer only (an orderly stop: it checkpoints where it is), SIGINT to the whole group (Ctrl-C in a terminal);
then `dlx pretrain --resume` to the end, and compares metrics.jsonl with the reference (every step's loss, z_loss and
lr; eval.jsonl's losses too). A difference prints the iteration, the stop and the steps that differ, and the run
folders are kept.

Run:  .venv/bin/python benchmarks/bench_resume_loop.py --iterations 30   (appends to BENCHMARKS.md; --no-record)
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from dlx.data.shards import Manifest, ShardInfo, sha256_file, shard_name, write_manifest
from peers.record import environment, publish

SPIN = "while True:\n    pass\n"
TOKENIZER = '{"model": {"type": "BPE", "vocab": {"a": 0, "b": 1}, "merges": []}, "added_tokens": []}'
STEPS, CHECKPOINT_EVERY, EVAL_EVERY = 24, 4, 8
STOPS = (("SIGKILL", "group"), ("SIGTERM", "trainer"), ("SIGINT", "group"))
FIELDS = ("loss", "z_loss", "lr")
RESUME_INTRO = (
    "Kill-and-resume loop of a 2-source mixture run under load (benchmarks/bench_resume_loop.py): every logged "
    "value compared bit for bit with an uninterrupted run."
)


def write_source(folder: Path, seed: int, n_tokens: int) -> Path:
    """A prepared dataset of random ids below 512 (EOS 0 ends documents), one train and one val shard."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True)
    (folder / "tokenizer.json").write_text(TOKENIZER)
    shards = []
    for split, n in (("train", n_tokens), ("val", 2_000)):
        tokens = rng.integers(1, 512, n).astype(np.uint16)
        tokens[rng.integers(0, n, n // 200)] = 0
        path = folder / shard_name(split, 0)
        tokens.tofile(path)
        info = ShardInfo(name=path.name, split=split, tokens=n, documents=int((tokens == 0).sum()) or 1, sha256="")
        shards.append(info.model_copy(update={"sha256": sha256_file(path)}))
    sha = sha256_file(folder / "tokenizer.json")
    manifest = Manifest(dtype="uint16", vocab_size=512, eos_id=0, tokenizer_sha256=sha, shards=shards, complete=True)
    write_manifest(folder, manifest)
    return folder


def recipe(root: Path) -> Path:
    a, b = write_source(root / "a", 1, 60_000), write_source(root / "b", 2, 20_000)
    text = f"""
model: {{preset: debug}}
data: {{mix: {{{a}: 1.0, {b}: 3.0}}, document_mask: true, seq_len: 32, micro_batch_size: 4, num_workers: 1}}
train: {{max_steps: {STEPS}, grad_accum: 2, lr: 3.0e-3, min_lr: 3.0e-4, schedule: wsd, z_loss: 1.0e-4,
         precision: fp32}}
eval: {{every: {EVAL_EVERY}, batches: 2}}
checkpoint: {{every: {CHECKPOINT_EVERY}, keep_last: 2}}
log: {{every: 1, progress: false}}
"""
    path = root / "recipe.yaml"
    path.write_text(text)
    return path


def pretrain(args: list[str]) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "dlx", "pretrain", *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group, as a terminal's foreground job
    )


def logged(run_dir: Path) -> tuple[dict[int, dict], dict[int, float]]:
    """metrics.jsonl's values by step, and eval.jsonl's loss by step."""
    steps: dict[int, dict] = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        steps[record["step"]] = {key: record.get(key) for key in FIELDS}
    evals = {}
    if (run_dir / "eval.jsonl").exists():
        for line in (run_dir / "eval.jsonl").read_text().splitlines():
            record = json.loads(line)
            evals[record["step"]] = record["loss"]
    return steps, evals


def steps_logged(run_dir: Path) -> int:
    try:
        return len((run_dir / "metrics.jsonl").read_text().splitlines())
    except OSError:
        return 0


def stop_at(proc: subprocess.Popen, run_dir: Path, step: int, how: tuple[str, str]) -> int:
    """Signal the run once metrics.jsonl holds `step` records; returns the records there at the signal."""
    while steps_logged(run_dir) < step and proc.poll() is None:
        time.sleep(0.005)
    at = steps_logged(run_dir)
    number = signal.Signals[how[0]]
    if proc.poll() is None:
        os.killpg(proc.pid, number) if how[1] == "group" else proc.send_signal(number)
    proc.wait(timeout=300)
    return at


def iteration(index: int, recipe_file: Path, root: Path, reference: tuple, rng: random.Random) -> dict:
    how = STOPS[index % len(STOPS)]
    step = rng.randint(2, STEPS - 2)
    run_dir = root / f"run-{index}"
    spinners = [subprocess.Popen([sys.executable, "-c", SPIN]) for _ in range(os.cpu_count() or 1)]
    started = time.perf_counter()
    runs: list[subprocess.Popen] = []
    try:
        runs.append(pretrain([str(recipe_file), "--run-dir", str(run_dir)]))
        at = stop_at(runs[0], run_dir, step, how)
        runs.append(pretrain([str(recipe_file), "--resume", "--run-dir", str(run_dir)]))
        _, err = runs[1].communicate(timeout=600)
    finally:  # also on Ctrl-C or SIGTERM: nothing this loop started outlives it
        for proc in runs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        for spinner in spinners:
            spinner.kill()
            spinner.wait()
    resumed = runs[1]
    seconds = time.perf_counter() - started
    load = os.getloadavg()[0]
    if resumed.returncode != 0:
        return {"index": index, "stop": how, "at": at, "seconds": seconds, "error": err.strip().splitlines()[-1:]}
    steps, evals = logged(run_dir)
    differ = [s for s in sorted(set(steps) | set(reference[0])) if steps.get(s) != reference[0].get(s)]
    differ += [f"eval@{s}" for s in sorted(set(evals) | set(reference[1])) if evals.get(s) != reference[1].get(s)]
    if not differ:
        shutil.rmtree(run_dir)
    result = {"index": index, "stop": how, "at": at, "seconds": seconds, "load": load, "differ": differ}
    if differ:
        result["values"] = {str(s): (steps.get(s), reference[0].get(s)) for s in differ if isinstance(s, int)}
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=30, help="Kill-and-resume iterations.")
    parser.add_argument("--seed", type=int, default=0, help="Seeds the stop points.")
    parser.add_argument("--keep", type=Path, default=None, help="Folder for the runs (default: a temporary one).")
    parser.add_argument("--no-record", action="store_true", help="Print only; do not append to BENCHMARKS.md.")
    parser.add_argument("--from-log", type=Path, default=None, help="Only tabulate a loop's printed JSON lines.")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # a SIGTERM unwinds like Ctrl-C: children are ended
    header = environment(["src/dlx", "benchmarks"])
    if args.from_log is not None:
        lines = args.from_log.read_text().splitlines()
        results = [json.loads(line) for line in lines if line.startswith('{"index"')]
        table = report(results, None, header)
        publish("Trust", RESUME_INTRO, table, record=not args.no_record)
        return
    root = Path(tempfile.mkdtemp(prefix="dlx-resume-loop-")) if args.keep is None else args.keep
    root.mkdir(parents=True, exist_ok=True)
    recipe_file = recipe(root)
    started = time.perf_counter()
    base = pretrain([str(recipe_file), "--run-dir", str(root / "reference")])
    _, err = base.communicate(timeout=600)
    assert base.returncode == 0, err
    reference = logged(root / "reference")
    reference_s = time.perf_counter() - started
    rng = random.Random(args.seed)
    results = []
    for index in range(args.iterations):
        result = iteration(index, recipe_file, root, reference, rng)
        results.append(result)
        print(json.dumps(result), flush=True)
    lines = report(results, reference_s, header)
    publish("Trust", RESUME_INTRO, lines, record=not args.no_record)
    if all(not r.get("differ") and "error" not in r for r in results) and args.keep is None:
        shutil.rmtree(root)


def report(results: list[dict], reference_s: float | None, header: list[str]) -> list[str]:
    differing = [r for r in results if r.get("differ")]
    failed = [r for r in results if "error" in r]
    seconds = [r["seconds"] for r in results]
    loads = [r["load"] for r in results if "load" in r]
    by_stop = {name: sum(1 for r in results if r["stop"][0] == name) for name, _ in STOPS}
    compared = (len(results) - len(failed)) * (STEPS * len(FIELDS) + STEPS // EVAL_EVERY)
    lines = [
        f"### {datetime.datetime.now().astimezone():%Y-%m-%d %H:%M %Z} — kill and resume a mixture run, looped",
        "",
        *header,
        "",
        "| what | figure |",
        "|---|---|",
        f"| iterations (stops: {', '.join(f'{n} {k}' for k, n in by_stop.items())}) | {len(results)} |",
        f"| iterations with any logged value different from the uninterrupted run | {len(differing)} |",
        f"| logged values compared bit for bit (per iteration: {STEPS} steps × {', '.join(FIELDS)}, "
        f"{STEPS // EVAL_EVERY} eval losses) | {compared:,} |",
        f"| steps and evaluations whose logged values differ | {sum(len(r.get('differ', [])) for r in results)} |",
        f"| iterations whose resume failed | {len(failed)} |",
        f"| uninterrupted reference run ({STEPS} steps) | "
        f"{f'{reference_s:.1f} s' if reference_s is not None else 'not in the log'} |",
        f"| one iteration (run, stop, resume to the end), median (min, max) | {statistics.median(seconds):.1f} s "
        f"({min(seconds):.1f}, {max(seconds):.1f}) |",
        f"| whole loop | {sum(seconds) / 60:.1f} min |",
        f"| 1-min load average at each iteration's end, median (min, max) | {statistics.median(loads):.2f} "
        f"({min(loads):.2f}, {max(loads):.2f}) |"
        if loads
        else "| load | none measured |",
    ]
    for r in differing + failed:
        lines.append(f"- iteration {r['index']}: {r['stop'][0]} at step {r['at']}: {r.get('differ') or r['error']}")
    return lines


if __name__ == "__main__":
    main()
