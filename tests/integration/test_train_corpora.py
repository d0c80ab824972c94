"""Training on real corpora: data.mix end to end (records, eval, report, resume), document masking, z-loss, and WSD
resumed with a longer run; bad input before step 1."""

from __future__ import annotations

import inspect
import json
import shutil
import string
from pathlib import Path

import numpy as np
import pytest
import torch

from dataset_helpers import write_dataset
from dlx.data.shards import read_manifest, sha256_file, write_manifest
from dlx.errors import UserError
from dlx.model.loss import whole_logits_loss
from dlx.train.build.objective import Objective
from dlx.train.loop.trainer import pretrain
from dlx.train.recipe import load_recipe
from train_helpers import TINY, losses, make_dataset, run_cli

pytestmark = pytest.mark.usefixtures("in_process_training")


@pytest.fixture(scope="module")
def two_corpora(tmp_path_factory) -> tuple[Path, Path]:
    """`prose` (make_dataset's stdlib modules) and `code` (other modules), tokenized by the same tokenizer."""
    from tokenizers import Tokenizer

    root = tmp_path_factory.mktemp("corpora")
    prose = make_dataset(root / "prose")
    tokenizer_json = (prose / "tokenizer.json").read_text()
    tokenizer = Tokenizer.from_str(tokenizer_json)
    base = read_manifest(prose)
    splits, documents = {}, {}
    for split, modules in (("train", (string, inspect)), ("val", (shutil,))):
        texts = [[*tokenizer.encode(inspect.getsource(m)).ids, base.eos_id] for m in modules]
        splits[split], documents[split] = [np.concatenate(texts)], [len(texts)]
    code = write_dataset(root / "code", splits, base.vocab_size, base.eos_id, documents, tokenizer_json)
    return prose, code


def mix_args(prose: Path, code: Path, *extra: str) -> list[str]:
    return [*TINY, "--data.mix", f"{prose}=1,{code}=3", "--data.num_workers", "0", *extra]


@pytest.mark.report
def test_a_mixture_run_logs_tokens_and_validation_loss_per_source(two_corpora, tmp_path):
    prose, code = two_corpora
    extra = ["--train.max_steps", "8", "--eval.every", "4", "--eval.batches", "2", "--train.grad_accum", "2"]
    extra += ["--eval.sample_every", "4", "--eval.sample_prompts", '["def "]', "--eval.sample_tokens", "3"]
    result = pretrain(load_recipe(None, mix_args(prose, code, *extra)), "t", tmp_path / "run")
    samples = [json.loads(line) for line in (tmp_path / "run" / "samples.jsonl").read_text().splitlines()]
    assert [s["step"] for s in samples] == [4, 8]  # sampled with the sources' shared tokenizer
    tokens_per_step = 2 * 2 * 16  # micro-batch × accumulation × seq_len
    for record in result.records:
        assert sum(record["source_tokens"].values()) == record["step"] * tokens_per_step
    assert result.records[-1]["source_tokens"] == {"code": 384, "prose": 128}  # 1 : 3 over 8 × 64 tokens
    for record in map(json.loads, (tmp_path / "run" / "eval.jsonl").read_text().splitlines()):
        per_source = record["source_loss"]
        assert set(per_source) == {"code", "prose"}
        assert record["loss"] == pytest.approx((3 * per_source["code"] + per_source["prose"]) / 4, rel=1e-12)
    report = (tmp_path / "run" / "report.md").read_text()
    assert "## Data mixture" in report
    assert "| code | 75.00% | 75.00% | 384 |" in report and "| prose | 25.00% | 25.00% | 128 |" in report


def shortened(dataset: Path, folder: Path, tokens: int) -> Path:
    """A copy of `dataset` whose train split keeps only its first `tokens` tokens."""
    shutil.copytree(dataset, folder)
    manifest = read_manifest(folder)
    train = manifest.split_shards("train")[0]
    path = folder / train.name
    path.write_bytes(path.read_bytes()[: 2 * tokens])
    train = train.model_copy(update={"tokens": tokens, "sha256": sha256_file(path)})
    write_manifest(folder, manifest.model_copy(update={"shards": [train, *manifest.split_shards("val")]}))
    return folder


