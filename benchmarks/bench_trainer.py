"""Trainer overhead (issue 5): `dlx pretrain`'s step loop against a bare PyTorch loop, and against HF Trainer.

Same model (the `demo` preset: dim 256, 4 layers, 4 heads, 2 kv heads, FFN 688, vocab 8192), same batch (seq 256,
micro-batch 8), fp32, synthetic tokens, fused AdamW everywhere:

  bare        forward, cross-entropy, backward, AdamW step, zero_grad; batches built in advance (the ceiling)
  dlx         `train_loop` of a real run (synthetic SyntheticLoader, PhaseTimer phases, ThroughputMeter record and
              metrics.jsonl line every 10 steps, grad-norm clipping, cosine schedule, NaN check), console to a buffer
  HF Trainer  transformers' Trainer on LlamaForCausalLM of the same shape (optim adamw_torch_fused, no logging, no
              saving); timed between its on_step_end callbacks, so its start-up is not counted

Contenders take turns round by round (the order rotates), so that noise from other processes on the machine hits all
alike; each round's ratio is taken against bare in the same round. The table shows the median and the spread.
Also measured: what the PhaseTimer itself costs per step (the "< 1 % of a step" requirement).

Run:  .venv/bin/python benchmarks/bench_trainer.py          (appends to BENCHMARKS.md; --no-record to only print)
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import io
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from dlx.metrics.timing import PhaseTimer
from dlx.model.llama import Transformer
from dlx.train.data import SyntheticLoader
from dlx.train.recipe import load_recipe
from dlx.train.run import build_run
from dlx.train.signals import GracefulStop
from dlx.train.trainer import train_loop

VOCAB, SEQ, BATCH, LR = 8192, 256, 8, 3e-4
TOKENS_PER_STEP = SEQ * BATCH
RECIPE = [
    "--model.preset", "demo", "--model.vocab_size", str(VOCAB), "--data.path", "synthetic",
    "--data.seq_len", str(SEQ), "--data.micro_batch_size", str(BATCH), "--train.precision", "fp32",
    "--train.lr", str(LR), "--train.max_steps", "1000000", "--log.every", "10", "--log.progress", "false",
]  # fmt: skip


class Bare:
    """The ceiling: nothing but the work."""

    name = "bare PyTorch loop"

    def __init__(self) -> None:
        torch.manual_seed(0)
        self.model = Transformer(load_recipe(None, RECIPE).model.args)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=LR, fused=True)
        loader = SyntheticLoader(VOCAB, SEQ, BATCH)
        self.batches = [next(loader) for _ in range(4)]

    def run(self, steps: int) -> float:
        start = time.perf_counter()
        for i in range(steps):
            inputs, targets = self.batches[i % len(self.batches)]
            logits = self.model(inputs)
            loss = F.cross_entropy(logits.view(-1, VOCAB), targets.reshape(-1))
            loss.backward()
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
        return time.perf_counter() - start


class Dlx:
    """A real run's step loop, advanced `steps` at a time."""

    name = "dlx pretrain"

    def __init__(self, run_dir: Path) -> None:
        self.session = build_run(load_recipe(None, RECIPE), "bench", run_dir, resume=False, stop=GracefulStop())
        self.session.console.console.file = io.StringIO()  # the log lines are still formatted and written, not shown

    def run(self, steps: int) -> float:
        session = self.session
        session.plan = dataclasses.replace(session.plan, total_steps=session.state.step + steps)
        start = time.perf_counter()
        train_loop(session)
        return time.perf_counter() - start

    def close(self) -> None:
        self.session.close()


class HFTrainer:
    """transformers.Trainer, timed between step ends (its set-up per train() call is left out)."""

    name = "HF Trainer"

    def __init__(self, out_dir: Path) -> None:
        from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainerCallback, TrainingArguments

        from dlx.model.hf import hf_config

        torch.manual_seed(0)
        config = hf_config(load_recipe(None, RECIPE).model.args, torch.float32)
        config.pop("torch_dtype", None)
        model = LlamaForCausalLM(LlamaConfig(**config))
        loader = SyntheticLoader(VOCAB, SEQ, BATCH)
        rows = [row for inputs, _ in (next(loader) for _ in range(4)) for row in inputs]
        dataset = [{"input_ids": row, "labels": row} for row in rows] * 1000
        self.stamps: list[float] = []
        stamps = self.stamps

        class Stamp(TrainerCallback):
            def on_step_end(self, args, state, control, **kwargs):
                stamps.append(time.perf_counter())

        self.make_trainer = lambda steps: Trainer(
            model=model, train_dataset=dataset, callbacks=[Stamp()], args=TrainingArguments(
                output_dir=str(out_dir), per_device_train_batch_size=BATCH, max_steps=steps, learning_rate=LR,
                lr_scheduler_type="cosine", optim="adamw_torch_fused", logging_strategy="no", save_strategy="no",
                report_to=[], disable_tqdm=True, use_cpu=True, dataloader_num_workers=0, seed=0,
            ),
        )  # fmt: skip

    def run(self, steps: int) -> float:
        """A fresh Trainer per round (the model carries on): a Trainer is not meant to be re-targeted."""
        trainer = self.make_trainer(steps + 1)
        self.stamps.clear()
        trainer.train()
        return self.stamps[-1] - self.stamps[0]  # steps 2 .. steps + 1


