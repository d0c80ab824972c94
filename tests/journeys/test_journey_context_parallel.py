"""J4, context parallelism with the defaults: `torchrun … dlx pretrain --parallel.cp 2` and nothing else about the
layout (parallel.strategy and train.attention left at auto) trains, and the run resumes in one process (cp 1) where
it stopped; every loss within the cp tolerance of a one-process run. The schedule holds the learning rate (WSD, no
warm-up or decay), so a run resumed with a larger train.max_steps is the longer run."""

from __future__ import annotations

import json

import pytest

from journey_helpers import TRAIN, User, stdlib_documents, write_jsonl

pytestmark = [pytest.mark.journey, pytest.mark.distributed]
LOSS_TOLERANCE = 1e-5
CONSTANT_LR = ["--train.schedule", "wsd", "--train.decay_ratio", "0", "--train.warmup_ratio", "0"]


def losses(folder) -> dict[int, float]:
    lines = (folder / "metrics.jsonl").read_text().splitlines()
    return {r["step"]: r["loss"] for r in map(json.loads, lines)}


def test_cp2_with_the_defaults_trains_then_resumes_in_one_process(tmp_path):
    user = User(tmp_path / "user")
    write_jsonl(user.home / "corpus.jsonl", stdlib_documents(40))
    user.dlx("prepare", "corpus.jsonl", "--train-tokenizer", "512", "--out", "data", "--no-progress")
    run = [*TRAIN, *CONSTANT_LR, "--data.path", "data", "--checkpoint.every", "3", "--eval.every", "0"]

    user.dlx("pretrain", *run, "--train.max_steps", "9", "--run-dir", "one")
    cp2 = user.torchrun(2, "pretrain", *run, "--parallel.cp", "2", "--train.max_steps", "6", "--run-dir", "cp2")
    assert "parallel.strategy: ddp (auto: 2 ranks: 1 data-parallel × 2 context-parallel)" in cp2.stdout
    assert "train.attention auto under parallel.cp" in cp2.stdout
    resumed = user.dlx("pretrain", "--run-dir", "cp2", "--resume", "--parallel.cp", "1", "--train.max_steps", "9")
    assert "step 6" in resumed.stdout + resumed.stderr

    expected, got = losses(user.home / "one"), losses(user.home / "cp2")
    assert sorted(got) == sorted(expected) == list(range(1, 10))
    assert max(abs(got[step] - expected[step]) for step in expected) <= LOSS_TOLERANCE, (got, expected)
