"""Loader benchmarks (issue 4), on synthetic shards in a temporary folder.

(a) GIL tax: one CPU-bound torch training loop (a small MLP, forward + backward + SGD, about 5-20 ms a step, using all
    torch threads), fed in turns of 5 steps so that machine noise hits every feeder alike:
      prebuilt      tensors built in advance (the ceiling),
      prebuilt A/A  the same again: its spread is this machine's measurement noise,
      loader        TokenLoader with one worker process (what training uses),
      busy-poll     a feeder thread that spins on `queue.full()` like the seed author's loader (the contrast).
    Reported: prebuilt's time over the feeder's for each turn, median and quartiles; the target is loader ≥ 0.97.
(b) Throughput: tokens/s the loader delivers with nothing else running, against tokens/s the `demo` model trains at
    (fp32, forward + backward + AdamW, seq 256, micro-batch 8), interleaved too; the target is ≥ 50×.
    Tokens are counted as input tokens per batch (micro_batch × seq_len).

Run:  .venv/bin/python benchmarks/bench_loader.py            (appends to BENCHMARKS.md; --no-record to only print)
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import itertools
import os
import platform
import queue
import shlex
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import torch

from dlx.data.loader import TokenLoader
from dlx.data.loader.windows import SplitSpec, TokenWindows
from dlx.data.shards import Manifest, ShardInfo, write_manifest

VOCAB, SEQ, BATCH = 8192, 256, 8
Batch = tuple[torch.Tensor, torch.Tensor]


def make_dataset(folder: Path, n_tokens: int = 8_000_000, n_shards: int = 4) -> Path:
    """Random tokens below the demo vocabulary, in a few shards (checksums are not verified here)."""
    rng = np.random.default_rng(0)
    shards = []
    for i in range(n_shards):
        name = f"train-{i:05d}.bin"
        rng.integers(0, VOCAB, n_tokens // n_shards, dtype=np.uint16).tofile(folder / name)
        shards.append(ShardInfo(name=name, split="train", tokens=n_tokens // n_shards, documents=1, sha256="-"))
    write_manifest(folder, Manifest(dtype="uint16", vocab_size=VOCAB, eos_id=0, tokenizer_sha256="-", shards=shards))
    return folder


class MlpStep:
    """Embedding → MLP → regress the targets' embeddings; dense SGD update. Pure torch compute, no Python work."""

    def __init__(self, dim: int = 128, hidden: int = 384):
        generator = torch.Generator().manual_seed(0)
        self.params = [
            torch.randn(VOCAB, dim, generator=generator).requires_grad_(),
            (torch.randn(dim, hidden, generator=generator) / dim**0.5).requires_grad_(),
            (torch.randn(hidden, dim, generator=generator) / hidden**0.5).requires_grad_(),
        ]

    def __call__(self, inputs: torch.Tensor, targets: torch.Tensor) -> None:
        table, w1, w2 = self.params
        out = torch.relu(table[inputs] @ w1) @ w2  # (B, T, dim)
        (out - table[targets].detach()).pow(2).mean().backward()
        with torch.no_grad():
            for p in self.params:
                p -= 1e-4 * p.grad
                p.grad = None


# Feeders: each is a context manager yielding an iterator of batches.


@contextlib.contextmanager
def prebuilt(batches: list[Batch]) -> Iterator[Iterator[Batch]]:
    yield itertools.cycle(batches)


@contextlib.contextmanager
def loader(folder: Path) -> Iterator[Iterator[Batch]]:
    with TokenLoader(folder, seq_len=SEQ, micro_batch_size=BATCH, num_workers=1, prefetch=4) as it:
        yield it


@contextlib.contextmanager
def busy_poll_thread(folder: Path) -> Iterator[Iterator[Batch]]:
    """The anti-pattern: a thread that builds batches and spins while the queue is full, never sleeping."""
    ready: queue.Queue[Batch] = queue.Queue(maxsize=4)
    stop = threading.Event()
    windows = TokenWindows(SplitSpec.from_json(_split_json(folder)), SEQ)

    def produce() -> None:
        for b in itertools.count():
            out = np.empty((2, BATCH, SEQ), dtype=np.int64)
            windows.fill(np.arange(b * BATCH, (b + 1) * BATCH) % windows.n_windows, out)
            batch = torch.from_numpy(out)
            while ready.full():  # the busy wait
                if stop.is_set():
                    return
            ready.put((batch[0], batch[1]))

    thread = threading.Thread(target=produce, daemon=True)
    thread.start()
    try:
        yield iter(ready.get, None)
    finally:
        stop.set()
        thread.join()


