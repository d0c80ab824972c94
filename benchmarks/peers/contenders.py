"""Three ways to train the same model on the same synthetic tokens, each advanced `steps` optimizer steps at a time and
timed, in fp32 or with bf16 autocast (fp32 weights):

  bare        forward, cross-entropy, backward, gradient clipping at 1.0, AdamW step, zero_grad; batches built in
              advance (the ceiling: the same training config as the other two, which both clip at 1.0)
  dlx         `train_loop` of a real `dlx pretrain` run (synthetic SyntheticLoader, PhaseTimer phases,
              ThroughputMeter record and metrics.jsonl line every 10 steps, grad-norm clipping, cosine schedule, NaN
              check), console to a buffer
  HF Trainer  transformers' Trainer on LlamaForCausalLM of the same shape (optim adamw_torch_fused, no logging, no
              saving, `bf16=True` for bf16); timed between its on_step_end callbacks, so its start-up is not counted

The model is the `demo` preset (dim 256, 4 layers, 4 heads, 2 kv heads, FFN 688) with vocab 8192; seq 256, micro-batch
8, fused AdamW at lr 3e-4 everywhere. `rounds` interleaves them (the order rotates) so that noise from other processes
on the machine hits all alike.
"""

from __future__ import annotations

import argparse
import dataclasses
import io
import itertools
import statistics
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import torch
import torch.nn.functional as F

from dlx.data.source import LoaderSettings
from dlx.data.synthetic import SyntheticLoader
from dlx.device import autocast
from dlx.model.llama import Transformer
from dlx.parallel.distributed import DistEnv
from dlx.train.build.signals import GracefulStop
from dlx.train.loop.trainer import train_loop
from dlx.train.recipe import load_recipe
from dlx.train.run import build_run

VOCAB, SEQ, BATCH, LR = 8192, 256, 8, 3e-4
GRAD_CLIP = 1.0
"""Gradient-norm clipping in all three loops: dlx's train.grad_clip and HF TrainingArguments.max_grad_norm defaults."""
TOKENS_PER_STEP = SEQ * BATCH
BARE, DLX, HF = "bare PyTorch loop", "dlx pretrain", "HF Trainer"


def recipe(precision: str) -> list[str]:
    """The `dlx pretrain` command-line overrides that all three contenders follow."""
    return [
        "--model.preset",
        "demo",
        "--model.vocab_size",
        str(VOCAB),
        "--data.path",
        "synthetic",
        "--data.seq_len",
        str(SEQ),
        "--data.micro_batch_size",
        str(BATCH),
        "--train.precision",
        precision,
        "--train.lr",
        str(LR),
        "--train.max_steps",
        "1000000",
        "--log.every",
        "10",
        "--log.progress",
        "false",
    ]


class Bare:
    """The ceiling: nothing but the work."""

    def __init__(self, precision: str) -> None:
        self.name, self.precision = f"{BARE} {precision}", precision
        torch.manual_seed(0)
        self.model = Transformer(load_recipe(None, recipe(precision)).model.args)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=LR, fused=True)
        loader = SyntheticLoader(VOCAB, LoaderSettings(seq_len=SEQ, micro_batch_size=BATCH))
        self.batches = [next(loader) for _ in range(4)]

    def run(self, steps: int) -> float:
        start = time.perf_counter()
        for i in range(steps):
            inputs, targets = self.batches[i % len(self.batches)]
            with autocast(torch.device("cpu"), self.precision):
                logits = self.model(inputs)
            loss = F.cross_entropy(logits.float().view(-1, VOCAB), targets.reshape(-1))
            loss.backward()
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), GRAD_CLIP)
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
        return time.perf_counter() - start

    def close(self) -> None:
        pass


class Dlx:
    """A real run's step loop, advanced `steps` at a time."""

    def __init__(
        self, precision: str, run_dir: Path, argv: list[str] | None = None, device: torch.device = torch.device("cpu")
    ) -> None:
        """`argv`: the run's `dlx pretrain` overrides (default: `recipe(precision)`)."""
        self.name, self.precision = f"{DLX} {precision}", precision
        config = load_recipe(None, recipe(precision) if argv is None else argv)
        self.session = build_run(config, "bench", run_dir, False, GracefulStop(), DistEnv(), device)
        self.session.console.console.file = io.StringIO()  # the log lines are still formatted and written, not shown

    def run(self, steps: int) -> float:
        plan = dataclasses.replace(self.session.plan, total_steps=self.session.progress.step + steps)
        session = self.session = dataclasses.replace(self.session, plan=plan)  # a Run is read-only: a new one
        start = time.perf_counter()
        train_loop(session)
        return time.perf_counter() - start

    def close(self) -> None:
        self.session.close()


