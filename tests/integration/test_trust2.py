"""The seed-001 path without traps: BOS as the tokenizer's own convention, the export's context length, the preflight
memory check, the shard-verification gate, and the smaller items (HF folders for plan/params/generate, file modes,
messages that name the fix)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from tokenizers import AddedToken, processors

from dlx.atomic import process_umask
from dlx.data.loader import TokenLoader
from dlx.data.prepare import prepare_dataset
from dlx.data.prepare.tokenizer import (
    BOS_TOKEN,
    EOS_TOKEN,
    bos_by_convention,
    document_bos_id,
    encode_prompt,
    load_tokenizer,
    train_bpe,
)
from dlx.data.shards import read_manifest
from dlx.data.source import LoaderSettings
from dlx.errors import UserError
from dlx.metrics.estimate import plan_memory
from dlx.parallel.distributed import DistEnv
from dlx.train.build import memory_check
from dlx.train.build.model import bos_difference
from dlx.train.recipe import load_recipe
from dlx.train.rundir.trained import TrainedSource
from prepare_helpers import make_documents, read_documents, write_jsonl
from train_helpers import TINY, make_dataset, train_quietly

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def llama_style(tmp_path_factory) -> Path:
    """A byte-level BPE with Llama 3's special tokens and post-processor: TemplateProcessing `<|begin_of_text|> $A`
    inside a Sequence after ByteLevel, as Meta's tokenizer.json has it (no tokenizer_config.json beside it)."""
    tok = train_bpe(make_documents(200, seed=7), 320, special_tokens=())
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in (BOS_TOKEN, EOS_TOKEN)])
    bos = tok.token_to_id(BOS_TOKEN)
    template = processors.TemplateProcessing(
        single=f"{BOS_TOKEN} $A", pair=f"{BOS_TOKEN} $A {BOS_TOKEN}:1 $B:1", special_tokens=[(BOS_TOKEN, bos)]
    )
    tok.post_processor = processors.Sequence([processors.ByteLevel(trim_offsets=False), template])
    path = tmp_path_factory.mktemp("llama-style") / "tokenizer.json"
    path.write_text(tok.to_str())
    return path


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    return write_jsonl(tmp_path_factory.mktemp("corpus") / "docs.jsonl", make_documents(40, seed=3))


def prepared(out: Path, corpus: Path, tokenizer: Path, **options) -> Path:
    prepare_dataset([str(corpus)], out, tokenizer=tokenizer, workers=1, progress=False, **options)
    return out


# BOS


def test_the_convention_comes_from_the_post_processor_or_tokenizer_config(llama_style, tmp_path):
    text = llama_style.read_text()
    assert bos_by_convention(text, None) == (True, BOS_TOKEN)
    assert bos_by_convention(text, {"add_bos_token": False}) == (False, BOS_TOKEN)  # as transformers: config wins
    trained = train_bpe(make_documents(50), 300).to_str()
    assert bos_by_convention(trained, None) == (False, None)  # a tokenizer dlx trains: no BOS, as before
    assert bos_by_convention(trained, {"add_bos_token": True})[0] is True


def test_prepare_follows_the_tokenizer_and_bos_no_bos_override(llama_style, corpus, tmp_path):
    bos = load_tokenizer(llama_style).token_to_id(BOS_TOKEN)
    default = prepared(tmp_path / "default", corpus, llama_style)
    docs = read_documents(default) + read_documents(default, "val")
    assert len(docs) == 40 and all(doc[0] == bos and bos not in doc[1:] for doc in docs)
    manifest = read_manifest(default)
    assert manifest.bos_id == bos and manifest.source["request"]["add_bos"] is True
    without = prepared(tmp_path / "without", corpus, llama_style, add_bos=False)
    assert read_manifest(without).bos_id is None and all(bos not in doc for doc in read_documents(without))
    assert [doc[1:] for doc in read_documents(default)] == read_documents(without)
    explicit = prepared(tmp_path / "explicit", corpus, llama_style, add_bos=True)
    assert read_documents(explicit) == read_documents(default)


