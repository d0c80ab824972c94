"""Preflight: what a run could only have found out late is found before step 1, before the run folder exists."""

from __future__ import annotations

import json
import shutil
from collections import namedtuple
from pathlib import Path

import numpy as np
import pytest

from dlx.data.shards import read_manifest, sha256_file, write_manifest
from dlx.errors import UserError
from dlx.model.stats import ParamFormula
from dlx.train.build import preflight
from dlx.train.build.preflight import checkpoint_bytes, run_preflight
from dlx.train.loop import trainer
from dlx.train.loop.trainer import pretrain
from dlx.train.recipe import load_recipe
from train_helpers import TINY, make_dataset

pytestmark = pytest.mark.usefixtures("in_process_training")


def shrink_val(folder: Path, tokens: int) -> Path:
    """Keep only the first `tokens` of the validation split (a small --val-documents, say)."""
    manifest = read_manifest(folder)
    shard = next(s for s in manifest.shards if s.split == "val")
    path = folder / shard.name
    np.fromfile(path, dtype="<u2")[:tokens].tofile(path)
    shard.tokens, shard.sha256 = tokens, sha256_file(path)
    write_manifest(folder, manifest)
    return folder


def recipe(data: Path, *extra: str):
    return load_recipe(None, [*TINY, "--data.path", str(data), "--data.num_workers", "0", *extra])


def test_a_validation_split_too_small_for_one_batch_stops_before_step_1(tmp_path, monkeypatch):
    """One batch is 2 × 16 + 1 = 33 tokens; 20 validation tokens hold none. Before preflight, this run trained until
    its first evaluation and died there."""
    data = shrink_val(make_dataset(tmp_path / "data"), 20)
    steps = []
    monkeypatch.setattr(trainer, "accumulate_gradients", lambda *a, **k: steps.append(1))
    config = recipe(data, "--train.max_steps", "8", "--eval.every", "4")
    with pytest.raises(UserError) as error:
        pretrain(config, "t", tmp_path / "run")
    assert str(error.value) == (
        f"eval.every is 4 but the validation split of {data} has 20 tokens, fewer than one batch needs (world size 1 "
        "× data.micro_batch_size 2 × data.seq_len 16 + 1 = 33); lower data.micro_batch_size, set eval.every 0, or "
        "prepare with a larger validation split (--val-fraction)"
    )
    assert steps == [] and not (tmp_path / "run").exists()


def test_fewer_validation_batches_than_eval_batches_is_a_note_and_the_run_goes_on(tmp_path, capsys):
    data = shrink_val(make_dataset(tmp_path / "data"), 3 * 32 + 1)  # 6 windows of 17 tokens: 3 batches of 2
    result = pretrain(recipe(data, "--train.max_steps", "2", "--eval.every", "2", "--eval.batches", "5"), "t", None)
    out = capsys.readouterr().out
    assert "note: the validation split holds 3 batch(es) per rank, fewer than eval.batches 5" in out
    assert result.eval_records[-1]["batches"] == 3


def test_the_header_states_every_check_and_its_cost(tmp_path, capsys):
    data = make_dataset(tmp_path / "data")
    pretrain(recipe(data, "--train.max_steps", "1", "--eval.every", "0"), "t", tmp_path / "run")
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("Preflight passed in "))
    parts = ["run folder: can be created in ", "dataset: 2 shards present", "tokenizer: matches", "disk: 1 checkpoint"]
    for part in [*parts, "batches: grad_accum 1, "]:
        assert part in line, part


