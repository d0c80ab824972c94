"""model.init_from is resolved once per process: a run started from a sharded Hugging Face folder opens its
config.json and its index once, and reads each shard's safetensors header once (the tensor data is read as the
shards are filled, not counted here)."""

from __future__ import annotations

import collections
import sys
from pathlib import Path

import pytest

import dlx.model.io as model_io
from dlx.train.launch import launch
from hf_helpers import write_hf_llama
from train_helpers import make_dataset

pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("in_process_training")

OPENS: collections.Counter[str] = collections.Counter()
WATCHED: list[Path] = []
"""The folder whose opens the audit hook counts (empty: none; an audit hook cannot be removed)."""


def count_opens(event: str, args: tuple) -> None:
    if event == "open" and WATCHED and isinstance(args[0], (str, Path)) and str(args[0]).startswith(str(WATCHED[0])):
        OPENS[Path(args[0]).name] += 1


sys.addaudithook(count_opens)


def test_the_source_folder_is_read_once(tmp_path, monkeypatch):
    data = make_dataset(tmp_path / "data")
    hf = tmp_path / "hf"
    write_hf_llama(hf, 300, tokenizer=data / "tokenizer.json", shard_size="100KB")
    headers: collections.Counter[str] = collections.Counter()
    real_safe_open = model_io.safe_open

    def safe_open(path, *args, **kwargs):
        headers[Path(path).name] += 1
        return real_safe_open(path, *args, **kwargs)

    monkeypatch.setattr(model_io, "safe_open", safe_open)
    recipe = ["--data.seq_len", "16", "--data.micro_batch_size", "2", "--train.precision", "fp32"]
    recipe += ["--log.progress", "false", "--train.max_steps", "1", "--data.num_workers", "0"]
    OPENS.clear()
    WATCHED[:] = [hf]
    try:
        assert launch(None, [*recipe, "--model.init_from", str(hf), "--data.path", str(data)], tmp_path / "r", 0) == 0
    finally:
        WATCHED.clear()
    shards = sorted(p.name for p in hf.glob("*.safetensors"))
    assert len(shards) > 1
    assert (OPENS["config.json"], OPENS["model.safetensors.index.json"]) == (1, 1)
    assert headers == dict.fromkeys(shards, 1)
