"""data.stages on 2 gloo ranks under torchrun (DDP, fp32, SGD): the staged run trains like one process with the same
global batch across a data switch, a seq_len change and a RoPE change; checkpoints taken at a boundary and inside a
stage resume on the other world size and go on as the uninterrupted run. (Which windows each world size draws is
tests/unit/test_staged_loader.py's, exactly; here the losses agree within the float noise of a 2-rank all-reduce.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_parallel import LOSS_TOLERANCE, torchrun

from dlx.train.launch import launch
from stage_helpers import cut_at, two_sources
from train_helpers import losses, train_quietly

pytestmark = [pytest.mark.distributed, pytest.mark.usefixtures("in_process_training")]


def recipe(sources: dict[str, Path]) -> list[str]:
    stages = [
        {"until": 2},
        {"until": 4, "mix": {str(sources["code"]): 0.3, str(sources["prose"]): 0.7}, "seq_len": 64},
        {"seq_len": 16, "rope_theta": 2e4},
    ]
    argv = ["--model.preset", "debug", "--data.seq_len", "32", "--data.micro_batch_size", "2"]
    argv += ["--train.global_batch_size", "8", "--train.optimizer", "sgd", "--train.lr", "0.5"]
    argv += ["--train.warmup_ratio", "0", "--train.max_steps", "6", "--train.precision", "fp32", "--eval.every", "0"]
    argv += ["--checkpoint.every", "1", "--checkpoint.keep_last", "10", "--log.every", "1", "--log.progress", "false"]
    argv += ["--data.num_workers", "1", "--data.mix", f"{sources['code']}=1", "--data.stages", json.dumps(stages)]
    return argv


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """The one-process run and the 2-rank DDP run of the same recipe."""
    root = tmp_path_factory.mktemp("stages")
    sources = two_sources(root / "data")
    one = train_quietly(recipe(sources), root / "one" / "run")
    two = root / "two" / "run"
    result, _ = torchrun(["pretrain", *recipe(sources), "--parallel.strategy", "ddp", "--run-dir", str(two)], root)
    assert result.returncode == 0, result.stderr[-6000:]
    return {"one": one, "two": two, "sources": sources}


def close(got: dict[int, float], expected: dict[int, float]) -> bool:
    return sorted(got) == sorted(expected) and max(abs(got[s] - expected[s]) for s in expected) <= LOSS_TOLERANCE


def test_two_ranks_train_the_stages_like_one_process(runs):
    assert close(losses(runs["two"]), losses(runs["one"]))
    records = [json.loads(line) for line in (runs["two"] / "metrics.jsonl").read_text().splitlines()]
    assert [r["stage"] for r in records] == [0, 0, 1, 1, 2, 2]


@pytest.mark.parametrize("step", [2, 3])
def test_saved_on_two_ranks_resumed_in_one_process(runs, tmp_path, step):
    """At the boundary after stage 0, and inside stage 1."""
    resumed = cut_at(runs["two"], step, tmp_path / "run")
    assert launch(None, ["--parallel.strategy", "none"], resumed, resume=True) == 0
    assert close(losses(resumed), losses(runs["one"]))


def test_saved_in_one_process_resumed_on_two_ranks(runs, tmp_path):
    """Inside the last stage, after its RoPE change."""
    resumed = cut_at(runs["one"], 5, tmp_path / "run")
    result, _ = torchrun(["pretrain", "--resume", "--run-dir", str(resumed), "--parallel.strategy", "ddp"], tmp_path)
    assert result.returncode == 0, result.stderr[-6000:]
    assert close(losses(resumed), losses(runs["one"]))


def test_context_parallel_takes_the_length_stages(runs, tmp_path):
    """parallel.cp 2 on 2 ranks: each holds half of every sequence at 32, 64 and 16 tokens; the losses are one
    process's."""
    attention = ["--train.attention", "default"]
    one = train_quietly([*recipe(runs["sources"]), *attention], tmp_path / "one")
    split = tmp_path / "cp"
    argv = ["pretrain", *recipe(runs["sources"]), *attention, "--parallel.strategy", "ddp", "--parallel.cp", "2"]
    result, _ = torchrun([*argv, "--run-dir", str(split)], tmp_path)
    assert result.returncode == 0, result.stderr[-6000:]
    assert close(losses(split), losses(one))
