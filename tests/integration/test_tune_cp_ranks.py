"""`dlx tune` under torchrun measures context-parallel layouts as `dlx pretrain` trains them, and the recipe it writes
trains on the same ranks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from journey_helpers import User

ROOT = Path(__file__).resolve().parents[2]
DEBUG = str(ROOT / "recipes" / "debug.yaml")
KEEP = (
    "parallel.strategy",
    "parallel.tp",
    "parallel.activation_checkpointing",
    "data.micro_batch_size",
    "train.attention",
    "train.compile",
)


@pytest.mark.distributed
def test_tune_on_two_ranks_measures_cp_layouts_and_its_recipe_trains(tmp_path):
    user = User(tmp_path)
    small = ("--data.seq_len", "32", "--train.global_batch_size", "8", "--train.max_steps", "4")
    keep = [arg for key in KEEP for arg in ("--keep", key)]
    out = tmp_path / "tuned.yaml"
    user.torchrun(2, "tune", DEBUG, *small, *keep, "--warmup", "1", "--steps", "1", "--out", str(out), timeout=400)

    candidates = json.loads(out.with_suffix(".json").read_text())["candidates"]
    by_cp = {row["layout"]["cp"]: row for row in candidates}
    assert sorted(by_cp) == [1, 2]  # cp 1 and cp 2 only differ; the rest kept at the recipe's (auto: ddp at 2 ranks)
    assert {row["layout"]["strategy"] for row in candidates} == {"ddp"}
    for row in candidates:
        assert row["measured_step_s"] > 0 and row["drop"] in (None, "slower when measured"), row
    assert by_cp[2]["layout"]["grad_accum"] == 2 * by_cp[1]["layout"]["grad_accum"]  # one replica reads all 8
    assert by_cp[2]["estimate_gb"] != by_cp[1]["estimate_gb"]

    tuned = yaml.safe_load(out.read_text())
    winner = json.loads(out.with_suffix(".json").read_text())["winner"]["layout"]
    assert tuned["parallel"]["cp"] == winner["cp"]
    user.torchrun(2, "pretrain", str(out), "--run-dir", "tuned", "--log.progress", "false", timeout=300)
    steps = [json.loads(line) for line in (tmp_path / "tuned" / "metrics.jsonl").read_text().splitlines()]
    assert max(record.get("step", 0) for record in steps) == 4