def _split_json(folder: Path) -> dict:
    from dlx.data.loader.dataset import open_split

    return open_split(folder, "train", verify=False)[1].to_json()


def run_steps(step: Callable[[torch.Tensor, torch.Tensor], None], feed: Iterator[Batch], steps: int) -> float:
    """Seconds taken by `steps` training steps, each pulling its batch from `feed` (so the feeder's cost counts)."""
    start = time.perf_counter()
    for _ in range(steps):
        step(*next(feed))
    return time.perf_counter() - start


def gil_tax(folder: Path, triples: int, busy_rounds: int, block: int = 5) -> tuple[dict[str, list[float]], list[float]]:
    """Speed of each feeder relative to prebuilt, one entry per block: prebuilt seconds / feeder seconds.

    Prebuilt, a second prebuilt (the A/A control: how far two identical feeders drift apart on this machine) and the
    loader stay open together and take turns in blocks of `block` steps, in rotating order, so that a burst of load
    from other users of the machine hits all of them alike; the loader's worker idles while the others run. The
    busy-poll feeder cannot share the turns (its spinning thread would slow the others): each of its blocks starts
    a fresh thread and is compared with a prebuilt block run just before.
    """
    step = MlpStep()
    with TokenLoader(folder, seq_len=SEQ, micro_batch_size=BATCH, num_workers=0) as it:
        batches = [(x.clone(), y.clone()) for x, y in itertools.islice(it, 64)]
    speeds: dict[str, list[float]] = {"prebuilt again (A/A)": [], "loader": [], "busy-poll": []}
    step_ms: list[float] = []  # prebuilt's milliseconds per step, to show the size of the step
    with prebuilt(batches) as first, prebuilt(batches[::-1]) as again, loader(folder) as fed:
        feeds = {"prebuilt": first, "prebuilt again (A/A)": again, "loader": fed}
        for feed in feeds.values():
            run_steps(step, feed, 5)  # warm-up, untimed: the worker's start, allocator and caches
        names = list(feeds)
        for t in range(triples):
            seconds = {name: run_steps(step, feeds[name], block) for name in names[t % 3 :] + names[: t % 3]}
            step_ms.append(seconds["prebuilt"] / block * 1e3)
            for name in names[1:]:
                speeds[name].append(seconds["prebuilt"] / seconds[name])
    for _ in range(busy_rounds):
        with prebuilt(batches) as feed:
            reference = run_steps(step, feed, 2 * block)
        with busy_poll_thread(folder) as spin:
            run_steps(step, spin, 2)
            speeds["busy-poll"].append(reference / run_steps(step, spin, 2 * block))
    return speeds, step_ms


def loader_tokens_per_second(folder: Path, seconds: float, num_workers: int) -> float:
    with TokenLoader(folder, seq_len=SEQ, micro_batch_size=BATCH, num_workers=num_workers, prefetch=8) as it:
        for _ in itertools.islice(it, 20):  # warm-up: worker start
            pass
        n, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            for _ in itertools.islice(it, 100):
                n += 1
        return n * BATCH * SEQ / (time.perf_counter() - start)


def demo_train_tokens_per_second(batches: list[Batch], steps: int) -> float:
    from dlx.model import Transformer, resolve_model_args

    model = Transformer(resolve_model_args("demo"))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    feed = itertools.cycle(batches)

    def train_step(inputs: torch.Tensor, targets: torch.Tensor) -> None:
        logits = model(inputs)
        torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten()).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    run_steps(train_step, feed, 2)  # warm-up, untimed
    return BATCH * SEQ * steps / run_steps(train_step, feed, steps)


def throughput(folder: Path, rounds: int, train_steps: int) -> dict[str, list[float]]:
    with TokenLoader(folder, seq_len=SEQ, micro_batch_size=BATCH, num_workers=0) as it:
        batches = [(x.clone(), y.clone()) for x, y in itertools.islice(it, 8)]
    results: dict[str, list[float]] = {"loader, 1 worker": [], "loader, 2 workers": [], "demo training": []}
    for _ in range(rounds):
        results["loader, 1 worker"].append(loader_tokens_per_second(folder, 2.0, 1))
        results["demo training"].append(demo_train_tokens_per_second(batches, train_steps))
        results["loader, 2 workers"].append(loader_tokens_per_second(folder, 2.0, 2))
    return results


def ratios(values: list[float], reference: list[float]) -> list[float]:
    """Per-round ratio against the reference measured in the same round."""
    return [v / r for v, r in zip(values, reference, strict=True)]


