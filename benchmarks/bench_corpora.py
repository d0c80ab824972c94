"""Corpora benchmarks: what document masking costs in training, and what mixture sampling costs in the loader.

(a) Document masking: the `demo` model (vocab 8192, fp32, fused AdamW) trained as `dlx pretrain` trains it (the
    recipe's builders, the loop's `accumulate_gradients` with the run's Objective) on windows of a prepared corpus,
    with data.document_mask true and false. Both start from the same weights and read the same windows; they take turns
    step block by step block (interleaved rounds, the order alternating) so that noise from other processes hits both
    alike. Reported per round: tokens/s masked ÷ unmasked. At seq 256 (micro-batch 8) and seq 1024 (micro-batch 2),
    2,048 tokens per step each. On a CPU the masked path is SDPA with a boolean (B, 1, T, T) mask and positions
    gathered per document (or, for a batch without a boundary, the unmasked path); unmasked, SDPA's is_causal.
    CUDA's flex_attention path is not measured here.
(b) Mixture sampling: tokens/s the loader delivers with nothing else running, `MixtureLoader` over two datasets
    (weights 0.7 / 0.3) against `TokenLoader` over one, seq 256, micro-batch 8, on synthetic shards of 8M tokens
    each; in-process (num_workers 0: the whole cost of choosing windows and building batches) and with one worker
    process (what training uses); interleaved rounds; the target is ≥ 0.9×.

Run:  .venv/bin/python benchmarks/bench_corpora.py [--data data/stdlib-8k --data data/stdlib-prose]
      (appends to BENCHMARKS.md; --no-record to only print; without --data, data/stdlib-8k, prepared from the stdlib
      corpus when missing; data/stdlib-prose, with short documents, is made as README's mixture example says)
"""

from __future__ import annotations

import datetime
import itertools
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from dlx.data.loader import TokenLoader
from dlx.data.mixture import MixtureLoader
from dlx.data.mixture.sources import mix_sources
from dlx.data.shards import Manifest, ShardInfo, read_manifest, sha256_file, write_manifest
from dlx.data.source import LoaderSettings
from dlx.metrics.timing import PhaseTimer
from dlx.parallel.distributed import DistEnv
from dlx.precision import build_precision
from dlx.train.build.data import build_train_loader
from dlx.train.build.model import build_model, build_run_strategy
from dlx.train.build.objective import build_objective
from dlx.train.build.step_plan import plan_steps
from dlx.train.config import build_config
from dlx.train.loop.trainer import accumulate_gradients
from peers.contenders import batches_per_second, round_parser, spread
from peers.record import environment, publish

TOKENS_PER_STEP = 2048
SHAPES = ((256, 8), (1024, 2))
"""(seq_len, micro-batch) of the masking comparison."""
LOADER_SEQ, LOADER_BATCH = 256, 8


class MaskedOrNot:
    """One side of the masking comparison: a model, its optimizer and a loader as `dlx pretrain` builds them."""

    def __init__(self, data: Path, vocab_size: int, seq_len: int, micro_batch: int, mask: bool):
        self.name = "masked" if mask else "unmasked"
        model = {"preset": "demo", "vocab_size": vocab_size, "max_seq_len": max(256, seq_len)}
        data_section = {"path": str(data), "seq_len": seq_len, "micro_batch_size": micro_batch, "document_mask": mask}
        train = {"max_steps": 10**6, "precision": "fp32", "device": "cpu"}
        self.config = build_config({"model": model, "data": data_section, "train": train, "log": {"progress": False}})
        self.device = torch.device("cpu")
        self.precision = build_precision("fp32", self.device)
        self.loader = build_train_loader(self.config, self.device)
        plan = plan_steps(self.config, self.loader.batches_per_epoch, self.loader.windows_per_epoch, 1)
        model_ = build_model(self.config, self.device)  # from train.seed: both sides start from the same weights
        self.strategy = build_run_strategy(model_, self.config, self.device, DistEnv(), self.precision, plan)
        self.objective = build_objective(0.0, mask, self.loader.eos_id)
        self.timer = PhaseTimer(self.device)

    def run(self, steps: int) -> float:
        """Seconds for `steps` optimizer steps (data, forward, backward, the loop's one wait, the update)."""
        start = time.perf_counter()
        for _ in range(steps):
            loss = accumulate_gradients(
                self.strategy.train_model, self.loader, 1, self.precision, self.timer, self.strategy, self.objective
            )
            loss.item()
            self.strategy.optimizer_step()
            self.timer.end_step()
            self.timer.window()  # the step's timings read (and dropped): nothing piles up
        return time.perf_counter() - start

    def close(self) -> None:
        self.loader.close()