def test_data_info_and_the_encoders_state_the_choice(llama_style, corpus, tmp_path, capsys):
    from dlx.cli.data_commands import info

    bos = load_tokenizer(llama_style).token_to_id(BOS_TOKEN)
    folder = prepared(tmp_path / "data", corpus, llama_style)
    info(folder, as_json=False)
    assert f"bos: <|begin_of_text|> (id {bos}) before every document" in capsys.readouterr().out
    plain = prepared(tmp_path / "plain", corpus, llama_style, add_bos=False)
    info(plain, as_json=False)
    assert "bos: none (each document is its ids then EOS)" in capsys.readouterr().out
    from dlx.train.build.preflight import run_preflight

    config = load_recipe(None, [*TINY, "--data.path", str(folder), "--train.max_steps", "1"])
    checks = {c.name: c.found for c in run_preflight(config, tmp_path / "run", False, 1).checks}
    assert checks["tokenizer"] == f"matches the manifest; bos: <|begin_of_text|> (id {bos}) before every document"
    # generate / training samples: the dataset's choice beside its tokenizer.json, else the tokenizer's convention
    assert document_bos_id(folder / "tokenizer.json") == bos and document_bos_id(llama_style) == bos
    assert document_bos_id(plain / "tokenizer.json") is None
    from dlx.train.observers.sample import trained_bos_id

    run_dir = tmp_path / "run-of-plain"  # a run folder: its tokenizer.json copy and config.yaml naming the data
    run_dir.mkdir()
    (run_dir / "tokenizer.json").write_text(llama_style.read_text())
    (run_dir / "config.yaml").write_text(f"data:\n  path: {plain}\n")
    assert document_bos_id(run_dir / "tokenizer.json") == bos and trained_bos_id(run_dir / "tokenizer.json") is None
    tokenizer = load_tokenizer(llama_style)
    ids = encode_prompt(tokenizer, "the cat", bos)
    assert ids[0] == bos and ids.count(bos) == 1 and ids[1:] == tokenizer.encode("the cat").ids[1:]


def test_init_from_says_when_the_data_starts_documents_otherwise(llama_style, corpus, tmp_path):
    plain = prepared(tmp_path / "plain", corpus, llama_style, add_bos=False)
    source = TrainedSource(str(tmp_path), tmp_path, "hf", tmp_path, llama_style)
    note = bos_difference(source, plain / "tokenizer.json")
    assert note is not None and "puts no BOS before its documents" in note and "again with --bos" in note
    assert "\n" not in note
    same = prepared(tmp_path / "same", corpus, llama_style)
    assert bos_difference(source, same / "tokenizer.json") is None


# export-hf: the context length of the source


def test_export_of_an_init_from_run_keeps_the_source_context(tmp_path, capsys):
    pytest.importorskip("transformers")
    from dlx.cli.model_commands import export_hf
    from dlx.model.hf import TRAINED_LENGTH_KEY
    from hf_helpers import BASE, write_hf_llama

    dataset = make_dataset(tmp_path / "data")
    write_hf_llama(tmp_path / "hf", 300, tokenizer=dataset / "tokenizer.json")  # max_position_embeddings 128
    overrides = [*BASE, "--model.init_from", str(tmp_path / "hf"), "--model.max_seq_len", "32"]
    overrides += ["--data.path", str(dataset), "--data.num_workers", "0", "--train.max_steps", "1"]
    run_dir = train_quietly(overrides, tmp_path / "run")
    capsys.readouterr()
    export_hf(run_dir, tmp_path / "export", dtype="keep", overwrite=False)
    assert capsys.readouterr().out.endswith(
        "\nmax_position_embeddings 128: the context length of model.init_from's weights, whose RoPE the run kept "
        "(trained with max_seq_len 32, kept in config.json as dlx_trained_max_seq_len)\n"
    )
    config = json.loads((tmp_path / "export" / "config.json").read_text())
    assert config["max_position_embeddings"] == 128 and config[TRAINED_LENGTH_KEY] == 32
    tokenizer_config = json.loads((tmp_path / "export" / "tokenizer_config.json").read_text())
    assert tokenizer_config["model_max_length"] == 128
    assert (tmp_path / "export" / "model.safetensors").stat().st_mode & 0o777 == 0o666 & ~process_umask()
    with pytest.raises(UserError, match="or give --overwrite"):
        export_hf(run_dir, tmp_path / "export", dtype="keep", overwrite=False)
    (tmp_path / "hf").rename(tmp_path / "hf-moved")  # the source gone: its context is unknown, the run's own stated
    export_hf(run_dir, tmp_path / "export", dtype="keep", overwrite=True)
    assert capsys.readouterr().out.endswith(
        f"note: model.init_from {tmp_path / 'hf'} of {run_dir} is gone, so the export states 32 (the trained "
        "max_seq_len), not the source's context length\n"
    )
    assert json.loads((tmp_path / "export" / "config.json").read_text())["max_position_embeddings"] == 32


# memory check


def tiny_config(seq_len: int = 16, **train) -> object:
    overrides = [*TINY, "--data.path", "synthetic", "--data.micro_batch_size", "64", "--train.max_steps", "1"]
    overrides += ["--data.seq_len", str(seq_len)]
    overrides += [f"--train.{key}={value}" for key, value in train.items()]
    return load_recipe(None, overrides)