def quartiles(values: list[float]) -> str:
    low, median, high = statistics.quantiles(values, n=4) if len(values) > 1 else values * 3
    return f"{median:.3f} ({low:.3f}, {high:.3f})"


def median_range(values: list[float]) -> str:
    return f"{statistics.median(values):,.0f} ({min(values):,.0f}, {max(values):,.0f})"


def gil_table(speeds: dict[str, list[float]]) -> list[str]:
    rows = ["| feeder | speed vs prebuilt: median (quartiles) over blocks | blocks |", "|---|---|---|"]
    rows += [f"| {name} | {quartiles(values)} | {len(values)} |" for name, values in speeds.items()]
    return rows


def throughput_table(results: dict[str, list[float]]) -> list[str]:
    rows = ["| what | tokens/s: median (min, max) | × demo training, per round: median (min, max) |", "|---|---|---|"]
    for name, values in results.items():
        rows.append(f"| {name} | {median_range(values)} | {median_range(ratios(values, results['demo training']))} |")
    return rows


def _relative(path: Path, root: Path) -> str:
    return str(path.relative_to(root)) if path.is_relative_to(root) else str(path)


def environment() -> list[str]:
    """The exact command, code version, library versions and hardware, for the record."""
    root = Path(__file__).resolve().parent.parent
    git = ["git", "-C", str(root)]
    sha = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(
        [*git, "status", "--porcelain", "--", "src/dlx/data/loader", "benchmarks/bench_loader.py"],
        capture_output=True,
        text=True,
    ).stdout.strip()
    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.processor(),
    )
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    return [
        f"- command: `{shlex.join([_relative(Path(sys.executable), root), *sys.argv])}` (from the repository root)",
        f"- git: {sha}{' (loader or benchmark files modified)' if dirty else ''}; "
        f"python {platform.python_version()}, torch {torch.__version__}, numpy {np.__version__}",
        f"- hardware: {cpu}, {os.cpu_count()} logical CPUs, torch threads {torch.get_num_threads()}; "
        f"load average before the run {load} (the machine is shared)",
    ]


def record_results(path: Path, lines: list[str]) -> None:
    """Append this run at the end of the "## Loader" section (created at the end of the file if missing)."""
    text = path.read_text() if path.exists() else "# Benchmarks\n"
    entry = "\n".join(lines) + "\n"
    start = text.find("\n## Loader\n")
    if start < 0:
        text = (
            text.rstrip("\n")
            + "\n\n## Loader\n\nMeasured by `benchmarks/bench_loader.py`; see its docstring.\n\n"
            + entry
        )
    else:
        end = text.find("\n## ", start + 1)
        end = len(text) if end < 0 else end + 1
        text = text[:end].rstrip("\n") + "\n\n" + entry + ("\n" + text[end:] if end < len(text) else "")
    path.write_text(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=90, help="(a): turns of 5 steps per feeder")
    parser.add_argument("--busy-rounds", type=int, default=5, help="(a): blocks of the busy-poll feeder")
    parser.add_argument("--rounds", type=int, default=3, help="(b): interleaved rounds")
    parser.add_argument("--train-steps", type=int, default=8, help="(b): timed demo training steps per round")
    parser.add_argument("--no-record", action="store_true", help="print only; do not append to BENCHMARKS.md")
    args = parser.parse_args()
    header = environment()
    with tempfile.TemporaryDirectory(prefix="dlx-bench-loader-") as tmp:
        folder = make_dataset(Path(tmp))
        speeds, step_ms = gil_tax(folder, args.blocks, args.busy_rounds)
        flow = throughput(folder, args.rounds, args.train_steps)
    tables = {
        f"(a) GIL tax: MLP training step ({statistics.median(step_ms):.1f} ms median) fed four ways, turns of 5 steps; "
        "target loader ≥ 0.97": gil_table(speeds),
        f"(b) Throughput: loader alone vs demo model training (seq {SEQ}, micro-batch {BATCH}, fp32 AdamW), "
        f"{args.rounds} interleaved rounds; target ≥ 50×": throughput_table(flow),
    }
    lines = [f"### {datetime.datetime.now().astimezone():%Y-%m-%d %H:%M %Z}", "", *header]
    for title, rows in tables.items():
        lines += ["", f"{title}:", "", *rows]
    print("\n".join(lines))
    if not args.no_record:
        record_results(Path(__file__).resolve().parent.parent / "BENCHMARKS.md", lines)


if __name__ == "__main__":
    main()