def document_counts(data: Path, seq_len: int, micro_batch: int, eos_id: int) -> tuple[float, float]:
    """Over the first 100 training batches of `data`: the mean number of documents a window touches (1 + the
    end-of-document tokens inside it), and the share of batches with a boundary in some row (the others take the
    unmasked path)."""
    with TokenLoader(data, LoaderSettings(seq_len=seq_len, micro_batch_size=micro_batch, num_workers=0)) as it:
        batches = [x for x, _ in itertools.islice(it, 100)]
    boundaries = [(x[:, :-1] == eos_id).sum(dim=1) for x in batches]  # (B,) per batch
    per_window = 1.0 + torch.cat(boundaries).double().mean().item()
    return per_window, sum(bool(b.any()) for b in boundaries) / len(boundaries)


def masking(data: Path, rounds: int, steps: int, warmup: int) -> list[tuple]:
    """Per shape: (data, seq_len, micro-batch, documents per window, share of batches with a boundary, masked tokens/s
    per round, unmasked per round)."""
    manifest = read_manifest(data)
    results = []
    for seq_len, micro_batch in SHAPES:
        sides = [MaskedOrNot(data, manifest.vocab_size, seq_len, micro_batch, mask) for mask in (True, False)]
        try:
            for side in sides:
                side.run(warmup)
            speeds: dict[str, list[float]] = {side.name: [] for side in sides}
            for index in range(rounds):
                for side in sides if index % 2 == 0 else sides[::-1]:
                    speeds[side.name].append(steps * TOKENS_PER_STEP / side.run(steps))
                print(f"seq {seq_len} round {index + 1}/{rounds}: {_last(speeds)}", file=sys.stderr)
        finally:
            for side in sides:
                side.close()
        docs, with_boundary = document_counts(data, seq_len, micro_batch, manifest.eos_id)
        results.append((data, seq_len, micro_batch, docs, with_boundary, speeds["masked"], speeds["unmasked"]))
    return results