def rounds(contenders: list, n_rounds: int, steps: int, warmup: int) -> dict[str, list[float]]:
    """tokens/s per contender per round; the order rotates every round."""
    for contender in contenders:
        contender.run(warmup)
    results: dict[str, list[float]] = {c.name: [] for c in contenders}
    for index in range(n_rounds):
        order = contenders[index % len(contenders) :] + contenders[: index % len(contenders)]
        for contender in order:
            seconds = contender.run(steps)
            results[contender.name].append(steps * TOKENS_PER_STEP / seconds)
        print(f"round {index + 1}/{n_rounds}: " + ", ".join(f"{k} {v[-1]:,.0f}" for k, v in results.items()),
              file=sys.stderr)  # fmt: skip
    return results


def timer_cost_per_step(repeats: int = 20_000) -> float:
    """Seconds the PhaseTimer adds to one step: 4 phases entered (one micro-step) and end_step, on the CPU."""
    timer = PhaseTimer(torch.device("cpu"))
    start = time.perf_counter()
    for _ in range(repeats):
        for name in ("data_wait", "forward", "backward", "optimizer"):
            with timer.phase(name):
                pass
        timer.end_step()
    return (time.perf_counter() - start) / repeats


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.3f} (min {min(values):.3f}, max {max(values):.3f})"


def table(results: dict[str, list[float]]) -> list[str]:
    bare = results[Bare.name]
    rows = ["| loop | tokens/s (median) | ms / step | × bare, per round: median (min, max) |", "|---|---|---|---|"]
    for name, values in results.items():
        ratios = [v / b for v, b in zip(values, bare, strict=True)]
        median = statistics.median(values)
        rows.append(f"| {name} | {median:,.0f} | {1e3 * TOKENS_PER_STEP / median:.0f} | {spread(ratios)} |")
    if "HF Trainer" in results:
        ratios = [d / h for d, h in zip(results[Dlx.name], results["HF Trainer"], strict=True)]
        rows.append(f"| dlx ÷ HF Trainer | | | {spread(ratios)} |")
    return rows


def environment() -> list[str]:
    """The exact command, code version, library versions and hardware, for the record."""
    root = Path(__file__).resolve().parent.parent
    git = ["git", "-C", str(root)]
    sha = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run([*git, "status", "--porcelain", "--", "src/dlx/train", "src/dlx/metrics", "benchmarks"],
                           capture_output=True, text=True).stdout.strip()  # fmt: skip
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())  # fmt: skip
    versions = f"python {platform.python_version()}, torch {torch.__version__}"
    with contextlib.suppress(ImportError):
        import accelerate
        import transformers

        versions += f", transformers {transformers.__version__}, accelerate {accelerate.__version__}"
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    return [
        f"- command: `{shlex.join([Path(sys.executable).name, *sys.argv])}`",
        f"- git: {sha}{' (trainer, metrics or benchmark files modified)' if dirty else ''}; {versions}",
        f"- hardware: {cpu}, {os.cpu_count()} logical CPUs, torch threads {torch.get_num_threads()}; "
        f"load average before the run {load} (the machine is shared)",
    ]


def record_results(path: Path, lines: list[str]) -> None:
    """Append this run at the end of the "## Trainer" section (created at the end of the file if missing)."""
    text = path.read_text() if path.exists() else "# Benchmarks\n"
    entry = "\n".join(lines) + "\n"
    start = text.find("\n## Trainer\n")
    if start < 0:
        intro = "\n\n## Trainer\n\nMeasured by `benchmarks/bench_trainer.py`; see its docstring.\n\n"
        text = text.rstrip("\n") + intro + entry
    else:
        end = text.find("\n## ", start + 1)
        end = len(text) if end < 0 else end + 1
        text = text[:end].rstrip("\n") + "\n\n" + entry + ("\n" + text[end:] if end < len(text) else "")
    path.write_text(text)


def build_contenders(tmp: Path, with_hf: bool) -> list:
    contenders: list = [Bare(), Dlx(tmp / "run")]
    if with_hf:
        try:
            contenders.append(HFTrainer(tmp / "hf"))
        except ImportError as e:
            print(f"HF Trainer skipped: {e} (pip install transformers accelerate)", file=sys.stderr)
    return contenders


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6, help="interleaved rounds")
    parser.add_argument("--steps", type=int, default=6, help="timed steps per contender per round")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps per contender first")
    parser.add_argument("--no-hf", action="store_true", help="leave HF Trainer out")
    parser.add_argument("--no-record", action="store_true", help="print only; do not append to BENCHMARKS.md")
    args = parser.parse_args()
    header = environment()
    with tempfile.TemporaryDirectory(prefix="dlx-bench-trainer-") as tmp:
        contenders = build_contenders(Path(tmp), not args.no_hf)
        try:
            results = rounds(contenders, args.rounds, args.steps, args.warmup)
        finally:
            contenders[1].close()
    step_s = TOKENS_PER_STEP / statistics.median(results[Dlx.name])
    cost = timer_cost_per_step()
    lines = [f"### {datetime.datetime.now().astimezone():%Y-%m-%d %H:%M %Z}", "", *header, "",
             f"demo model (seq {SEQ}, micro-batch {BATCH}, fp32, fused AdamW), synthetic tokens, {args.rounds} "
             f"interleaved rounds of {args.steps} steps after {args.warmup} warm-up steps each:", "", *table(results),
             "", f"PhaseTimer cost: {cost * 1e6:.1f} µs per step = {100 * cost / step_s:.4f} % of a dlx step "
             f"({1e3 * step_s:.0f} ms)."]  # fmt: skip
    print("\n".join(lines))
    if not args.no_record:
        record_results(Path(__file__).resolve().parent.parent / "BENCHMARKS.md", lines)


if __name__ == "__main__":
    main()
