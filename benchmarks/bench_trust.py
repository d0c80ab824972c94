"""Trust (issue 15): the embedded demo's MFU and verdict on the machine as it is and with busy processes at start-up,
the demo's wall time, and what preflight costs for the demo and for the 1B recipe's dataset size.

Two runs of the demo's recipe (`dlx pretrain recipes/demo.yaml`, `--train.max_steps` --steps, on the stdlib dataset
prepared once beforehand): on the machine as it is, then with one spinning process per core started together with
it for --busy-seconds, which covers start-up (the CPU matmul probe, building the model) and the first steps. With
--demo-wall, also the demo as a user runs it: `dlx pretrain` with no arguments in an empty folder (preparing its
dataset), under `/usr/bin/time -v`. The load average is sampled every 5 s during each run.

Preflight for the 1B recipe is timed on a replica of its dataset's layout: the recipe's data section with 250 train
shards of 100M uint32 tokens (25B tokens, 20 per parameter of llama3.2-1b) and one validation shard, as sparse files
(the checks stat files, they do not read them), beside a tokenizer.json of Llama 3's size (9.1 MB, hashed in full).

Run:  .venv/bin/python benchmarks/bench_trust.py      (appends to BENCHMARKS.md; --no-record to only print)
"""

from __future__ import annotations

import argparse
import csv
import datetime
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from dlx.data.shards import Manifest, ShardInfo, read_manifest, write_manifest
from dlx.metrics.verdict import bottleneck_verdict
from dlx.train.build.preflight import checkpoint_bytes, run_preflight
from dlx.train.config import build_config
from dlx.train.demo import DEMO_DATA, demo_recipe, prepare_demo_data
from dlx.train.recipe import load_recipe
from peers.record import ROOT, environment, publish

SPIN = "import time\nend = time.monotonic() + {seconds}\nwhile time.monotonic() < end:\n    pass\n"
LLAMA3_TOKENIZER_BYTES = 9_085_698
"""Size of Meta Llama 3's tokenizer.json."""
ONE_B_SHARDS, SHARD_TOKENS = 250, 100_000_000