def write_synthetic_dataset(folder: Path, n_tokens: int, offset: int) -> Path:
    """One train shard of pseudo-random tokens (vocab 8192, documents of about 700 tokens), a tiny val split."""
    folder.mkdir(parents=True)
    rng = np.random.default_rng(offset)
    tokens = rng.integers(1, 8192, n_tokens, dtype=np.uint16)
    tokens[rng.integers(0, n_tokens, n_tokens // 700)] = 0  # eos_id 0
    shards = []
    for split, part in (("train", tokens), ("val", tokens[:4096])):
        path = folder / f"{split}-00000.bin"
        part.astype("<u2").tofile(path)
        shards.append(ShardInfo(name=path.name, split=split, tokens=len(part), documents=1, sha256=sha256_file(path)))
    (folder / "tokenizer.json").write_text(json.dumps({"model": {"type": "BPE", "vocab": {}, "merges": []}}))
    tokenizer_sha = sha256_file(folder / "tokenizer.json")
    manifest = Manifest(
        dtype="uint16", vocab_size=8192, eos_id=0, tokenizer_sha256=tokenizer_sha, shards=shards, complete=True
    )
    write_manifest(folder, manifest)
    return folder


def loader_tokens_per_second(make: Callable, seconds: float) -> float:
    with make() as it:
        return batches_per_second(it, seconds, chunk=50) * LOADER_BATCH * LOADER_SEQ


def mixture_sampling(rounds: int, seconds: float) -> dict[str, list[float]]:
    """tokens/s per round for each of: single / mixture × 0 / 1 worker."""
    options = {"seq_len": LOADER_SEQ, "micro_batch_size": LOADER_BATCH, "prefetch": 8}
    results: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="dlx-bench-corpora-") as tmp:
        first = write_synthetic_dataset(Path(tmp) / "web", 8_000_000, offset=1)
        second = write_synthetic_dataset(Path(tmp) / "code", 8_000_000, offset=2)
        sources = mix_sources({str(first): 0.7, str(second): 0.3})
        makers = {}
        for workers in (0, 1):
            settings = LoaderSettings(num_workers=workers, **options)
            makers[f"one dataset, {workers} worker(s)"] = lambda s=settings: TokenLoader(first, s)
            makers[f"data.mix of two, {workers} worker(s)"] = lambda s=settings: MixtureLoader(sources, s)
        for index in range(rounds):
            names = list(makers) if index % 2 == 0 else list(makers)[::-1]
            for name in names:
                results.setdefault(name, []).append(loader_tokens_per_second(makers[name], seconds))
            print(f"loader round {index + 1}/{rounds}: {_last(results)}", file=sys.stderr)
    return {name: results[name] for name in makers}


def _last(results: dict[str, list[float]]) -> str:
    return ", ".join(f"{name} {values[-1]:,.0f}" for name, values in results.items())


def masking_table(results) -> list[str]:
    rows = [
        "| data | seq len × micro-batch | documents per window | batches with a boundary | masked tokens/s | "
        "unmasked tokens/s | masked ÷ unmasked, per round: median (min, max) |",
        "|---|---|---:|---:|---:|---:|---|",
    ]
    for data, seq_len, micro_batch, docs, with_boundary, masked, unmasked in results:
        ratios = [m / u for m, u in zip(masked, unmasked, strict=True)]
        rows.append(
            f"| {data.name} | {seq_len} × {micro_batch} | {docs:.2f} | {with_boundary:.0%} | "
            f"{statistics.median(masked):,.0f} | {statistics.median(unmasked):,.0f} | {spread(ratios)} |"
        )
    return rows


def loader_table(results: dict[str, list[float]]) -> list[str]:
    rows = ["| loader | tokens/s (median) | ÷ one dataset with as many workers, per round |", "|---|---:|---|"]
    for name, values in results.items():
        workers = name.split(", ")[1]
        reference = results[f"one dataset, {workers}"]
        ratios = [v / r for v, r in zip(values, reference, strict=True)]
        rows.append(f"| {name} | {statistics.median(values):,.0f} | {spread(ratios)} |")
    return rows


def ensure_data(folder: Path) -> Path:
    if not (folder / "manifest.json").is_file():
        from dlx.train.demo import prepare_demo_data

        prepare_demo_data(folder)
    return folder


def main() -> None:
    parser = round_parser(__doc__.splitlines()[0], rounds=12, steps=1, warmup=2)
    parser.add_argument(
        "--data", type=Path, action="append", help="a prepared dataset (repeat for more; default data/stdlib-8k)"
    )
    parser.add_argument("--loader-rounds", type=int, default=5, help="interleaved rounds of the loader comparison")
    args = parser.parse_args()
    header = environment(["src/dlx/data", "src/dlx/model", "src/dlx/train", "benchmarks"])
    datasets = args.data or [ensure_data(Path("data/stdlib-8k"))]
    masked = [row for data in datasets for row in masking(data, args.rounds, args.steps, args.warmup)]
    loaders = mixture_sampling(args.loader_rounds, 2.0)
    lines = [
        f"### {datetime.datetime.now().astimezone():%Y-%m-%d %H:%M %Z}",
        "",
        *header,
        "- other agents' processes share this machine (see the load average): only ratios measured in the same "
        "round mean much",
        "",
        f"(a) Document masking: demo model (fp32, fused AdamW) on {', '.join(map(str, datasets))}, "
        f"{TOKENS_PER_STEP:,} tokens per step, {args.rounds} interleaved rounds of {args.steps} step(s) after "
        f"{args.warmup} warm-up steps each:",
        "",
        *masking_table(masked),
        "",
        f"(b) Mixture sampling: loader alone, seq {LOADER_SEQ}, micro-batch {LOADER_BATCH}, synthetic shards of 8M "
        f"tokens per dataset, weights 0.7 / 0.3, {args.loader_rounds} interleaved rounds of 2 s each:",
        "",
        *loader_table(loaders),
    ]
    publish(
        "Corpora", "Measured by `benchmarks/bench_corpora.py`; see its docstring.", lines, record=not args.no_record
    )


if __name__ == "__main__":
    main()
