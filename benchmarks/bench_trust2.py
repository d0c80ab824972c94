"""Trust, round 2: what the shard-verification gate costs, and how the preflight memory check's estimate compares with
the measured peak RSS on this CPU.

(a) The gate (`TokenLoader.verify_read_shards`, run before every checkpoint and at the end of a run), on the demo's
dataset (stdlib-8k, prepared here) and on a synthetic dataset of --gb GB (uint16 shards of 100M tokens):
  - worst case: every shard was read before any background verification finished, so the gate hashes them all in the
    trainer's process (a short run; the first checkpoint of a large dataset's first epoch reads only a few shards);
  - usual case: after the workers' background threads verified the shards, the gate has nothing to hash;
  - per batch: the bookkeeping of what the consumed batches read, as the loader's time per batch with verification on
    and off (one worker, --batches batches of 8 × 256 tokens, median of --rounds interleaved rounds).
(b) The memory check: the estimate (`dlx.train.build.memory_check`, `dlx plan`'s formulas) for the demo recipe's layout
against the peak RSS of `dlx pretrain recipes/demo.yaml` (synthetic data, --steps steps, `/usr/bin/time -v`), and the
peak RSS of a process that only imports dlx and torch and builds nothing (the baseline the estimate does not count).

Run:  .venv/bin/python benchmarks/bench_trust2.py      (appends to BENCHMARKS.md; --no-record to only print)
"""

from __future__ import annotations

import argparse
import datetime
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from dlx.data.loader import TokenLoader
from dlx.data.loader.feed import ReadShards
from dlx.data.shards import Manifest, ShardInfo, read_manifest, sha256_file, shard_name, write_manifest
from dlx.data.source import LoaderSettings
from dlx.parallel.distributed import DistEnv
from dlx.precision import resolve_precision
from dlx.train.build.memory_check import check_memory
from dlx.train.demo import prepare_demo_data
from dlx.train.recipe import load_recipe
from peers.record import ROOT, environment, publish

SHARD_TOKENS = 100_000_000
INTRO = (
    "Trust, round 2 (benchmarks/bench_trust2.py): the shard-verification gate's cost and the memory check's estimate."
)


def synthetic_dataset(folder: Path, n_bytes: int) -> Path:
    """uint16 shards of random ids below 8192, SHARD_TOKENS each (the last shorter), and a manifest."""
    rng = np.random.default_rng(0)
    folder.mkdir(parents=True)
    (folder / "tokenizer.json").write_text("{}")
    shards, left, index = [], n_bytes // 2, 0
    while left > 0:
        n = min(SHARD_TOKENS, left)
        path = folder / shard_name("train", index)
        rng.integers(0, 8192, n, dtype=np.uint16).tofile(path)
        shards.append(ShardInfo(name=path.name, split="train", tokens=n, documents=1, sha256=sha256_file(path)))
        left, index = left - n, index + 1
    sha = sha256_file(folder / "tokenizer.json")
    manifest = Manifest(dtype="uint16", vocab_size=8192, eos_id=0, tokenizer_sha256=sha, shards=shards, complete=True)
    write_manifest(folder, manifest)
    return folder


def gate_worst_case(folder: Path) -> tuple[float, int, int]:
    """Seconds for the gate to hash every train shard, the shards and the bytes (read from the page cache)."""
    manifest = read_manifest(folder)
    checksums = {str(folder / s.name): s.sha256 for s in manifest.split_shards("train")}
    for path in checksums:  # warm the page cache, as a run that just read the shards has it
        Path(path).read_bytes()
    read = ReadShards()
    read.note_read(set(checksums), checksums)
    start = time.perf_counter()
    hashed = read.verify()
    seconds = time.perf_counter() - start
    return seconds, len(hashed), sum(Path(p).stat().st_size for p in hashed)


def gate_usual_case(folder: Path) -> tuple[float, int]:
    """Seconds for the gate once the background threads verified every shard; the shards hashed then (0 expected)."""
    with TokenLoader(folder, LoaderSettings(seq_len=256, micro_batch_size=8, num_workers=1, prefetch=4)) as loader:
        n_shards = len(read_manifest(folder).split_shards("train"))
        deadline = time.monotonic() + 600
        while len(loader._read.confirmed) < n_shards and time.monotonic() < deadline:
            next(loader)
        start = time.perf_counter()
        hashed = loader.verify_read_shards()
        return time.perf_counter() - start, len(hashed)


