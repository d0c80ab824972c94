"""The chunked loss, GQA through SDPA and the one-cast norms, before and after, on a CPU: tokens/s and peak memory of
`dlx bench` points measured with the code of two revisions, in interleaved rounds.

Points: the demo's shape (the `demo` preset, 8,192-token vocabulary, seq 256, micro-batch 8) and the same model with
Llama 3's 128,256-token vocabulary (small apart from the vocabulary, so that the output layer and the loss dominate),
in the precision `auto` picks here and in fp32. Each measurement is one `python -m dlx bench` process (2 warm-up and 5
timed steps on synthetic data) with PYTHONPATH at that revision's src/: `before` is `git archive REV src` unpacked
into a temporary folder, `after` is this working tree. Rounds alternate which revision goes first, and each round's
ratio is taken within the round, so load from other processes on the machine hits both alike. Peak memory on a CPU
is the process's peak RSS over the timed steps (`dlx bench` resets it after the warm-up): the tensors plus the torch
runtime. est. GB is `dlx plan`'s estimate for the same point, from each revision.

Run:  .venv/bin/python benchmarks/bench_loss_path.py --before REV [--rounds 3] [--threads 1] [--no-record]
"""

from __future__ import annotations

import argparse
import csv
import datetime
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from io import BytesIO
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchmarks/, so that `peers` imports as a package
from peers.contenders import spread
from peers.record import ROOT, environment, record_section

DEMO_ARGS = {"dim": 256, "n_layers": 4, "n_heads": 4, "n_kv_heads": 2, "multiple_of": 16, "rope_theta": 10000.0}
DEMO_ARGS |= {"max_seq_len": 256, "norm_eps": 1e-5}


@dataclass(frozen=True)
class Point:
    name: str
    model: str
    """A preset or a model file."""
    precision: str
    seq_len: int = 256
    micro_batch: int = 8

    def argv(self, out: Path, steps: int, warmup: int) -> list[str]:
        return [
            *("bench", "--model", self.model, "--seq-len", str(self.seq_len), "--micro-batch", str(self.micro_batch)),
            *("--precision", self.precision, "--steps", str(steps), "--warmup", str(warmup), "--out", str(out)),
        ]


def points(folder: Path, precisions: list[str]) -> list[Point]:
    big_vocab = folder / "demo-128k-vocab.yaml"
    big_vocab.write_text("".join(f"{key}: {value}\n" for key, value in {**DEMO_ARGS, "vocab_size": 128256}.items()))
    result = []
    for precision in precisions:
        result.append(Point("demo (vocab 8,192)", "demo", precision))
        result.append(Point("demo dims, vocab 128,256", str(big_vocab), precision))
    return result


def unpack_revision(revision: str, folder: Path) -> Path:
    """`git archive REV src` into folder; returns its src/."""
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", revision, "src"], capture_output=True, check=True)
    with tarfile.open(fileobj=BytesIO(archive.stdout)) as tar:
        tar.extractall(folder, filter="data")
    return folder / "src"


def measure(src: Path, point: Point, args: argparse.Namespace, scratch: Path) -> dict[str, float]:
    """One `dlx bench` process with `src` first on PYTHONPATH; its CSV row's numbers."""
    out = Path(tempfile.mkdtemp(dir=scratch))
    env = {**os.environ, "PYTHONPATH": str(src), "OMP_NUM_THREADS": str(args.threads)}
    command = [sys.executable, "-m", "dlx", *point.argv(out, args.steps, args.warmup)]
    result = subprocess.run(command, env=env, capture_output=True, text=True, cwd=scratch)
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{result.stderr[-2000:]}")
    with open(out / "bench.csv", newline="") as f:
        row = next(csv.DictReader(f))
    return {key: float(row[key]) for key in ("tokens_per_s", "peak_mem_gb", "est_mem_gb")}


def run_rounds(args: argparse.Namespace, scratch: Path) -> tuple[list[Point], dict]:
    trees = {"before": unpack_revision(args.before, scratch / "before"), "after": ROOT / "src"}
    grid = points(scratch, args.precision.split(","))
    results: dict = {(p, rev): [] for p in grid for rev in trees}
    for index in range(args.rounds):
        order = ["before", "after"] if index % 2 == 0 else ["after", "before"]
        for point in grid:
            for rev in order:
                results[point, rev].append(measure(trees[rev], point, args, scratch))
                last = results[point, rev][-1]
                print(f"round {index + 1}, {point.name}, {point.precision}, {rev}: {last}", flush=True)
    return grid, results


def table(grid: list[Point], results: dict) -> list[str]:
    lines = [
        "| point | precision | tokens/s before | tokens/s after | after ÷ before, per round: median (min, max) "
        "| peak GB before | peak GB after | est. GB before | est. GB after |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for point in grid:
        before, after = results[point, "before"], results[point, "after"]
        ratios = [a["tokens_per_s"] / b["tokens_per_s"] for a, b in zip(after, before, strict=True)]

        def median(rows: list[dict], key: str) -> float:
            return statistics.median(row[key] for row in rows)

        lines.append(
            f"| {point.name}, seq {point.seq_len}, micro-batch {point.micro_batch} | {point.precision} "
            f"| {median(before, 'tokens_per_s'):,.0f} | {median(after, 'tokens_per_s'):,.0f} | {spread(ratios)} "
            f"| {median(before, 'peak_mem_gb'):.2f} | {median(after, 'peak_mem_gb'):.2f} "
            f"| {before[0]['est_mem_gb']:.2f} | {after[0]['est_mem_gb']:.2f} |"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", required=True, help="the revision to compare with (a commit, branch or tag)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="OMP_NUM_THREADS of each measurement")
    parser.add_argument("--precision", default="bf16,fp32", help="comma-separated")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--no-record", action="store_true", help="print only; do not append to BENCHMARKS.md")
    args = parser.parse_args()
    header = environment(["src/dlx", "benchmarks/bench_loss_path.py"])
    with tempfile.TemporaryDirectory(prefix="dlx-loss-path-") as scratch:
        grid, results = run_rounds(args, Path(scratch))
    before_sha = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", args.before], capture_output=True, text=True
    ).stdout.strip()
    stamp = f"### {datetime.datetime.now().astimezone():%Y-%m-%d %H:%M %Z}"
    lines = [
        stamp,
        "",
        *header,
        f"- before: {args.before} ({before_sha}); after: this tree; {args.rounds} interleaved rounds, "
        f"{args.steps} timed steps after {args.warmup} warm-up per measurement, synthetic data, "
        f"OMP_NUM_THREADS={args.threads} in each measurement",
        "",
        *table(grid, results),
    ]
    print("\n".join(lines))
    if not args.no_record:
        intro = "Measured by `benchmarks/bench_loss_path.py`; see its docstring."
        record_section("Loss path, GQA and norm casts (CPU)", intro, lines)


if __name__ == "__main__":
    main()
