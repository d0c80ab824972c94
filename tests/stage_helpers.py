"""Shared by the data.stages tests: two prepared datasets with one tokenizer and different contents; two of counting
tokens, whose rows name their source and window; a staged loader's steps; a run cut back to one of its checkpoints."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import torch

from dataset_helpers import write_dataset
from dlx.data.shards import read_manifest
from dlx.data.stages import StagedLoader
from dlx.train.config import RunConfig, build_config
from train_helpers import make_dataset

OFFSETS = {"big": 0, "small": 100_000}
TOKENIZER = json.dumps({"model": {"type": "BPE", "vocab": {"a": 0, "b": 1}, "merges": []}, "added_tokens": []})


def two_sources(root: Path) -> dict[str, Path]:
    """`code`: stdlib code tokenized by its own BPE (`make_dataset`); `prose`: the same tokens in reverse order,
    prepared with that tokenizer."""
    code = make_dataset(root / "code")
    manifest = read_manifest(code)
    splits = {}
    for split in ("train", "val"):
        (shard,) = manifest.split_shards(split)
        splits[split] = [np.fromfile(code / shard.name, dtype=manifest.dtype)[::-1].copy()]
    tokenizer = (code / "tokenizer.json").read_text()
    prose = write_dataset(root / "prose", splits, manifest.vocab_size, manifest.eos_id, tokenizer=tokenizer)
    return {"code": code, "prose": prose}


def cut_at(run_dir: Path, step: int, copy: Path) -> Path:
    """A copy of a run as if it had stopped after its step-`step` checkpoint."""
    shutil.copytree(run_dir, copy)
    for checkpoint in (copy / "checkpoints").iterdir():
        if int(checkpoint.name.removeprefix("step-")) > step:
            shutil.rmtree(checkpoint)
    return copy


def counting_sources(root: Path) -> dict[str, Path]:
    """`big`: 801 tokens (100 windows of 8); `small`: 321 tokens (40 windows of 8); each counts from its offset."""
    out = {}
    for name, n_tokens in (("big", 801), ("small", 321)):
        offset = OFFSETS[name]
        splits = {"train": [np.arange(offset, offset + n_tokens)], "val": [np.arange(offset + 50_000, offset + 50_100)]}
        out[name] = write_dataset(root / name, splits, vocab_size=1 << 20, tokenizer=TOKENIZER)
    return out


def loader_recipe(folders: dict, stages: list[dict], steps: int, micro: int = 2, workers: int = 0) -> RunConfig:
    """data.mix of both counting sources at seq_len 8, global batch 8, with `stages` (mixes by source name)."""
    mix = {str(folders["big"]): 1.0, str(folders["small"]): 1.0}
    stages = [dict(stage) for stage in stages]
    for stage in stages:
        if "mix" in stage:
            stage["mix"] = {str(folders[name]): weight for name, weight in stage["mix"].items()}
    data = {"mix": mix, "seq_len": 8, "micro_batch_size": micro, "num_workers": workers, "stages": stages}
    raw = {"model": {"preset": "debug", "vocab_size": 1 << 20}, "data": data}
    return build_config({**raw, "train": {"max_steps": steps, "global_batch_size": 8, "seed": 11}})


def row_ids(inputs: torch.Tensor) -> list[tuple[str, int]]:
    """(source, window) of each row: its first token over the source's offset, in windows of the row's length."""
    ids = []
    for first in inputs[:, 0].tolist():
        name = "small" if first >= OFFSETS["small"] else "big"
        ids.append((name, (first - OFFSETS[name]) // inputs.shape[1]))
    return ids


def read_steps(loaders: list[StagedLoader], steps: int) -> list[list]:
    """The rows each of `steps` optimizer steps reads over the ranks' loaders, in the order they read them."""
    out = []
    for _ in range(steps):
        accum = loaders[0].spans[loaders[0].stage].grad_accum  # every rank is in the same stage
        out.append([row for loader in loaders for _ in range(accum) for row in row_ids(next(loader)[0])])
    return out