class LoadSampler:
    """The 1-minute load average every `every` seconds while running."""

    def __init__(self, every: float = 5.0) -> None:
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(every,), daemon=True)

    def _run(self, every: float) -> None:
        while not self._stop.wait(every):
            self.samples.append(os.getloadavg()[0])

    def __enter__(self) -> LoadSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def run_demo(folder: Path, busy_seconds: float, steps: int | None) -> dict:
    """`dlx pretrain` in `folder` (the demo recipe for `steps` steps, or the whole demo with None), with
    `busy_seconds` of one spinning process per core started beside it."""
    recipe = [] if steps is None else [str(ROOT / "recipes" / "demo.yaml"), "--train.max_steps", str(steps)]
    burners = [
        subprocess.Popen([sys.executable, "-c", SPIN.format(seconds=busy_seconds)])
        for _ in range(os.cpu_count() or 1)
        if busy_seconds > 0
    ]
    try:
        with LoadSampler() as load:
            proc = subprocess.run(
                ["/usr/bin/time", "-v", sys.executable, "-m", "dlx", "pretrain", *recipe],
                cwd=folder,
                capture_output=True,
                text=True,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
    finally:
        for burner in burners:
            burner.kill()
            burner.wait()
    (folder / "stdout.txt").write_text(proc.stdout)
    (folder / "stderr.txt").write_text(proc.stderr)
    if proc.returncode != 0:
        raise SystemExit(f"the demo failed in {folder} (exit {proc.returncode}); see stderr.txt there")
    return summarise(folder, proc.stdout, proc.stderr, load.samples)


def summarise(folder: Path, out: str, err: str, load: list[float]) -> dict:
    run_dir = next((folder / "runs").glob("demo*"))
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    evals = [json.loads(line) for line in (run_dir / "eval.jsonl").read_text().splitlines()]
    verdict = bottleneck_verdict(records)
    used = records[1:]
    peak = re.search(r"MFU = TFLOPS ÷ peak ([\d.]+) TFLOPS \((\w+); (.*)\)", out)
    attainable = re.search(r"attainable at start-up: ([\d.]+) TFLOPS.*?, (\d+)% of peak", out)
    wall = re.search(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): (\S+)", err)
    rss = re.search(r"Maximum resident set size \(kbytes\): (\d+)", err)
    return {
        "wall": wall.group(1) if wall else "n/a",
        "rss_gb": int(rss.group(1)) * 1024 / 1e9 if rss else float("nan"),
        "load": statistics.fmean(load) if load else os.getloadavg()[0],
        "peak": f"{peak.group(1)} TFLOPS {peak.group(2)}" if peak else "n/a",
        "peak_source": peak.group(3) if peak else "",
        "attainable": f"{attainable.group(1)} TFLOPS ({attainable.group(2)} % of peak)" if attainable else "n/a",
        "mfu_median": statistics.median(r["mfu"] for r in used),
        "mfu_max": max(r["mfu"] for r in records),
        "step_ms": 1e3 * statistics.median(r["step_s"] for r in used),
        "verdict": f"{verdict.kind}{'' if verdict.confident else ' (tentative)'}",
        "step_cv": verdict.evidence["step_cv"],
        "reason": verdict.reason,
        "losses": f"{records[0]['loss']:.3f} → {records[-1]['loss']:.3f} (step {records[-1]['step']}); "
        f"val {evals[-1]['loss']:.3f}",
        "preflight": next((line for line in out.splitlines() if line.startswith("Preflight passed")), "n/a"),
    }


WAIT_POLICIES = {"default (unset)": None, "OMP_WAIT_POLICY=PASSIVE": "PASSIVE"}


def wait_policy_rows(tmp: Path, rounds: int) -> list[str]:
    """The demo's step (bf16 autocast where native, seq 256, micro-batch 8) under `dlx bench`, OpenMP's wait policy
    default against PASSIVE (idle threads sleep instead of spinning), interleaved round by round."""
    steps: dict[str, list[float]] = {name: [] for name in WAIT_POLICIES}
    loads = []
    for index in range(rounds):
        for name, policy in WAIT_POLICIES.items():
            env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
            env.update({"OMP_WAIT_POLICY": policy} if policy else {})
            out = tmp / f"policy-{index}-{policy}"
            cmd = [sys.executable, "-m", "dlx", "bench", "--model", "demo", "--seq-len", "256", "--micro-batch", "8"]
            cmd += ["--precision", "auto", "--steps", "2", "--warmup", "1", "--out", str(out)]
            loads.append(os.getloadavg()[0])
            subprocess.run(cmd, check=True, capture_output=True, env=env)
            with open(out / "bench.csv", newline="") as f:
                row = next(csv.DictReader(f))  # quoted fields hold commas: "CPU (2 threads, torch uses 2)"
            steps[name].append(1e3 * float(row["step_s"]))
    table = ["| OpenMP wait policy | step ms per round | median |", "|---|---|---:|"]
    table += [f"| {n} | {', '.join(f'{v:.0f}' for v in s)} | {statistics.median(s):.0f} |" for n, s in steps.items()]
    return [*table, "", f"1-min load average at each start: {min(loads):.1f}–{max(loads):.1f}."]


def one_b_replica(folder: Path) -> Path:
    """The 1B recipe's dataset layout as sparse files: stat-able at their exact sizes, taking no disk."""
    folder.mkdir(parents=True)
    tokenizer = folder / "tokenizer.json"
    with open(tokenizer, "wb") as f:
        f.write(os.urandom(LLAMA3_TOKENIZER_BYTES))
    from dlx.data.shards import sha256_file

    shards = []
    for split, count in (("train", ONE_B_SHARDS), ("val", 1)):
        for index in range(count):
            name = f"{split}-{index:05d}.bin"
            with open(folder / name, "wb") as f:
                f.truncate(SHARD_TOKENS * 4)
            shards.append(ShardInfo(name=name, split=split, tokens=SHARD_TOKENS, documents=1, sha256="0" * 64))
    manifest = Manifest(
        dtype="uint32",
        vocab_size=128_256,
        eos_id=128_001,
        tokenizer_sha256=sha256_file(tokenizer),
        shards=shards,
        complete=True,
    )
    write_manifest(folder, manifest)
    return folder


def time_preflight(config, run_dir: Path, repeats: int) -> dict[str, float]:
    """Median milliseconds of each check over `repeats` runs (the first, which warms the file-system caches, too)."""
    runs = [run_preflight(config, run_dir, resume=False, world_size=1) for _ in range(repeats)]
    names = [check.name for check in runs[0].checks]
    timings = {name: statistics.median(1e3 * r.checks[i].seconds for r in runs) for i, name in enumerate(names)}
    timings["all"] = statistics.median(1e3 * sum(c.seconds for c in r.checks) for r in runs)
    timings["first run"] = 1e3 * sum(c.seconds for c in runs[0].checks)
    return timings


def preflight_rows(demo_data: Path, tmp: Path, repeats: int) -> list[str]:
    recipe = demo_recipe(read_manifest(demo_data).vocab_size)
    recipe["data"]["path"] = str(demo_data)
    demo = build_config(recipe)
    one_b = load_recipe(ROOT / "recipes" / "llama3.2-1b.yaml", ["--data.path", str(one_b_replica(tmp / "one_b"))])
    figures = {
        "demo": time_preflight(demo, tmp / "pf-demo", repeats),
        "1B": time_preflight(one_b, tmp / "pf-1b", repeats),
    }
    names = list(figures["demo"])
    rows = ["| check | demo (ms) | llama3.2-1b recipe, 25B-token replica (ms) |", "|---|---:|---:|"]
    rows += [f"| {name} | {figures['demo'][name]:.2f} | {figures['1B'][name]:.2f} |" for name in names]
    shards = len(read_manifest(demo_data).shards)
    rows += [
        "",
        f"Median of {repeats} runs each. The demo's dataset has {shards} shards and an 8,192-token tokenizer; the "
        f"replica {ONE_B_SHARDS + 1} shards of 400 MB (sparse) and a {LLAMA3_TOKENIZER_BYTES / 1e6:.1f} MB "
        "tokenizer.json, whose SHA-256 is most of the cost. Checkpoint estimate (disk check): demo "
        f"{checkpoint_bytes(demo) / 1e6:.1f} MB, llama3.2-1b {checkpoint_bytes(one_b) / 1e9:.1f} GB per checkpoint.",
    ]
    return rows


def demo_rows(results: dict[str, dict]) -> list[str]:
    rows = ["| | " + " | ".join(results) + " |", "|---|" + "---|" * len(results)]
    labels = {
        "wall": "wall time (`/usr/bin/time -v`)",
        "load": "1-min load average during the run (mean of 5 s samples)",
        "peak": "peak MFU divides by (header)",
        "attainable": "attainable at start-up (1024³ matmul)",
        "mfu_median": "MFU median after step 1 (attention convention)",
        "mfu_max": "MFU max, any record",
        "step_ms": "median step (ms)",
        "verdict": "verdict",
        "step_cv": "step-time CV (threshold 15 %)",
        "losses": "train loss step 1 → last; final validation loss",
        "rss_gb": "peak RSS (GB)",
    }
    for key, label in labels.items():
        cells = [_cell(key, r[key]) for r in results.values()]
        rows.append(f"| {label} | " + " | ".join(cells) + " |")
    first = next(iter(results.values()))
    rows += ["", f"Peak source: {first['peak_source']}", "", f"Preflight line of the first run: `{first['preflight']}`"]
    return rows


def _cell(key: str, value) -> str:
    if key in ("mfu_median", "mfu_max", "step_cv"):
        return f"{100 * value:.1f} %"
    if key in ("load", "rss_gb"):
        return f"{value:.2f}"
    if key == "step_ms":
        return f"{value:.0f}"
    return str(value)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--busy-seconds", type=float, default=60.0, help="How long the busy processes spin.")
    parser.add_argument("--repeats", type=int, default=20, help="Preflight runs per dataset.")
    parser.add_argument("--steps", type=int, default=100, help="Optimizer steps of each recipe run.")
    parser.add_argument("--demo-wall", action="store_true", help="Also time the whole demo in an empty folder.")
    parser.add_argument("--policy-rounds", type=int, default=3, help="Rounds of the OpenMP wait-policy comparison.")
    parser.add_argument("--no-record", action="store_true", help="Print only; do not append to BENCHMARKS.md.")
    parser.add_argument("--preflight-only", action="store_true", help="Only the preflight table (implies --no-record).")
    parser.add_argument("--policy-only", action="store_true", help="Only the OpenMP wait-policy comparison.")
    args = parser.parse_args()
    header = environment(["src/dlx", "benchmarks"])
    with tempfile.TemporaryDirectory(prefix="dlx-bench-trust-") as tmp_name:
        tmp = Path(tmp_name)
        if args.preflight_only:
            prepare_demo_data(tmp / DEMO_DATA)
            print("\n".join(preflight_rows(tmp / DEMO_DATA, tmp, args.repeats)))
            return
        if args.policy_only:
            policies = wait_policy_rows(tmp, args.policy_rounds)
            lines = [f"### {datetime.datetime.now().astimezone():%Y-%m-%d %H:%M %Z}", "", *header, "", *POLICY_HEAD]
            lines += ["", *policies]
            publish("Trust", TRUST_INTRO, lines, record=not args.no_record)
            return
        started = time.perf_counter()
        prepare_demo_data(tmp / DEMO_DATA)
        prepare_s = time.perf_counter() - started
        results = {}
        for name, busy in (("machine as it is", 0.0), (f"+ {os.cpu_count()} spinning processes", args.busy_seconds)):
            folder = tmp / f"run-{len(results)}"
            (folder / "data").mkdir(parents=True)
            (folder / DEMO_DATA).symlink_to(tmp / DEMO_DATA)
            results[name] = run_demo(folder, busy, args.steps)
        if args.demo_wall:
            (tmp / "demo").mkdir()
            results["`dlx pretrain` (the whole demo, empty folder)"] = run_demo(tmp / "demo", 0.0, None)
        preflight = preflight_rows(tmp / DEMO_DATA, tmp, args.repeats)
        policies = wait_policy_rows(tmp, args.policy_rounds) if args.policy_rounds else []
    lines = [
        f"### {datetime.datetime.now().astimezone():%Y-%m-%d %H:%M %Z}",
        "",
        *header,
        "",
        f"The demo's recipe, {args.steps} steps (`recipes/demo.yaml`, dataset prepared beforehand in "
        f"{prepare_s:.0f} s); the spinning processes ran for the first {args.busy_seconds:.0f} s:",
        "",
        *demo_rows(results),
        "",
        "Preflight, per check:",
        "",
        *preflight,
        "",
        "- per-shard checksum verification in the loader's workers: its cost is the data wait with and without "
        "checksums in benchmarks/bench_loader.py (section Loader contest, table (c))",
    ]
    if policies:
        lines += ["", *POLICY_HEAD, "", *policies]
    publish("Trust", TRUST_INTRO, lines, record=not args.no_record)


POLICY_HEAD = ["A demo step (`dlx bench --model demo`, 2 timed steps after 1 warm-up) by OpenMP wait policy:"]
TRUST_INTRO = (
    "Every number and message true (issue 15): MFU against the device's theoretical peak (on a CPU: cores × clock × "
    "FLOPs per cycle), so it cannot exceed 100 %; the verdict's confidence; what preflight costs. "
    "Program: `benchmarks/bench_trust.py`."
)

if __name__ == "__main__":
    main()