def test_a_mixture_run_resumes_bit_identically_and_says_when_a_source_starts_again(two_corpora, tmp_path):
    prose, code = two_corpora
    small = shortened(code, tmp_path / "small", 100)  # 6 windows of 16, 1.5 per step at weight 3/4: 4 steps each
    extra = ["--train.max_steps", "8", "--checkpoint.every", "4", "--data.num_workers", "1"]
    args = [*TINY, "--data.mix", f"{prose}=1,{small}=3", *extra]
    pretrain(load_recipe(None, args), "t", tmp_path / "full")
    events = [json.loads(line) for line in (tmp_path / "full" / "events.jsonl").read_text().splitlines()]
    events = [e for e in events if e["event"] == "source_epoch"]
    assert [(e["source"], e["epoch"], e["step"]) for e in events] == [("small", 1, 4), ("small", 2, 8)]
    resumed = tmp_path / "resumed"
    shutil.copytree(tmp_path / "full", resumed)
    shutil.rmtree(resumed / "checkpoints" / "step-00000008")
    pretrain(load_recipe(None, args), "t", resumed, resume=True)
    assert losses(resumed) == losses(tmp_path / "full")
    state = json.loads((resumed / "checkpoints" / "step-00000008" / "trainer_state.json").read_text())
    assert state["loader"]["format"] == "dlx-mixture-state" and state["loader"]["position"] == 8 * 2


def test_document_masking_trains_and_evaluates_on_real_data(two_corpora, tmp_path):
    prose, _ = two_corpora
    extra = ["--data.path", str(prose), "--data.document_mask", "true", "--train.max_steps", "4"]
    result = pretrain(
        load_recipe(None, [*TINY, *extra, "--eval.every", "2", "--eval.batches", "2"]), "t", tmp_path / "r"
    )
    assert all(np.isfinite(r["loss"]) for r in result.records) and len(result.eval_records) == 2
    objective = Objective(document_eos=5)
    ids = objective.model_inputs(torch.tensor([[1, 5, 2, 5]]))["document_ids"]
    assert ids.tolist() == [[0, 0, 1, 1]] and Objective().model_inputs(torch.zeros(1, 4)) == {}


@pytest.mark.report
def test_z_loss_is_added_to_the_minimised_loss_and_logged_apart(tmp_path):
    steps = ["--train.max_steps", "3", "--train.grad_accum", "2"]
    plain = pretrain(load_recipe(None, [*TINY, *steps]), "t", tmp_path / "plain")
    with_z = pretrain(load_recipe(None, [*TINY, *steps, "--train.z_loss", "1e-2"]), "t", tmp_path / "z")
    assert with_z.records[0]["loss"] == plain.records[0]["loss"]  # the logged loss is the cross-entropy alone
    assert "z_loss" not in plain.records[0] and all(r["z_loss"] > 0 for r in with_z.records)
    assert with_z.records[-1]["loss"] != plain.records[-1]["loss"]  # it changed the updates
    report = (tmp_path / "z" / "report.md").read_text()
    assert f"- Final z-loss: {with_z.records[-1]['z_loss']:.4g} at step 3" in report
    assert "Final z-loss" not in (tmp_path / "plain" / "report.md").read_text()
    logits, targets = torch.randn(2, 3, 7), torch.randint(0, 7, (2, 3))
    objective = Objective(z_loss_weight=0.5)
    parts = whole_logits_loss(logits, targets, z_loss=0.5)
    z = logits.logsumexp(-1).square().mean()
    torch.testing.assert_close(parts.loss, parts.cross_entropy + 0.5 * z)  # what backward gets
    objective.record_z_loss(parts, accum=2)
    objective.record_z_loss(whole_logits_loss(2 * logits, targets, z_loss=0.5), accum=2)
    step_z = 0.5 * (z + (2 * logits).logsumexp(-1).square().mean()) / 2
    torch.testing.assert_close(objective.step_z_loss(), step_z)  # the two micro-steps of the step


def test_wsd_resumed_with_a_longer_run_trains_like_a_run_planned_longer(tmp_path):
    wsd = ["--train.schedule", "wsd", "--train.decay_ratio", "0.25", "--train.warmup_ratio", "0"]
    short = [*TINY, *wsd, "--train.max_steps", "8", "--checkpoint.every", "4"]
    pretrain(load_recipe(None, short), "t", tmp_path / "short")
    shutil.rmtree(tmp_path / "short" / "checkpoints" / "step-00000008")
    pretrain(load_recipe(None, [*TINY, *wsd, "--train.max_steps", "12"]), "t", tmp_path / "short", resume=True)
    pretrain(load_recipe(None, [*TINY, *wsd, "--train.max_steps", "12"]), "t", tmp_path / "long")
    assert losses(tmp_path / "short") == losses(tmp_path / "long")  # every step 1..12, exactly
    lrs = [json.loads(line)["lr"] for line in (tmp_path / "long" / "metrics.jsonl").read_text().splitlines()]
    assert lrs[:9] == [3e-3] * 9 and lrs[-1] == pytest.approx(3e-5)  # stable, then 3 decay steps to min_lr


