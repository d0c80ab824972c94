"""model.init_from under torchrun (2 gloo ranks): every rank reads the same files, so DDP, FSDP2 and DeepSpeed ZeRO-3
start from the weights one process starts from and the first steps' losses equal one process's with the same global
batch; and the weights load shard-wise into a model FSDP2 sharded on the meta device."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from test_parallel import LOSS_TOLERANCE, RUN, STRATEGIES, TESTS, torchrun

from dlx.data.source import LoaderSettings
from dlx.data.synthetic import SyntheticLoader
from hf_helpers import next_token_loss, write_hf_llama
from train_helpers import losses, train_quietly

transformers = pytest.importorskip("transformers")
pytestmark = [pytest.mark.distributed, pytest.mark.usefixtures("in_process_training")]


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("hf") / "llama"
    write_hf_llama(folder, 512, shard_size="100KB")
    return folder


def options(hf_dir: Path) -> list[str]:
    """test_parallel's run (global batch 8: accumulation 4 in one process, 2 on each of 2 ranks) from the weights."""
    run = [arg for pair in zip(RUN[::2], RUN[1::2], strict=True) if pair[0] != "--model.preset" for arg in pair]
    return [*run, "--model.init_from", str(hf_dir), "--train.max_steps", "2", "--checkpoint.every", "0"]


@pytest.fixture(scope="module")
def reference(hf_dir, tmp_path_factory) -> Path:
    return train_quietly(options(hf_dir), tmp_path_factory.mktemp("reference") / "run")


def test_one_process_starts_at_the_weights_loss(hf_dir, reference):
    first = SyntheticLoader(512, LoaderSettings(seq_len=32, micro_batch_size=8))
    inputs, targets = next(first)  # the first global batch: sequences 0-7
    hf = transformers.LlamaForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        expected = next_token_loss(hf(inputs).logits, targets)
    assert abs(losses(reference)[1] - expected) <= LOSS_TOLERANCE


@pytest.mark.parametrize("strategy", ["ddp", "fsdp", "zero3", "tp2"])
def test_two_ranks_start_where_one_process_starts(strategy, hf_dir, reference, tmp_path):
    """tp2: tensor parallelism, each rank reading its slices of the weights into its shards."""
    run_dir = tmp_path / "run"
    layout = {**STRATEGIES, "tp2": ["--parallel.tp", "2"]}[strategy]
    result, _ = torchrun(["pretrain", *options(hf_dir), *layout, "--run-dir", str(run_dir)], tmp_path)
    assert result.returncode == 0, result.stderr[-6000:]
    expected, got = losses(reference), losses(run_dir)
    assert sorted(got) == [1, 2]
    assert max(abs(got[step] - expected[step]) for step in expected) <= LOSS_TOLERANCE, (got, expected)
    assert result.stdout.count(f"initial weights: {hf_dir}, a Hugging Face folder") == 1


def test_shard_wise_load_into_a_model_sharded_on_the_meta_device(hf_dir, tmp_path):
    report = tmp_path / "report.json"
    result, _ = torchrun([str(hf_dir), str(report)], tmp_path, script=TESTS / "init_from_shards.py")
    assert result.returncode == 0, result.stderr[-6000:]
    found = json.loads(report.read_text())
    assert found["names_match"] and found["difference"] == 0.0, found
    assert 0.4 < found["local_share"] < 0.6, found  # rank 0 allocated and read about half of every tensor
