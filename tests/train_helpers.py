"""Shared by the trainer tests: tiny recipes, a tiny real dataset (BPE tokenizer + shards), subprocess runs."""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

TINY = [
    "--model.preset",
    "debug",
    "--data.seq_len",
    "16",
    "--data.micro_batch_size",
    "2",
    "--train.precision",
    "fp32",
    "--train.lr",
    "3e-3",
    "--log.every",
    "1",
    "--log.progress",
    "false",
]
"""Overrides that make any run take milliseconds per step."""


def make_dataset(folder: Path, vocab_size: int = 300, val: bool = True) -> Path:
    """A real (small) prepared dataset: a BPE tokenizer trained on a few stdlib modules, their tokens as shards."""
    import email.message
    import json as json_module
    import textwrap

    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    texts = [inspect.getsource(m) for m in (json_module.decoder, json_module.encoder, textwrap, email.message)]
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tokenizer.train_from_iterator(texts, trainer)
    from tokenizers import decoders

    tokenizer.decoder = decoders.ByteLevel()
    eos = tokenizer.token_to_id("<|endoftext|>")
    docs = [np.asarray([*tokenizer.encode(t).ids, eos]) for t in texts]
    splits = {"train": docs[:-1], "val": docs[-1:] if val else []}
    from dataset_helpers import write_dataset

    return write_dataset(
        folder,
        {split: [np.concatenate(d)] for split, d in splits.items() if d},
        tokenizer.get_vocab_size(),
        eos,
        documents={split: [len(d)] for split, d in splits.items()},
        tokenizer=tokenizer.to_str(),
    )


def losses(run_dir: Path) -> dict[int, float]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return {r["step"]: r["loss"] for r in map(json.loads, lines)}


def run_cli(args: list[str], cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    """`dlx ARGS` in a child process that is always waited for, and killed if it overruns."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "COLUMNS": "200", "OMP_NUM_THREADS": "1"}  # see single_torch_thread
    proc = subprocess.Popen(
        [sys.executable, "-m", "dlx", *args],
        cwd=cwd,
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        raise AssertionError(f"dlx {' '.join(args)} ran over {timeout} s\n{out}\n{err}") from None
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def single_torch_thread():
    """For an autouse fixture: tiny models run 10× faster on one thread when other processes share the cores
    (two OpenMP threads spin-wait for each other); the previous setting is restored afterwards."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def skip_plots(request, monkeypatch) -> None:
    """For an autouse fixture: leave report.md and its PNGs out (1.5 s of matplotlib per run) unless the test is
    marked `report`; the trainer still computes the verdict."""
    if request.node.get_closest_marker("report") is None:
        from dlx.train.loop import finish

        monkeypatch.setattr(finish, "write_report", lambda *args, **kwargs: None)


def train_quietly(overrides: list[str], run_dir: Path) -> Path:
    """`dlx pretrain OVERRIDES` in this process on one torch thread without report plots, for module- and
    session-scoped fixtures (which cannot use the function-scoped `in_process_training`)."""
    import pytest
    import torch

    from dlx.train.launch import launch
    from dlx.train.loop import finish

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(finish, "write_report", lambda *args, **kwargs: None)
            assert launch(None, overrides, run_dir, resume=False) == 0
    finally:
        torch.set_num_threads(threads)
    return run_dir
