"""Shared by the data.stages tests: two prepared datasets with one tokenizer and different contents; a run cut back
to one of its checkpoints."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np

from dataset_helpers import write_dataset
from dlx.data.shards import read_manifest
from train_helpers import make_dataset


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
