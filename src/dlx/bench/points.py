"""The sweep's grid: command-line lists (`512,1024,2048`) parsed and validated, expanded into measurement points."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch

from dlx.data import SYNTHETIC
from dlx.errors import UserError

BENCH_PRECISIONS = ("bf16", "fp16", "fp32")


@dataclass(frozen=True)
class BenchPoint:
    """One configuration of the sweep; its fields are the key that a re-run uses to skip measured points."""

    seq_len: int
    """Tokens per sequence (LLaMA-Factory's cutoff_len)."""
    micro_batch: int
    """Sequences per forward/backward pass."""
    grad_accum: int
    """Micro-batches per optimizer step; one `it` of it/s is one optimizer step."""
    precision: str
    """bf16, fp16 (autocast, fp32 weights) or fp32."""

    @property
    def tokens_per_step(self) -> int:
        return self.seq_len * self.micro_batch * self.grad_accum

    def label(self) -> str:
        return f"seq {self.seq_len}, micro-batch {self.micro_batch}, accum {self.grad_accum}, {self.precision}"


@dataclass(frozen=True)
class BenchSetup:
    """What stays fixed across a sweep."""

    model: str
    """A preset name or a YAML/JSON file of ModelArgs."""
    device: torch.device
    data: str = SYNTHETIC
    """`synthetic`, or a dataset folder written by `dlx prepare`."""
    compile: bool = False
    """torch.compile each block, as `train.compile` does."""
    steps: int = 5
    """Timed optimizer steps per point."""
    warmup: int = 2
    """Untimed optimizer steps before them."""
    strategy: str = "none"
    """parallel.strategy of every point (under torchrun): none (one process, or pure tensor parallelism), ddp, fsdp,
    hsdp."""
    tp: int = 1
    """parallel.tp of every point: tensor-parallel ranks per model replica."""
    world_size: int = 1
    """Ranks torchrun started (1 without torchrun)."""
    document_mask: bool = False
    """data.document_mask of every point: attention stays inside each document of the data (eos_id boundaries)."""
    cp: int = 1
    """parallel.cp of every point: context-parallel ranks per model replica."""
    cp_path: bool = False
    """parallel.cp_path: the context-parallel code path also at cp 1."""
    dp_replicate: int = 1
    """parallel.dp_replicate (strategy hsdp): replicas, each sharded over the others."""


def parse_positive_ints(option: str, text: str) -> list[int]:
    """`"512,1024"` -> [512, 1024]; anything but positive integers is a UserError naming the option and the value."""
    values = []
    for item in text.split(","):
        item = item.strip()
        value = int(item) if item.isascii() and item.isdigit() else 0  # no signs, no '1e3', no '²'
        if value <= 0:
            raise UserError(f"{option}: '{item}' is not a positive integer (give a comma-separated list, e.g. 1,4,8)")
        values.append(value)
    return sorted(set(values))


def parse_precisions(text: str, auto_means: str) -> list[str]:
    """`"bf16,fp32"` -> ["bf16", "fp32"]; `auto` is what `dlx pretrain` would pick on this device (`auto_means`)."""
    names = []
    for item in text.split(","):
        name = auto_means if item.strip() == "auto" else item.strip()
        if name not in BENCH_PRECISIONS:
            raise UserError(
                f"--precision: unknown precision '{item.strip()}'; choose from auto, {', '.join(BENCH_PRECISIONS)}"
            )
        if name not in names:
            names.append(name)
    return names


def expand_points(
    seq_lens: list[int], micro_batches: list[int], grad_accums: list[int], precisions: list[str]
) -> list[BenchPoint]:
    """Every combination, in measuring order: precision, seq len, grad accum, then micro-batch growing (so that an
    out-of-memory micro-batch lets the larger ones at the same seq len be marked without trying them)."""
    grid = itertools.product(precisions, seq_lens, grad_accums, micro_batches)
    return [BenchPoint(seq, batch, accum, precision) for precision, seq, accum, batch in grid]
