"""Trust, round 3: what the checkpoint SHA-256s cost, at publish and at resume.

Two checkpoints: the demo recipe's (preset demo: model.safetensors in fp32, train_state.pt with AdamW's two moments)
and a 1B-sized one (a synthetic model.safetensors of --gb GB of bf16 tensors, 256 MiB each, about 1.25B parameters).

  publish   the SHA-256 is computed from the bytes handed to the writer (dlx.train.rundir.checkpoint_record): for
            model.safetensors, the header read back and every tensor hashed from memory after `save_file`
            (`safetensors_sha256`); for train_state.pt, hashed inside torch.save's writes (`save_torch`, against a
            plain torch.save to the same file). Cost = hashing time, and as a share of the write itself. (In a save
            the safetensors hash runs in a thread while train_state.pt is written: on a free core it hides behind
            that write; measured here alone, the CPU time it costs.)
  resume    every recorded file is read and hashed (`file_sha256`) before it is loaded: warm (the file in the page
            cache, as right after a save) and cold (its pages dropped with posix_fadvise(DONTNEED) first), beside
            the time safetensors' `load_file` takes to read the same file warm.

Each figure is the median of --rounds rounds, GB = 1e9 bytes. The files live in a temporary folder under --dir (on the
same disk as the run folders), removed at the end.

Run:  .venv/bin/python benchmarks/bench_trust3.py      (appends to BENCHMARKS.md; --no-record to only print)
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from safetensors.torch import load_file

from dlx.model.args import ModelArgs
from dlx.model.io import empty_model, save_weights_file, unique_state_dict
from dlx.model.presets import resolve_model_args
from dlx.train.rundir.checkpoint import save_torch
from dlx.train.rundir.checkpoint_record import file_sha256, safetensors_sha256

sys.path.insert(0, str(Path(__file__).parent))
from peers.record import environment, record_section

INTRO = (
    "What dlx's trust checks cost, measured by `benchmarks/bench_trust.py`, `bench_trust2.py` and `bench_trust3.py` "
    "(each entry says which)."
)


def timed(fn, rounds: int) -> float:
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def drop_cache(path: Path) -> None:
    with open(path, "rb") as f:
        os.fsync(f.fileno())
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)


def cold_sha256(path: Path) -> None:
    drop_cache(path)
    file_sha256(path)


def demo_state() -> tuple[dict[str, torch.Tensor], dict]:
    args: ModelArgs = resolve_model_args("demo")
    torch.manual_seed(0)
    model = empty_model(args, "cpu")
    for p in model.parameters():
        torch.nn.init.normal_(p, std=0.02)
    weights = unique_state_dict(model)
    moments = {name: {"exp_avg": torch.randn_like(t), "exp_avg_sq": torch.rand_like(t)} for name, t in weights.items()}
    return weights, {"optimizer": {"state": moments}, "scheduler": {"last_epoch": 200}}


def big_state(gb: float) -> dict[str, torch.Tensor]:
    elements = 128 << 20  # 256 MiB of bf16 per tensor
    count = max(1, round(gb * 1e9 / (2 * elements)))
    return {f"layers.{i}.weight": torch.empty(elements, dtype=torch.bfloat16).uniform_() for i in range(count)}


def measure(name: str, weights: dict[str, torch.Tensor], train_state: dict | None, folder: Path, rounds: int) -> list:
    path = folder / "model.safetensors"
    write = timed(lambda: save_weights_file(weights, path), rounds)
    size = path.stat().st_size
    hash_mem = timed(lambda: safetensors_sha256(path, weights), rounds)
    assert safetensors_sha256(path, weights) == file_sha256(path)  # the recorded hash is the file's
    warm = timed(lambda: file_sha256(path), rounds)
    cold = timed(lambda: cold_sha256(path), rounds)
    load = timed(lambda: load_file(str(path)), rounds)
    rows = [
        (name, "model.safetensors", size, write, hash_mem, warm, cold, load),
    ]
    if train_state is not None:
        plain_path, hashed_path = folder / "plain.pt", folder / "train_state.pt"
        plain = timed(lambda: torch.save(train_state, plain_path), rounds)
        hashed = timed(lambda: save_torch(train_state, hashed_path), rounds)
        size = hashed_path.stat().st_size
        warm = timed(lambda: file_sha256(hashed_path), rounds)
        cold = timed(lambda: cold_sha256(hashed_path), rounds)
        load = timed(lambda: torch.load(hashed_path, weights_only=True), rounds)
        rows.append((name, "train_state.pt", size, plain, hashed - plain, warm, cold, load))
    return rows


def table(rows: list) -> list[str]:
    lines = [
        "| checkpoint | file | size | write | SHA-256 at publish | publish overhead | resume: SHA-256 warm | "
        "resume: SHA-256 cold | load (warm) |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, file, size, write, hashing, warm, cold, load in rows:
        gb = size / 1e9
        lines.append(
            f"| {name} | {file} | {gb:.3f} GB | {write:.3f} s ({gb / write:.2f} GB/s) | "
            f"{max(hashing, 0):.3f} s ({gb / max(hashing, 1e-9):.2f} GB/s) | {100 * max(hashing, 0) / write:.0f} % | "
            f"{warm:.3f} s ({gb / warm:.2f} GB/s) | {cold:.3f} s ({gb / cold:.2f} GB/s) | {load:.3f} s |"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gb", type=float, default=2.5, help="size of the 1B-sized model.safetensors")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dir", default=None, help="where the temporary files go (default: the system's temp)")
    parser.add_argument("--no-record", action="store_true")
    args = parser.parse_args()
    header = environment(["src/dlx", "benchmarks"])
    folder = Path(tempfile.mkdtemp(prefix="dlx-bench-trust3-", dir=args.dir))
    try:
        weights, train_state = demo_state()
        rows = measure("demo", weights, train_state, folder, args.rounds)
        del weights, train_state
        big = big_state(args.gb)
        rows += measure("1B-sized (bf16)", big, None, folder, args.rounds)
        del big
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    lines = table(rows)
    print("\n".join(lines))
    if args.no_record:
        return
    note = (
        f"Checkpoint SHA-256s (`bench_trust3.py`, median of {args.rounds}). At publish: model.safetensors hashed "
        "from memory after `save_file` (header read back), train_state.pt inside torch.save's writes (overhead = "
        "hashing save − plain torch.save); publish overhead = that ÷ the write. At resume: each file read and "
        "hashed before it is loaded, warm (page cache) and cold (pages dropped first); load = safetensors `load_file` "
        "or torch.load(weights_only=True) warm."
    )
    title = f"### {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: checkpoint SHA-256s"
    record_section("Trust", INTRO, [title, "", *header, "", note, "", *lines])


if __name__ == "__main__":
    main()