def estimate(config, micro: int, checkpointing: str = "none") -> float:
    shape = memory_check.run_shape(config, CPU, 1, "fp32")
    from dataclasses import replace

    return plan_memory(config.model.args, replace(shape, micro_batch=micro, activation_checkpointing=checkpointing))


def test_a_run_that_cannot_fit_names_the_micro_batch_that_would(monkeypatch):
    config = tiny_config()
    sizes = {m: estimate(config, m).total_gb for m in range(1, 65)}
    budget = (sizes[5] + sizes[6]) / 2
    monkeypatch.setattr(memory_check.dev, "available_memory_gb", lambda: budget)
    with pytest.raises(UserError) as error:
        memory_check.check_memory(config, CPU, DistEnv(), "fp32")
    message = str(error.value)
    assert f"needs ~{sizes[64]:.3g} GB per rank" in message and "data.micro_batch_size 5 fits" in message
    assert "train.skip_memory_check true" in message and "\n" not in message


def test_activation_checkpointing_is_named_when_no_micro_batch_fits(monkeypatch):
    config = tiny_config(seq_len=128)  # the peak is forward's activations (not the gradients): checkpointing lowers it
    budget = (estimate(config, 1, "full").total_gb + estimate(config, 1).total_gb) / 2
    monkeypatch.setattr(memory_check.dev, "available_memory_gb", lambda: budget)
    with pytest.raises(UserError, match=r"parallel\.activation_checkpointing full with data\.micro_batch_size 1 fits"):
        memory_check.check_memory(config, CPU, DistEnv(), "fp32")
    monkeypatch.setattr(memory_check.dev, "available_memory_gb", lambda: 1e-6)
    with pytest.raises(UserError, match="not even micro-batch 1 with activation checkpointing fits"):
        memory_check.check_memory(config, CPU, DistEnv(), "fp32")
    skipped = memory_check.check_memory(tiny_config(skip_memory_check="true"), CPU, DistEnv(), "fp32")
    assert skipped.note.startswith("train.skip_memory_check: running although")


def test_free_memory_within_the_cpu_heap_growth_is_a_warning_not_a_refusal(monkeypatch):
    config = tiny_config()
    need = estimate(config, config.data.micro_batch_size).total_gb
    growth = 1 + memory_check.CPU_HEAP_GROWTH
    monkeypatch.setattr(memory_check.dev, "available_memory_gb", lambda: need * 1.01)
    assert "this run may swap" in memory_check.check_memory(config, CPU, DistEnv(), "fp32").note
    monkeypatch.setattr(memory_check.dev, "available_memory_gb", lambda: need * growth * 1.01)
    assert memory_check.check_memory(config, CPU, DistEnv(), "fp32").note is None


@pytest.mark.parametrize("recipe", ["demo", "debug"])
def test_the_demo_and_debug_recipes_pass_the_check_here(recipe):
    recipe_file = Path(__file__).parents[2] / "recipes" / f"{recipe}.yaml"
    config = load_recipe(
        recipe_file,
        ["--data.path", "synthetic", "--train.max_steps", "1", "--eval.tasks", "[]", "--eval.tasks_every", "0"],
    )
    found = memory_check.check_memory(config, CPU, DistEnv(), "fp32")
    assert found.name == "memory" and "GB estimated per rank" in found.found and found.note is None


def test_a_refused_run_writes_nothing(monkeypatch, tmp_path):
    from dlx.train.launch import launch

    monkeypatch.setattr(memory_check.dev, "available_memory_gb", lambda: 1e-6)
    with pytest.raises(UserError, match="by `dlx plan`'s estimate"):
        launch(None, [*TINY, "--data.path", "synthetic", "--train.max_steps", "1"], tmp_path / "run", resume=False)
    assert not (tmp_path / "run").exists()


# the verification gate


def damaged(tmp_path: Path) -> tuple[Path, str]:
    """A dataset whose training shard has one token changed into another valid id (the checksum no longer matches)."""
    folder = make_dataset(tmp_path / "data")
    shard = folder / read_manifest(folder).split_shards("train")[0].name
    tokens = np.fromfile(shard, dtype=read_manifest(folder).dtype)
    tokens[3] = (tokens[3] + 1) % 300
    tokens.tofile(shard)
    return folder, shard.name


@pytest.fixture
def paused_verifier(monkeypatch, tmp_path):
    """The loader workers' background verification held before its first shard (`dlx.faults`), then released."""
    monkeypatch.setenv("DLX_FAULT_PAUSE", "shard_verify")
    monkeypatch.setenv("DLX_FAULT_DIR", str(tmp_path))
    yield
    (tmp_path / "shard_verify").unlink(missing_ok=True)