def per_batch_ms(folder: Path, batches: int, verify: bool) -> float:
    """Median milliseconds per batch taken from a one-worker loader (after 20 warm-up batches)."""
    with TokenLoader(
        folder, LoaderSettings(seq_len=256, micro_batch_size=8, num_workers=1, prefetch=4, verify=verify)
    ) as loader:
        for _ in range(20):
            next(loader)
        times = []
        for _ in range(batches):
            start = time.perf_counter()
            next(loader)
            times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def gate_rows(datasets: dict[str, Path], batches: int, rounds: int) -> list[str]:
    rows = [
        "| dataset | gate, worst case: all shards hashed now | gate, usual case | loader ms per batch, checksums "
        "on / off (median of rounds) |",
        "|---|---|---|---|",
    ]
    for name, folder in datasets.items():
        worst_s, n, size = gate_worst_case(folder)
        usual_s, usual_n = gate_usual_case(folder)
        on, off = [], []
        for _ in range(rounds):
            on.append(per_batch_ms(folder, batches, True))
            off.append(per_batch_ms(folder, batches, False))
        rows.append(
            f"| {name} | {worst_s:.3f} s for {n} shard(s), {size / 1e9:.3g} GB ({size / 1e6 / worst_s:.0f} MB/s) "
            f"| {1e6 * usual_s:.0f} µs, {usual_n} shard(s) hashed | {statistics.median(on):.3f} / "
            f"{statistics.median(off):.3f} |"
        )
    return rows


def max_rss_gb(command: list[str]) -> tuple[float, str]:
    proc = subprocess.run(["/usr/bin/time", "-v", *command], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    kb = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", proc.stderr).group(1))
    return kb * 1024 / 1e9, proc.stdout + proc.stderr


def memory_rows(steps: int) -> list[str]:
    overrides = ["--data.path", "synthetic", "--train.max_steps", str(steps), "--log.progress", "false"]
    config = load_recipe(ROOT / "recipes" / "demo.yaml", overrides)
    precision = resolve_precision(config.train.precision, torch.device("cpu"))
    estimate = check_memory(config, torch.device("cpu"), DistEnv(), precision).found
    with tempfile.TemporaryDirectory() as tmp:
        command = [sys.executable, "-m", "dlx", "pretrain", str(ROOT / "recipes" / "demo.yaml"), *overrides]
        run_gb, output = max_rss_gb([*command, "--run-dir", f"{tmp}/run"])
    base_gb, _ = max_rss_gb([sys.executable, "-c", "import torch, dlx.train.loop.trainer"])
    said = re.search(r"· memory: ([^·\n]+)", output)  # the preflight line of the run's header
    return [
        "| what | figure |",
        "|---|---|",
        f"| estimate for `recipes/demo.yaml` ({precision}, seq {config.data.seq_len}, micro-batch "
        f"{config.data.micro_batch_size}) | {estimate} |",
        f"| the run header's memory check | {said.group(1).strip() if said else 'not found'} |",
        f"| peak RSS of `dlx pretrain recipes/demo.yaml` ({steps} steps, synthetic data) | {run_gb:.3f} GB |",
        f"| peak RSS of a process that imports torch and dlx's trainer only | {base_gb:.3f} GB |",
        f"| run minus baseline (what the estimate counts, plus allocator and loader) | {run_gb - base_gb:.3f} GB |",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gb", type=float, default=1.0, help="Size of the synthetic dataset (0: skip it).")
    parser.add_argument("--batches", type=int, default=200, help="Batches per loader timing.")
    parser.add_argument("--rounds", type=int, default=3, help="Interleaved rounds of the loader timing.")
    parser.add_argument("--steps", type=int, default=6, help="Steps of the demo recipe for the RSS measurement.")
    parser.add_argument("--no-record", action="store_true", help="Print only; do not append to BENCHMARKS.md.")
    args = parser.parse_args()
    header = environment(["src/dlx", "benchmarks"])
    with tempfile.TemporaryDirectory(prefix="dlx-bench-trust2-") as tmp_name:
        tmp = Path(tmp_name)
        prepare_demo_data(tmp / "stdlib-8k")
        datasets = {"demo (stdlib-8k)": tmp / "stdlib-8k"}
        if args.gb:
            datasets[f"synthetic {args.gb:g} GB"] = synthetic_dataset(tmp / "synthetic", int(args.gb * 1e9))
        gates = gate_rows(datasets, args.batches, args.rounds)
    memory = memory_rows(args.steps)
    lines = [
        f"### {datetime.datetime.now().astimezone():%Y-%m-%d %H:%M %Z} — verification gate and memory check",
        "",
        *header,
        "",
        "(a) The shard-verification gate:",
        "",
        *gates,
        "",
        "(b) The preflight memory check on this CPU:",
        "",
        *memory,
    ]
    publish("Trust", INTRO, lines, record=not args.no_record)


if __name__ == "__main__":
    main()