def test_bad_sources_are_refused_before_anything_is_written(two_corpora, tmp_path):
    prose, code = two_corpora
    missing = tmp_path / "missing"
    with pytest.raises(UserError, match=f"data.mix source {missing}: dataset folder {missing} does not exist"):
        pretrain(load_recipe(None, [*TINY, "--data.mix", f"{prose}=1,{missing}=1"]), "t", tmp_path / "run")
    no_val = tmp_path / "no_val"
    shutil.copytree(code, no_val)
    manifest = read_manifest(no_val)
    write_manifest(no_val, manifest.model_copy(update={"shards": manifest.split_shards("train")}))
    with pytest.raises(UserError, match=f"data.mix source {no_val} has no validation split"):
        pretrain(load_recipe(None, [*mix_args(prose, no_val), "--eval.every", "2"]), "t", tmp_path / "run")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--data.mix", "a=1,b=x"], "error: recipe: data.mix: weight 'x' of b is not a number"),
        (["--data.mix", "a=1,./a=1"], "error: recipe: data.mix: a and ./a are the same folder"),
        (["--data.mix", "a=1,b=0"], "error: recipe: data.mix: the weight of b is 0.0;"),
        (["--data.mix", "a=-2,b=1"], "error: recipe: data.mix: the weight of a is -2.0;"),
        (["--data.mix", "a=nan,b=1"], "error: recipe: data.mix: the weight of a is nan;"),
        (["--data.mix", "a=1,b=inf"], "error: recipe: data.mix: the weight of b is inf;"),
        (["--data.mix", "a=1", "--data.path", "a"], "error: recipe: data.mix and data.path are exclusive"),
        (["--train.decay_ratio", "2"], "error: recipe: train.decay_ratio: input should be less than or equal to 1"),
        (["--data.mix", "{PROSE}=1,{ODD}=1"], "error: data.mix sources {PROSE} and {ODD} have different tokenizers"),
    ],
)
def test_bad_input_is_one_line_exit_2(two_corpora, tmp_path, args, message):
    prose, _ = two_corpora
    odd = make_dataset(tmp_path / "odd", vocab_size=280)  # another vocabulary
    work = tmp_path / "work"
    work.mkdir()
    args = [a.format(PROSE=prose, ODD=odd) for a in args]
    result = run_cli(["pretrain", *args, "--train.max_steps", "2"], cwd=work)
    assert result.returncode == 2, result.stderr
    assert result.stderr.count("\n") == 1 and result.stderr.startswith(message.format(PROSE=prose, ODD=odd))
    assert list(work.iterdir()) == []


@pytest.mark.distributed
def test_two_ranks_train_a_mixture_like_one_process(two_corpora, tmp_path):
    """DDP on 2 gloo ranks against one process with the same global batch: the same windows (the mixture's rows
    split across ranks), so the same losses, source tokens and per-source validation losses."""
    from test_parallel import LOSS_TOLERANCE, torchrun

    prose, code = two_corpora
    args = [
        *mix_args(prose, code),
        *["--train.global_batch_size", "8", "--train.optimizer", "sgd", "--train.max_steps", "3"],
        *["--eval.every", "3", "--data.document_mask", "true"],
    ]
    # eval.batches is per rank: 2 on each of 2 ranks read the windows 4 read in one process.
    one = pretrain(load_recipe(None, [*args, "--eval.batches", "4"]), "t", tmp_path / "one")
    two_ranks = ["pretrain", *args, "--eval.batches", "2", "--parallel.strategy", "ddp", "--run-dir"]
    result, _ = torchrun([*two_ranks, str(tmp_path / "two")], tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    two = [json.loads(line) for line in (tmp_path / "two" / "metrics.jsonl").read_text().splitlines()]
    for mine, theirs in zip(one.records, two, strict=True):
        assert abs(mine["loss"] - theirs["loss"]) <= LOSS_TOLERANCE
        assert mine["source_tokens"] == theirs["source_tokens"]
    evaluated = json.loads((tmp_path / "two" / "eval.jsonl").read_text())
    for name, loss in one.eval_records[-1]["source_loss"].items():
        assert abs(evaluated["source_loss"][name] - loss) <= LOSS_TOLERANCE


@pytest.mark.parametrize("weight", ["true", '"2"'])
def test_a_recipe_weight_must_be_a_number_as_written(tmp_path, weight):
    """YAML `true` or a quoted "2" is refused, not read as 1.0 or 2.0."""
    recipe = tmp_path / "mix.yaml"
    recipe.write_text(f"data:\n  mix:\n    a: 1\n    b: {weight}\n")
    with pytest.raises(UserError, match=r"the weight of b is (True|'2'); data\.mix takes PATH=W"):
        load_recipe(recipe, [])
