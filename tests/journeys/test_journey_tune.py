"""J3: `dlx tune` on a recipe → `dlx pretrain` of the recipe it wrote. A raw corpus is prepared by `dlx prepare`, the
user writes a recipe (the one thing written by hand: no command makes it), `dlx tune` measures layouts of it here and
writes the winner as a recipe, and `dlx pretrain` trains that recipe on the prepared data: the run is the recipe's
run (its steps, evaluations and saves) with the winner's layout. Nothing here depends on how fast the machine is:
which layout wins and how many are measured may differ from machine to machine; that the winner is what trains, and
that tune priced the run the recipe asks for, may not."""

from __future__ import annotations

import json

import pytest
import yaml

from journey_helpers import User, stdlib_documents, write_jsonl

pytestmark = pytest.mark.journey
RECIPE = {
    "model": {"preset": "debug"},
    "data": {"path": "data", "seq_len": 32, "micro_batch_size": 4, "num_workers": 0},
    "train": {"max_steps": 6, "global_batch_size": 8, "precision": "fp32", "lr": 3e-3},
    "eval": {"every": 3, "batches": 2},
    "checkpoint": {"every": 3},
    "log": {"every": 1, "progress": False},
}


def test_tune_then_pretrain_the_recipe_it_wrote(tmp_path):
    user = User(tmp_path / "user")
    write_jsonl(user.home / "corpus" / "part-0.jsonl", stdlib_documents(40))
    user.dlx("prepare", "corpus", "--train-tokenizer", "400", "--val-documents", "2", "--out", "data", "--no-progress")
    (user.home / "small.yaml").write_text(yaml.safe_dump(RECIPE))

    tuned = user.dlx("tune", "small.yaml", "--budget-min", "3", "--keep", "train.compile", timeout=600)
    assert "winner: " in tuned.stdout and "runs/tune/small-tuned.yaml" in tuned.stdout
    summary = json.loads((user.home / "runs" / "tune" / "small-tuned.json").read_text())
    shape = summary["run_shape"]
    assert (shape["steps"], shape["evaluations"], shape["eval_batches"], shape["saves"]) == (6, 2, 2, 2)
    winner = summary["winner"]
    assert winner["measured_step_s"] is not None and winner["run_measured"]
    assert winner["run"]["total_s"] == pytest.approx(sum(v for k, v in winner["run"].items() if k != "total_s"))
    assert {row["layout"]["strategy"] for row in summary["candidates"]} == {"none"}  # one rank: no data parallelism

    user.dlx("pretrain", "runs/tune/small-tuned.yaml", "--run-dir", "run", timeout=600)
    run = user.home / "run"
    config = yaml.safe_load((run / "config.yaml").read_text())
    layout = winner["layout"]
    assert config["data"]["micro_batch_size"] == layout["micro_batch_size"]
    assert layout["micro_batch_size"] * layout["grad_accum"] == config["train"]["global_batch_size"] == 8
    assert config["parallel"]["activation_checkpointing"] == layout["activation_checkpointing"]
    assert config["train"]["attention"] == layout["attention"] and config["train"]["compile"] is False
    assert config["data"]["path"] == "data"  # the prepared corpus, not the synthetic tokens tune measured on
    steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4, 5, 6]
    evaluated = [json.loads(line)["step"] for line in (run / "eval.jsonl").read_text().splitlines()]
    assert evaluated == [3, 6]
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step-00000003", "step-00000006"]