@pytest.mark.parametrize(("damage", "message"), [("delete", "is missing"), ("truncate", "has 10 bytes")])
def test_a_missing_or_short_shard_is_named_before_anything_is_written(tmp_path, damage, message):
    data = make_dataset(tmp_path / "data")
    shard = data / "train-00000.bin"
    if damage == "delete":
        shard.unlink()
    else:
        shard.write_bytes(shard.read_bytes()[:10])
    with pytest.raises(UserError, match=f"shard train-00000.bin {message}.*dlx data verify"):
        pretrain(recipe(data, "--train.max_steps", "2"), "t", tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_a_replaced_tokenizer_is_refused(tmp_path):
    data = make_dataset(tmp_path / "data")
    other = make_dataset(tmp_path / "other", vocab_size=280)
    shutil.copyfile(other / "tokenizer.json", data / "tokenizer.json")
    with pytest.raises(UserError, match=r"tokenizer\.json is not the tokenizer its shards were made with"):
        pretrain(recipe(data, "--train.max_steps", "2"), "t", tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_resume_on_another_tokenizer_is_refused(tmp_path):
    data = make_dataset(tmp_path / "data")
    config = recipe(data, "--train.max_steps", "2")
    pretrain(config, "t", tmp_path / "run")
    other = make_dataset(tmp_path / "other", vocab_size=280)
    shutil.copyfile(other / "tokenizer.json", tmp_path / "run" / "tokenizer.json")
    with pytest.raises(UserError, match=r"--resume: .* is another tokenizer than data\.path"):
        pretrain(config, "t", tmp_path / "run", resume=True)


Usage = namedtuple("Usage", "total used free")


def test_too_little_disk_for_two_checkpoints_stops_and_room_for_fewer_than_keep_last_is_a_note(tmp_path, monkeypatch):
    config = recipe(make_dataset(tmp_path / "data"), "--train.max_steps", "2", "--checkpoint.every", "1")
    size = checkpoint_bytes(config)
    monkeypatch.setattr(shutil, "disk_usage", lambda path: Usage(10 * size, 0, 2 * size - 1))
    with pytest.raises(UserError, match=r"on a disk with .* free, less than 2 checkpoint\(s\) of ~"):
        run_preflight(config, tmp_path / "run", resume=False, world_size=1)
    monkeypatch.setattr(shutil, "disk_usage", lambda path: Usage(10 * size, 0, 3 * size))
    checked = run_preflight(config, tmp_path / "run", resume=False, world_size=1)
    note = checked.lines()[-1]
    assert note.startswith("  note: the disk has room for 3 checkpoints of ~") and "keep_last 3 needs 4 during" in note


def test_run_folder_under_a_file_or_unwritable(tmp_path, monkeypatch):
    config = load_recipe(None, [*TINY, "--train.max_steps", "1"])
    (tmp_path / "file").write_text("x")
    with pytest.raises(UserError, match=f"cannot create run folder {tmp_path}/file/run: {tmp_path}/file is a file"):
        run_preflight(config, tmp_path / "file" / "run", resume=False, world_size=1)
    monkeypatch.setattr(preflight.os, "access", lambda path, mode: False)  # the tests may run as root
    with pytest.raises(UserError, match=f"cannot write run folder {tmp_path}/new: {tmp_path} is not writable"):
        run_preflight(config, tmp_path / "new", resume=False, world_size=1)


def test_the_checkpoint_estimate_is_within_5_percent_of_a_real_checkpoint(tmp_path):
    config = load_recipe(None, [*TINY, "--train.max_steps", "1", "--model.dim", "128"])
    result = pretrain(config, "t", tmp_path / "run")
    written = sum(p.stat().st_size for p in result.last_checkpoint.rglob("*") if p.is_file())
    estimate = checkpoint_bytes(config)
    assert abs(written - estimate) / written < 0.05, (written, estimate)
    state = json.loads((result.last_checkpoint / "trainer_state.json").read_text())
    assert set(state["files"]) >= {"model.safetensors", "train_state.pt"}


def mixture(tmp_path: Path, *extra: str):
    first, second = make_dataset(tmp_path / "first"), make_dataset(tmp_path / "second")
    config = load_recipe(None, [*TINY, "--data.mix", f"{first}=1,{second}=3", "--data.num_workers", "0", *extra])
    return config, first, second


def test_a_mixture_checks_every_source(tmp_path):
    config, _, _ = mixture(tmp_path, "--train.max_steps", "2", "--eval.every", "2")
    line = run_preflight(config, tmp_path / "run", resume=False, world_size=1).lines()[0]
    for part in [
        "dataset: 4 shards present at their sizes in 2 data.mix sources",
        "tokenizer: each matches its manifest in 2 data.mix sources",
        "eval batch(es) in 2 data.mix sources",
    ]:
        assert part in line, part


def test_a_mixture_source_with_a_missing_shard_or_a_tiny_validation_split_is_named(tmp_path):
    config, first, second = mixture(tmp_path, "--train.max_steps", "2", "--eval.every", "2")
    shrink_val(first, 20)
    with pytest.raises(UserError) as error:
        run_preflight(config, tmp_path / "run", resume=False, world_size=1)
    assert str(error.value).startswith(f"eval.every is 2 but the validation split of data.mix source {first} has 20 ")
    (second / "train-00000.bin").unlink()
    with pytest.raises(UserError, match=f"data.mix source {second}: shard train-00000.bin is missing"):
        run_preflight(config, tmp_path / "run", resume=False, world_size=1)


def test_a_mixture_run_states_its_sources_in_the_header(tmp_path, capsys):
    config, _, _ = mixture(tmp_path, "--train.max_steps", "1", "--eval.every", "0")
    pretrain(config, "t", tmp_path / "run")
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("Preflight passed in "))
    assert "in 2 data.mix sources" in line


@pytest.mark.parametrize(
    ("layout", "per_parameter"),
    [
        ([], 12),  # model.safetensors + AdamW moments in train_state.pt
        (["--parallel.strategy", "fsdp"], 16),  # DCP weights and moments, model.safetensors at the last
        (["--parallel.strategy", "fsdp", "--checkpoint.full_weights", "never"], 12),
        (["--parallel.tp", "2"], 16),
        (["--parallel.strategy", "deepspeed"], 16),
        (["--train.optimizer", "sgd"], 4),
    ],
)
def test_the_checkpoint_estimate_follows_the_layout(layout, per_parameter):
    config = load_recipe(None, [*TINY, "--train.max_steps", "1", *layout])
    assert checkpoint_bytes(config) == per_parameter * ParamFormula(config.model.args).total
