"""A whole run in-process: records, header, evaluation, the NaN policy, and bad input that leaves nothing behind."""

from __future__ import annotations

import json
import math
import re

import pytest
import torch

from dlx.errors import UserError
from dlx.train.loop import accumulate
from dlx.train.loop.trainer import pretrain
from dlx.train.recipe import load_recipe
from train_helpers import TINY, make_dataset

REQUIRED = {
    "step",
    "loss",
    "lr",
    "grad_norm",
    "tokens_per_s",
    "data_wait_s",
    "forward_s",
    "backward_s",
    "optimizer_s",
    "step_s",
    "tflops",
    "mfu",
    "peak_mem_gb",
}

pytestmark = pytest.mark.usefixtures("in_process_training")


@pytest.mark.report
def test_a_run_logs_every_phase_and_writes_its_folder(tmp_path, capsys):
    data = make_dataset(tmp_path / "data")
    config = load_recipe(
        None,
        [
            *TINY,
            "--data.path",
            str(data),
            "--data.num_workers",
            "0",
            "--train.grad_accum",
            "2",
            "--train.epochs",
            "0.5",
            "--eval.every",
            "3",
            "--eval.batches",
            "2",
        ],
    )
    result = pretrain(config, "t", tmp_path / "run")
    out = capsys.readouterr().out
    header = [
        "***** Running training *****",
        "Num examples = ",
        "Total optimization steps = ",
        "Total train batch size (w. parallel, distributed & accumulation) = 4",
        "Gradient Accumulation steps = 2",
        "Number of trainable parameters = 158,016",
        "MFU = TFLOPS ÷ peak",
        "CPU theoretical: ",  # the hardware's ceiling, stated like a datasheet entry
        "attainable at start-up: ",
    ]
    for line in header:
        assert line in out
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == list(range(1, result.step + 1))
    for record in records:
        assert set(record) >= REQUIRED, REQUIRED - set(record)
        assert record["forward_s"] > 0 and record["backward_s"] > 0 and 0 < record["mfu"] < 1
        assert "warning" not in record and record["window_steps"] == 1 and record["step_s_std"] == 0.0
    evals = [json.loads(line) for line in (tmp_path / "run" / "eval.jsonl").read_text().splitlines()]
    assert [e["step"] for e in evals][:1] == [3] and evals[-1]["step"] == result.step
    assert math.isclose(evals[0]["perplexity"], math.exp(evals[0]["loss"]))
    assert "eval step 3 | loss" in out
    assert {"report.md", "loss.png", "throughput.png"} <= {p.name for p in (tmp_path / "run").iterdir()}
    assert "verdict" in (tmp_path / "run" / "report.md").read_text().lower()
    saved = (tmp_path / "run" / "config.yaml").read_text()
    assert "grad_accum: 2" in saved and "dim: 64" in saved
    examples = int(out.split("Num examples = ")[1].split()[0].replace(",", ""))
    assert result.step == math.ceil(0.5 * (examples // 2 // 2))  # epochs × ⌊batches per epoch / accum⌋


def test_the_loss_falls_on_synthetic_data(tmp_path):
    result = pretrain(load_recipe(None, [*TINY, "--train.max_steps", "30"]), "t", tmp_path / "run")
    first, last = result.records[0]["loss"], result.records[-1]["loss"]
    assert last < first - 0.5


def nan_at_step(monkeypatch, bad_step: int) -> None:
    """Make the loss NaN in the micro-steps of optimizer step `bad_step`."""
    real, calls = accumulate.training_loss, {"n": 0}

    def loss(strategy, model, inputs, targets, *args, **kwargs):
        calls["n"] += 1
        parts = real(strategy, model, inputs, targets, *args, **kwargs)
        if calls["n"] != bad_step:
            return parts
        return parts._replace(loss=parts.loss * float("nan"), cross_entropy=parts.cross_entropy * float("nan"))

    monkeypatch.setattr(accumulate, "training_loss", loss)


def test_nan_loss_stops_naming_the_step_and_the_last_good_checkpoint(tmp_path, monkeypatch):
    nan_at_step(monkeypatch, 5)
    config = load_recipe(None, [*TINY, "--train.max_steps", "8", "--checkpoint.every", "2"])
    with pytest.raises(UserError, match=r"loss is nan at step 5; last good checkpoint: .*step-00000004") as error:
        pretrain(config, "t", tmp_path / "run")
    assert "\n" not in str(error.value)
    events = (tmp_path / "run" / "events.jsonl").read_text()
    assert '"step": 5' in events and '"action": "stop"' in events
    assert not (tmp_path / "run" / "checkpoints" / "step-00000006").exists()


def test_nan_loss_skips_the_batch_under_policy_skip(tmp_path, monkeypatch, capsys):
    nan_at_step(monkeypatch, 3)
    config = load_recipe(None, [*TINY, "--train.max_steps", "6", "--train.nan_policy", "skip"])
    result = pretrain(config, "t", tmp_path / "run")
    assert result.step == 6 and "step 3: loss is nan; batch skipped" in capsys.readouterr().err
    assert all(torch.isfinite(p).all() for p in result.model.parameters())
    assert '"action": "skip"' in (tmp_path / "run" / "events.jsonl").read_text()


def test_fp16_and_bf16_train(tmp_path):
    for precision in ("fp16", "bf16"):
        config = load_recipe(None, [*TINY, "--train.max_steps", "3", "--train.precision", precision])
        result = pretrain(config, "t", tmp_path / precision)
        assert all(math.isfinite(r["loss"]) for r in result.records)
        assert all(0 < r["mfu"] <= 1 for r in result.records)  # MFU above 100 % would be a bug: the peak is a ceiling


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--data.path", "{data}", "--model.vocab_size", "100"], "vocab_size 300, larger than model.vocab_size 100"),
        (["--data.path", "{missing}"], "does not exist"),
        (["--data.path", "{data}", "--data.micro_batch_size", "4096"], "fewer than one batch"),
        (["--data.path", "{data}", "--train.grad_accum", "10000"], "fewer than train.grad_accum"),
    ],
)
def test_bad_input_writes_nothing(tmp_path, extra, message):
    data = make_dataset(tmp_path / "data")
    extra = [e.format(data=data, missing=tmp_path / "missing") for e in extra]
    config = load_recipe(None, [*TINY, "--data.num_workers", "0", *extra])
    with pytest.raises(UserError, match=message):
        pretrain(config, "t", tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_the_demo_trains_and_prints_a_sample(tmp_path, monkeypatch, capsys):
    """The demo's wiring, on a tiny dataset and model (the real one takes minutes: see BENCHMARKS.md)."""
    from dlx.data.shards import read_manifest
    from dlx.train import demo

    data = make_dataset(tmp_path / "data")
    monkeypatch.setattr(demo, "prepare_demo_data", lambda: read_manifest(data))
    monkeypatch.setitem(demo.DEMO_RECIPE, "model", {"preset": "debug"})
    monkeypatch.setitem(demo.DEMO_RECIPE, "data", {"path": str(data), "seq_len": 32, "micro_batch_size": 2})
    monkeypatch.setitem(demo.DEMO_RECIPE, "train", {"max_steps": 4, "precision": "fp32"})
    monkeypatch.setitem(demo.DEMO_RECIPE, "eval", {"every": 2, "batches": 2})
    assert demo.run_demo(run_dir=tmp_path / "run") == 0
    out = capsys.readouterr().out
    assert re.search(r"dlx demo: .* min; train loss \d+\.\d+ → \d+\.\d+; val loss \d+\.\d+ \(perplexity", out)
    assert f"sample (temperature 0.7, top-k 40):\n{'-' * 60}\n{demo.DEMO_PROMPT}" in out