class HFTrainer:
    """transformers.Trainer, timed between step ends (its set-up per train() call is left out)."""

    def __init__(self, precision: str, out_dir: Path) -> None:
        from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainerCallback, TrainingArguments

        from dlx.model.hf import hf_config

        self.name, self.precision = f"{HF} {precision}", precision
        torch.manual_seed(0)
        config = hf_config(load_recipe(None, recipe(precision)).model.args, torch.float32)
        config.pop("torch_dtype", None)
        model = LlamaForCausalLM(LlamaConfig(**config))
        loader = SyntheticLoader(VOCAB, LoaderSettings(seq_len=SEQ, micro_batch_size=BATCH))
        rows = [row for inputs, _ in (next(loader) for _ in range(4)) for row in inputs]
        dataset = [{"input_ids": row, "labels": row} for row in rows] * 1000
        self.stamps: list[float] = []
        stamps = self.stamps

        class Stamp(TrainerCallback):
            def on_step_end(self, args, state, control, **kwargs):
                stamps.append(time.perf_counter())

        self.make_trainer = lambda steps: Trainer(
            model=model,
            train_dataset=dataset,
            callbacks=[Stamp()],
            args=TrainingArguments(
                output_dir=str(out_dir),
                per_device_train_batch_size=BATCH,
                max_steps=steps,
                learning_rate=LR,
                lr_scheduler_type="cosine",
                optim="adamw_torch_fused",
                logging_strategy="no",
                save_strategy="no",
                report_to=[],
                disable_tqdm=True,
                use_cpu=True,
                dataloader_num_workers=0,
                seed=0,
                bf16=precision == "bf16",
            ),
        )

    def run(self, steps: int) -> float:
        """A fresh Trainer per round (the model carries on): a Trainer is not meant to be re-targeted."""
        trainer = self.make_trainer(steps + 1)
        self.stamps.clear()
        trainer.train()
        return self.stamps[-1] - self.stamps[0]  # steps 2 .. steps + 1

    def close(self) -> None:
        pass


def build(kind: str, precision: str, tmp: Path):
    """One contender; HF Trainer raises ImportError without transformers and accelerate."""
    if kind == BARE:
        return Bare(precision)
    if kind == DLX:
        return Dlx(precision, tmp / f"run-{precision}")
    return HFTrainer(precision, tmp / f"hf-{precision}")


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
        print(
            f"round {index + 1}/{n_rounds}: " + ", ".join(f"{k} {v[-1]:,.0f}" for k, v in results.items()),
            file=sys.stderr,
        )
    return results


def spread(values: list[float]) -> str:
    """Median and range of per-round figures."""
    return f"{statistics.median(values):.3f} (min {min(values):.3f}, max {max(values):.3f})"


def round_parser(description: str, rounds: int, steps: int, warmup: int) -> argparse.ArgumentParser:
    """The options every interleaved-rounds benchmark takes, with its own defaults."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--rounds", type=int, default=rounds, help="interleaved rounds")
    parser.add_argument("--steps", type=int, default=steps, help="timed steps per contender per round")
    parser.add_argument("--warmup", type=int, default=warmup, help="untimed steps per contender first")
    parser.add_argument("--no-hf", action="store_true", help="leave HF Trainer out")
    parser.add_argument("--no-record", action="store_true", help="print only; do not append to BENCHMARKS.md")
    return parser


def batches_per_second(batches: Iterator, seconds: float, chunk: int) -> float:
    """Batches a started loader yields per second over `seconds` (after 20 batches of warm-up: worker start, first
    pages), counted `chunk` at a time."""
    for _ in itertools.islice(batches, 20):
        pass
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        for _ in itertools.islice(batches, chunk):
            n += 1
    return n / (time.perf_counter() - start)
