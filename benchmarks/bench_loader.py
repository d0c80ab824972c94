"""The loader contest: dlx's TokenLoader against torch's DataLoader and torchdata's StatefulDataLoader (both fed dlx's
order and windows: loader_contenders.py), on synthetic shards in a temporary folder, one worker process each unless
said otherwise, prefetch 4.

(a) GIL tax: one CPU-bound torch training loop (a small MLP, forward + backward + SGD, about 5-20 ms a step, using all
    torch threads), fed in turns of 5 steps so that machine noise hits every feeder alike:
      prebuilt      tensors built in advance (the ceiling),
      prebuilt A/A  the same again: its spread is this machine's measurement noise,
      each contender,
      busy-poll     a feeder thread that spins on `queue.full()` (the contrast).
    Reported: prebuilt's time over the feeder's for each turn, median and quartiles; the bar is ≥ 0.97. And the CPU
    time the trainer's own thread spends per batch (thread_time, so other processes' load does not count).
(b) Throughput: tokens/s each contender delivers with nothing else running (1 and 2 workers), against tokens/s the
    `demo` model trains at (fp32, forward + backward + AdamW, seq 256, micro-batch 8), interleaved; the bar is ≥ 50×.
    Tokens are input tokens per batch (micro_batch × seq_len). Also: construction to first batch, a worker's USS.
(c) Data wait in the demo: the demo recipe trained a few steps with each contender as its training loader (dlx with
    and without per-shard checksum verification); data wait ÷ step time over steps 2..; the bar is ≤ 1 %.
(d) Shutdown: a trainer with dlx's signal handling (finish the step: 4 micro-batches; close; exit 128 + signal) is
    sent SIGINT (its process group, as Ctrl-C), SIGTERM or SIGKILL (the trainer only); the bar: the step finishes
    (SIGINT/SIGTERM), no worker runs 5 s after the trainer ended, no /dev/shm entry is left.
(e) Failures and resume: a worker killed (seconds until the trainer's error, does it name the pid), a worker failing
    on a shard removed under it (does the trainer's error name the shard and the cause, in one line), and exact
    resume (same world size, 2 ranks → 1, 1 → 2, 2 workers → 1).

Run:  .venv/bin/python benchmarks/bench_loader.py            (appends to BENCHMARKS.md; --no-record to only print)
      .venv/bin/python benchmarks/bench_loader.py --only failing-worker    (that row of (e) alone, a partial entry)
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import io
import itertools
import queue
import statistics
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchmarks/: the contest modules and `peers.record`
import loader_contest as contest
from dlx.data.loader.windows import SplitSpec, TokenWindows
from dlx.data.shards import Manifest, ShardInfo, sha256_file, write_manifest
from loader_contenders import CONTENDERS, make_loader
from peers.contenders import batches_per_second
from peers.record import environment, record_section

VOCAB, SEQ, BATCH, PREFETCH = 8192, 256, 8, 4
SECTION = "Loader contest"
INTRO = "Measured by `benchmarks/bench_loader.py`; see its docstring for what each table measures and its bar."
WATCHED = ["src/dlx/data", "benchmarks"]
Batch = tuple[torch.Tensor, torch.Tensor]
warnings.filterwarnings("ignore", message=".*set_vital.*")  # torchdata 0.11 calls a deprecated torch API


def write_shards(folder: Path, arrays: list[np.ndarray], vocab_size: int) -> Path:
    """A train split of one uint16 shard per array, with checksums and a manifest, as `dlx prepare` writes it."""
    folder.mkdir(parents=True, exist_ok=True)
    shards = []
    for i, tokens in enumerate(arrays):
        path = folder / f"train-{i:05d}.bin"
        tokens.astype("<u2").tofile(path)
        digest = sha256_file(path)
        shards.append(ShardInfo(name=path.name, split="train", tokens=len(tokens), documents=1, sha256=digest))
    manifest = Manifest(dtype="uint16", vocab_size=vocab_size, eos_id=0, tokenizer_sha256="-", shards=shards)
    write_manifest(folder, manifest)
    return folder


def random_dataset(folder: Path, n_tokens: int = 8_000_000, n_shards: int = 4) -> Path:
    """Random tokens below the demo vocabulary, in a few shards."""
    rng = np.random.default_rng(0)
    return write_shards(folder, [rng.integers(0, VOCAB, n_tokens // n_shards) for _ in range(n_shards)], VOCAB)


def counting_dataset(folder: Path, n_windows: int = 2400, seq_len: int = 16) -> Path:
    """Consecutive integers (a window's first token names it) in three uneven shards; n_windows divides by 8."""
    n_tokens = n_windows * seq_len + 1
    bounds = [0, n_tokens // 3, n_tokens // 3 + n_tokens // 2, n_tokens]
    return write_shards(folder, [np.arange(a, b) for a, b in itertools.pairwise(bounds)], 2**16)


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


@contextlib.contextmanager
def busy_poll_thread(folder: Path) -> Iterator[Iterator[Batch]]:
    """The anti-pattern: a thread that builds batches and spins while the queue is full, never sleeping."""
    ready: queue.Queue[Batch] = queue.Queue(maxsize=PREFETCH)
    stop = threading.Event()
    manifest_shards = [(p.name, p.stat().st_size // 2) for p in sorted(folder.glob("train-*.bin"))]
    windows = TokenWindows(SplitSpec(str(folder), "uint16", tuple(manifest_shards)), SEQ)

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


def run_steps(step: Callable[[torch.Tensor, torch.Tensor], None], feed: Iterator[Batch], steps: int) -> float:
    """Seconds taken by `steps` training steps, each pulling its batch from `feed` (so the feeder's cost counts)."""
    start = time.perf_counter()
    for _ in range(steps):
        step(*next(feed))
    return time.perf_counter() - start


def gil_tax(folder: Path, turns: int, busy_rounds: int, block: int = 5) -> tuple[dict[str, list[float]], list[float]]:
    """Speed of each feeder relative to prebuilt, one entry per turn: prebuilt seconds / feeder seconds.

    Prebuilt, a second prebuilt (the A/A control: how far two identical feeders drift apart on this machine) and the
    contenders stay open together and take turns in blocks of `block` steps, in rotating order, so that a burst of load
    from other users of the machine hits all of them alike; a contender's worker idles while the others run. The
    busy-poll feeder cannot share the turns (its spinning thread would slow the others): each of its blocks starts
    a fresh thread and is compared with a prebuilt block run just before.
    """
    step = MlpStep()
    with make_loader(CONTENDERS[0], folder, seq_len=SEQ, micro_batch_size=BATCH, num_workers=0) as it:
        batches = [(x.clone(), y.clone()) for x, y in itertools.islice(it, 64)]
    speeds: dict[str, list[float]] = {"prebuilt again (A/A)": [], **{c: [] for c in CONTENDERS}, "busy-poll": []}
    step_ms: list[float] = []  # prebuilt's milliseconds per step, to show the size of the step
    options = {"seq_len": SEQ, "micro_batch_size": BATCH, "num_workers": 1, "prefetch": PREFETCH}
    with contextlib.ExitStack() as stack:
        feeds = {"prebuilt": itertools.cycle(batches), "prebuilt again (A/A)": itertools.cycle(batches[::-1])}
        feeds |= {c: stack.enter_context(make_loader(c, folder, **options)) for c in CONTENDERS}
        for feed in feeds.values():
            run_steps(step, feed, 5)  # warm-up, untimed: the worker's start, allocator and caches
        names = list(feeds)
        for t in range(turns):
            shift = t % len(names)
            seconds = {name: run_steps(step, feeds[name], block) for name in names[shift:] + names[:shift]}
            step_ms.append(seconds["prebuilt"] / block * 1e3)
            for name in names[1:]:
                speeds[name].append(seconds["prebuilt"] / seconds[name])
    for _ in range(busy_rounds):
        reference = run_steps(step, itertools.cycle(batches), 2 * block)
        with busy_poll_thread(folder) as spin:
            run_steps(step, spin, 2)
            speeds["busy-poll"].append(reference / run_steps(step, spin, 2 * block))
    return speeds, step_ms


def tokens_per_second(contender: str, folder: Path, seconds: float, num_workers: int) -> float:
    options = {"seq_len": SEQ, "micro_batch_size": BATCH, "num_workers": num_workers, "prefetch": PREFETCH}
    with make_loader(contender, folder, **options) as it:
        return batches_per_second(it, seconds, chunk=100) * BATCH * SEQ


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


DEMO = "demo training"


def throughput(folder: Path, rounds: int, train_steps: int) -> dict[str, list[float]]:
    with make_loader(CONTENDERS[0], folder, seq_len=SEQ, micro_batch_size=BATCH, num_workers=0) as it:
        batches = [(x.clone(), y.clone()) for x, y in itertools.islice(it, 8)]
    results: dict[str, list[float]] = {f"{c}, {n} worker{'s' * (n > 1)}": [] for c in CONTENDERS for n in (1, 2)}
    results[DEMO] = []
    for r in range(rounds):
        for name in itertools.islice(itertools.cycle(results), r, r + len(results)):  # rotating order
            if name == DEMO:
                results[name].append(demo_train_tokens_per_second(batches, train_steps))
            else:
                contender, workers = name.rsplit(", ", 1)
                results[name].append(tokens_per_second(contender, folder, 2.0, int(workers.split()[0])))
    return results


def startup(folder: Path, rounds: int) -> dict[str, dict[str, float]]:
    """Median seconds to the first batch and a worker's unique memory, per contender, measured in rotating turns."""
    first: dict[str, list[float]] = {c: [] for c in CONTENDERS}
    for r in range(rounds):
        for contender in CONTENDERS[r % 3 :] + CONTENDERS[: r % 3]:
            first[contender].append(contest.startup_seconds(contender, folder))
    return {
        c: {"first_batch_s": statistics.median(first[c]), "worker_uss_mb": contest.worker_memory_mb(c, folder)}
        for c in CONTENDERS
    }


def demo_wait(dataset: Path, vocab_size: int, rounds: int, steps: int) -> dict[str, list[dict]]:
    rows = {f"{CONTENDERS[0]}, checksums verified": (CONTENDERS[0], True), CONTENDERS[0]: (CONTENDERS[0], False)}
    rows |= {c: (c, False) for c in CONTENDERS[1:]}
    results: dict[str, list[dict]] = {name: [] for name in rows}
    for r in range(rounds):
        for name in itertools.islice(itertools.cycle(rows), r, r + len(rows)):
            contender, verify = rows[name]
            with contextlib.redirect_stdout(io.StringIO()):
                results[name].append(contest.demo_data_wait(contender, dataset, steps, vocab_size, verify))
    return results


def shutdown(folder: Path, repeats: int) -> dict[tuple[str, str], list[dict]]:
    results: dict[tuple[str, str], list[dict]] = {}
    for _ in range(repeats):
        for contender in CONTENDERS:
            for name in ("SIGINT", "SIGTERM", "SIGKILL"):
                results.setdefault((contender, name), []).append(contest.signal_trainer(contender, folder, name))
    return results


def failures_and_resume(folder: Path) -> dict[str, dict]:
    cases = {"same world size": ((1, 1), (1, 1)), "2 ranks → 1": ((2, 1), (1, 1)), "1 rank → 2": ((1, 1), (2, 1))}
    cases["2 workers → 1"] = ((1, 2), (1, 1))
    return {
        c: {
            "killed": contest.isolated("killed_worker", c, folder),
            "failing": contest.failing_worker(c, folder),
            **{name: contest.resume_exact(c, folder, *worlds) for name, worlds in cases.items()},
        }
        for c in CONTENDERS
    }


def quartiles(values: list[float]) -> str:
    low, median, high = statistics.quantiles(values, n=4) if len(values) > 1 else values * 3
    return f"{median:.3f} ({low:.3f}, {high:.3f})"


def median_range(values: list[float], digits: int = 0) -> str:
    return f"{statistics.median(values):,.{digits}f} ({min(values):,.{digits}f}, {max(values):,.{digits}f})"


def gil_table(speeds: dict[str, list[float]], cpu_us: dict[str, float]) -> list[str]:
    rows = ["| feeder | speed vs prebuilt: median (quartiles) over turns | turns |", "|---|---|---|"]
    rows += [f"| {name} | {quartiles(values)} | {len(values)} |" for name, values in speeds.items()]
    rows += ["", "| contender | the trainer thread's CPU time per batch, µs (median of 5 × 200 batches) |", "|---|---|"]
    return rows + [f"| {c} | {us:,.0f} |" for c, us in cpu_us.items()]


def throughput_table(results: dict[str, list[float]], first: dict[str, dict[str, float]]) -> list[str]:
    rows = ["| what | tokens/s: median (min, max) | × demo training, per round: median (min, max) |", "|---|---|---|"]
    for name, values in results.items():
        per_round = [v / d for v, d in zip(values, results[DEMO], strict=True)]
        rows.append(f"| {name} | {median_range(values)} | {median_range(per_round)} |")
    rows += ["", "| contender | construction to first batch, s (median) | one worker's USS after 200 batches, MB |"]
    rows += ["|---|---|---|"]
    rows += [f"| {c} | {v['first_batch_s']:.3f} | {v['worker_uss_mb']:.1f} |" for c, v in first.items()]
    return rows


def wait_table(results: dict[str, list[dict]], hash_mb_s: float, demo_mb: float) -> list[str]:
    rows = [
        "| training loader | data wait, % of step time, steps 2..: median (min, max) | step s (median) | "
        "step 1 data wait, s (median) |",
        "|---|---|---|---|",
    ]
    for name, runs in results.items():
        pct = median_range([r["wait_pct"] for r in runs], 3)
        first = statistics.median(r["first_wait_s"] for r in runs)
        rows.append(f"| {name} | {pct} | {statistics.median(r['step_s'] for r in runs):.3f} | {first:.3f} |")
    return [
        *rows,
        "",
        f"SHA-256 in one thread on this machine: {hash_mb_s:,.0f} MB/s; a worker verifies its share of the shards at "
        f"that rate in the background (the demo's {demo_mb:.1f} MB: {demo_mb / hash_mb_s * 1e3:.0f} ms; 1 GB: "
        f"{1e3 / hash_mb_s:.1f} s).",
    ]


def hash_rate_mb_s(folder: Path) -> float:
    """Best of three passes of SHA-256 over the random dataset's shards (page-cached), in MB/s."""
    paths = sorted(folder.glob("train-*.bin"))
    size = sum(p.stat().st_size for p in paths) / 1e6
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        for path in paths:
            sha256_file(path)
        best = min(best, time.perf_counter() - start)
    return size / best


def shutdown_table(results: dict[tuple[str, str], list[dict]]) -> list[str]:
    rows = [
        "| contender | signal | step finished, exit 128 + n (runs) | workers outlived the trainer by, s (each run) | "
        "/dev/shm entries left |",
        "|---|---|---|---|---|",
    ]
    for (contender, name), runs in results.items():
        orderly = "—" if name == "SIGKILL" else f"{sum(r['orderly'] for r in runs)}/{len(runs)}"
        linger = ", ".join("> 15" if r["linger_s"] is None else f"{r['linger_s']:.2f}" for r in runs)
        rows.append(f"| {contender} | {name} | {orderly} | {linger} | {sum(len(r['shm_left']) for r in runs)} |")
    errors = [f"- {c}, {n}: {r['code']} {r['error']}" for (c, n), runs in results.items() for r in runs if r["error"]]
    return rows + (["", "Unexpected endings:", *errors] if errors else [])


def failing_cell(failing: dict) -> str:
    return f"{failing['named']} / {failing['one_line']}"


def failures_table(results: dict[str, dict]) -> list[str]:
    resume = [k for k in next(iter(results.values())) if k not in ("killed", "failing")]
    rows = [
        "| contender | worker SIGKILLed: error after, s (raised in) | names the pid | failing worker (shard removed): "
        f"error names shard and cause / in one line | exact resume: {' / '.join(resume)} |",
        "|---|---|---|---|---|",
    ]
    for contender, r in results.items():
        killed, seconds = r["killed"], r["killed"]["seconds"]
        after = "none" if seconds is None else f"{seconds:.3f} (in {killed['where']})"
        rows.append(
            f"| {contender} | {after} | {killed['names_pid']} "
            f"| {failing_cell(r['failing'])} | {' / '.join('yes' if r[k] else 'NO' for k in resume)} |"
        )
    rows += ["", "The trainer's error when a worker was killed:", ""]
    return rows + [f"- {c}: `{r['killed']['message'][:160]}`" for c, r in results.items()]


def failing_or_missing(contender: str, folder: Path) -> dict:
    """`contest.failing_worker`, or a row saying the contender's library is not installed (a partial run)."""
    try:
        return contest.failing_worker(contender, folder)
    except ModuleNotFoundError as e:
        return {"named": "—", "one_line": "—", "message": f"not run: {e}"}


def failing_table(results: dict[str, dict]) -> list[str]:
    """(e)'s failing-worker column alone, with the trainer's error (its last line)."""
    rows = ["| contender | failing worker (shard removed): error names shard and cause / in one line |", "|---|---|"]
    rows += [f"| {c} | {failing_cell(r)} |" for c, r in results.items()]
    return [
        *rows,
        "",
        "The trainer's error (last line):",
        "",
        *[f"- {c}: `{r['message'][:200]}`" for c, r in results.items()],
    ]


def prepare_demo_dataset(folder: Path) -> int:
    from dlx.data.prepare import prepare_dataset
    from dlx.train.demo import DEMO_VOCAB

    manifest = prepare_dataset(None, folder, corpus="stdlib", train_tokenizer=DEMO_VOCAB, progress=False)
    return manifest.vocab_size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=90, help="(a): turns of 5 steps per feeder")
    parser.add_argument("--busy-rounds", type=int, default=5, help="(a): blocks of the busy-poll feeder")
    parser.add_argument("--rounds", type=int, default=3, help="(b): interleaved rounds")
    parser.add_argument("--train-steps", type=int, default=8, help="(b): timed demo training steps per round")
    parser.add_argument("--demo-rounds", type=int, default=2, help="(c): interleaved demo runs per training loader")
    parser.add_argument("--demo-steps", type=int, default=30, help="(c): optimizer steps per demo run")
    parser.add_argument("--signal-repeats", type=int, default=2, help="(d): runs per contender and signal")
    parser.add_argument("--no-record", action="store_true", help="print only; do not append to BENCHMARKS.md")
    parser.add_argument("--only", choices=["failing-worker"], help="run one part alone (recorded as a partial run)")
    args = parser.parse_args()
    header, record = environment(WATCHED), not args.no_record
    if args.only == "failing-worker":
        with tempfile.TemporaryDirectory(prefix="dlx-bench-loader-") as tmp:
            counting = counting_dataset(Path(tmp) / "counting")
            results = {c: failing_or_missing(c, counting) for c in CONTENDERS}
        return report({"(e) Failures, the failing worker only (partial run)": failing_table(results)}, header, record)
    with tempfile.TemporaryDirectory(prefix="dlx-bench-loader-") as tmp:
        folder, counting = random_dataset(Path(tmp) / "random"), counting_dataset(Path(tmp) / "counting")
        ends = shutdown(counting, args.signal_repeats)
        faults = failures_and_resume(counting)
        speeds, step_ms = gil_tax(folder, args.turns, args.busy_rounds)
        cpu_us = {c: contest.trainer_cpu_us(c, folder) for c in CONTENDERS}
        flow, first = throughput(folder, args.rounds, args.train_steps), startup(folder, args.rounds)
        vocab = prepare_demo_dataset(Path(tmp) / "stdlib")
        waits = demo_wait(Path(tmp) / "stdlib", vocab, args.demo_rounds, args.demo_steps)
        hash_mb_s = hash_rate_mb_s(folder)
        demo_mb = sum(p.stat().st_size for p in (Path(tmp) / "stdlib").glob("*.bin")) / 1e6
    tables = {
        f"(a) GIL tax: MLP training step ({statistics.median(step_ms):.1f} ms median) fed each way, turns of 5 steps; "
        "bar ≥ 0.97": gil_table(speeds, cpu_us),
        f"(b) Throughput alone vs demo model training (seq {SEQ}, micro-batch {BATCH}, fp32 AdamW), {args.rounds} "
        "interleaved rounds; bar ≥ 50×": throughput_table(flow, first),
        f"(c) Data wait in the demo recipe ({args.demo_steps} steps, 1 worker, {args.demo_rounds} interleaved runs "
        "each); bar ≤ 1 %": wait_table(waits, hash_mb_s, demo_mb),
        f"(d) Shutdown of a trainer signalled mid-run (2 workers, prefetch 2, {args.signal_repeats} runs each); bar: "
        "the step finishes, workers gone within 5 s, no /dev/shm entry": shutdown_table(ends),
        "(e) Failures and exact resume": failures_table(faults),
    }
    report(tables, header, record)


def report(tables: dict[str, list[str]], header: list[str], record: bool) -> None:
    """Print the tables under a dated heading and the environment; append them to BENCHMARKS.md if `record`."""
    lines = [f"### {datetime.datetime.now().astimezone():%Y-%m-%d %H:%M %Z}", "", *header]
    for title, rows in tables.items():
        lines += ["", f"{title}:", "", *rows]
    print("\n".join(lines))
    if record:
        record_section(SECTION, INTRO, lines)


if __name__ == "__main__":
    main()