def test_the_loader_verifies_what_batches_read_before_it_says_so(tmp_path, paused_verifier):
    folder, name = damaged(tmp_path)
    with TokenLoader(folder, LoaderSettings(seq_len=16, micro_batch_size=2, num_workers=1, prefetch=2)) as loader:
        next(loader)
        next(loader)  # read before the paused background thread hashed anything
        with pytest.raises(UserError, match=f"shard {name} does not match the checksum"):
            loader.verify_read_shards()
    intact = make_dataset(tmp_path / "intact")
    with TokenLoader(intact, LoaderSettings(seq_len=16, micro_batch_size=2, num_workers=1, prefetch=2)) as loader:
        next(loader)
        assert loader.verify_read_shards() == [str(intact / read_manifest(intact).split_shards("train")[0].name)]
        assert loader.verify_read_shards() == []  # once


def test_a_short_run_on_a_damaged_shard_does_not_end_well(tmp_path, paused_verifier):
    folder, name = damaged(tmp_path)
    overrides = [*TINY, "--data.path", str(folder), "--data.num_workers", "1", "--train.max_steps", "3"]
    with pytest.raises(UserError) as error:
        train_quietly(overrides, tmp_path / "run")
    message = str(error.value)
    assert f"shard {name} does not match" in message and "no checkpoint is published after that" in message
    assert not list((tmp_path / "run" / "checkpoints").glob("step-*"))


# smaller items


def test_plan_and_params_read_a_hugging_face_folder(tmp_path, capsys):
    pytest.importorskip("transformers")
    from dlx.cli.model_commands import params
    from dlx.cli.plan_commands import plan_summary
    from dlx.model.hf import read_hf_args
    from dlx.model.stats import model_stats
    from hf_helpers import write_hf_llama

    write_hf_llama(tmp_path / "hf", 300)
    params(str(tmp_path / "hf"), as_json=True, list_presets=False)
    counted = json.loads(capsys.readouterr().out)
    assert counted["total"] == model_stats(read_hf_args(tmp_path / "hf")).total
    from dlx.metrics.estimate import TrainingShape

    summary = plan_summary(str(tmp_path / "hf" / "config.json"), TrainingShape(16, 1), "H100", 0.4, 80.0)
    assert summary["params"] == counted["total"]


def test_generate_reads_a_hugging_face_folder(tmp_path):
    pytest.importorskip("transformers")
    from dlx.train.observers.sample import sample_text
    from hf_helpers import write_hf_llama

    dataset = make_dataset(tmp_path / "data")
    write_hf_llama(tmp_path / "hf", 300, tokenizer=dataset / "tokenizer.json")
    text = sample_text(tmp_path / "hf", "def f(", max_new_tokens=3, temperature=0.0, device="cpu")
    assert text.startswith("def f(")


def test_the_demo_takes_as_long_in_help_as_in_the_readme():
    from dlx.cli.train_commands import PRETRAIN_HELP

    readme = Path(__file__).parents[2].joinpath("README.md").read_text()
    assert "3 to 6 minutes on a 2-core CPU" in " ".join(PRETRAIN_HELP.split())
    assert "the embedded demo: 3 to 6 minutes on a 2-core CPU" in readme
    assert "--model.preset null" in readme


def test_prepare_warns_of_a_small_validation_split(llama_style, corpus, tmp_path, capsys):
    prepared(tmp_path / "data", corpus, llama_style, val_documents=1)
    err = capsys.readouterr().err
    assert "warning: the validation split holds 1 document(s)" in err and "--val-fraction" in err


def test_the_run_header_says_a_validation_split_is_too_small_to_trust(tmp_path):
    from dlx.train.build.preflight import run_preflight

    folder = make_dataset(tmp_path / "data")  # one validation document
    micro = (read_manifest(folder).split_tokens("val") - 1) // 16 // 2  # 2 validation batches of 16-token windows
    overrides = [*TINY, "--data.path", str(folder), "--train.max_steps", "1", "--eval.every", "1"]
    overrides += ["--data.micro_batch_size", str(micro)]
    notes = [c.note for c in run_preflight(load_recipe(None, overrides), tmp_path / "run", False, 1).checks if c.note]
    assert len(notes) == 1 and "so few that its loss is noisy (prepare with a larger --val-fraction" in notes[0]


def test_weights_files_follow_the_umask(tmp_path):
    from dlx.model.io import save_model
    from dlx.model.llama import Transformer
    from dlx.model.presets import resolve_model_args

    old = os.umask(0o027)
    try:
        save_model(Transformer(resolve_model_args("debug")), tmp_path / "model")
    finally:
        os.umask(old)
    assert (tmp_path / "model" / "model.safetensors").stat().st_mode & 0o777 == 0o640
