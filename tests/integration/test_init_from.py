"""model.init_from: the shape and the weights come from a Hugging Face folder (written by transformers, sharded or not),
a dlx model folder, a checkpoint or a run folder; the dataset's tokenizer must be the weights' one by content; bad
input is one line and leaves nothing behind."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from dlx.errors import UserError
from dlx.model.io import load_model, save_model
from dlx.train.build.data import build_train_loader
from dlx.train.build.model import build_model
from dlx.train.launch import launch
from dlx.train.recipe import load_recipe
from dlx.train.rundir.trained import resolve_trained
from hf_helpers import BASE, next_token_loss, write_hf_llama
from train_helpers import TINY, losses, make_dataset, run_cli, train_quietly

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("in_process_training")
CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    return make_dataset(tmp_path_factory.mktemp("data") / "data")


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory, dataset) -> Path:
    """Eight safetensors shards and an index, and the dataset's tokenizer as transformers re-saves it."""
    folder = tmp_path_factory.mktemp("hf") / "llama"
    write_hf_llama(folder, 300, tokenizer=dataset / "tokenizer.json", shard_size="100KB")
    return folder


def from_hf(hf_dir: Path, dataset: Path, *more: str) -> list[str]:
    return [*BASE, "--model.init_from", str(hf_dir), "--data.path", str(dataset), "--data.num_workers", "0", *more]


@pytest.mark.parametrize("layout", ["sharded-untied-fp32", "single-tied-bf16"])
def test_logits_equal_transformers_after_init_from(layout, hf_dir, dataset, tmp_path):
    folder = hf_dir
    if layout == "single-tied-bf16":
        folder = tmp_path / "tied"
        write_hf_llama(folder, 300, tie=True, dtype=torch.bfloat16, seed=1)
    else:
        shards = set(json.loads((folder / "model.safetensors.index.json").read_text())["weight_map"].values())
        assert len(shards) == 8
    config = load_recipe(None, from_hf(folder, dataset))
    args = config.model.args
    assert (args.dim, args.n_layers, args.kv_heads, args.vocab_size, args.ffn_hidden_dim) == (64, 2, 2, 300, 200)
    model = build_model(config, CPU, resolve_trained(folder, "model.init_from")).eval()
    assert next(model.parameters()).dtype == torch.float32  # trained in fp32 master weights, whatever was stored
    hf = transformers.LlamaForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    tokens = torch.randint(0, 300, (2, 48), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(model(tokens), hf(tokens).logits, atol=1e-4, rtol=0)


def test_a_run_from_hf_weights_starts_at_their_loss(hf_dir, dataset, tmp_path):
    """Step 1's loss is the HF model's loss on the first batch: the weights are loaded, nothing else is."""
    assert (hf_dir / "tokenizer.json").read_bytes() != (dataset / "tokenizer.json").read_bytes()  # re-saved
    config = load_recipe(None, from_hf(hf_dir, dataset, "--train.max_steps", "2"))
    with build_train_loader(config, CPU) as loader:
        inputs, targets = next(loader)
    hf = transformers.LlamaForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        expected = next_token_loss(hf(inputs).logits, targets)
    run_dir = tmp_path / "run"
    assert launch(None, from_hf(hf_dir, dataset, "--train.max_steps", "2"), run_dir, resume=False) == 0
    assert abs(losses(run_dir)[1] - expected) < 1e-5, (losses(run_dir), expected)
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    assert events[0].pop("time") > 0
    assert events[0] == {"event": "init_from", "path": str(hf_dir), "weights": str(hf_dir), "kind": "hf"}
    assert f"init_from: {hf_dir}" in (run_dir / "config.yaml").read_text()


def test_the_shape_comes_from_the_weights(hf_dir, dataset):
    assert load_recipe(None, from_hf(hf_dir, dataset, "--model.max_seq_len", "64")).model.args.max_seq_len == 64
    assert load_recipe(None, from_hf(hf_dir, dataset, "--model.vocab_size", "300")).model.args.dim == 64
    contradictions = {
        "--model.dim 128": r"model\.dim is 128 but the weights in model\.init_from \S+ have dim 64; .*leave model\.dim",
        "--model.preset debug": r"model\.preset 'debug' has vocab_size 512 but the weights .* have vocab_size 300",
        "--model.multiple_of 256": r"model\.multiple_of 256 makes ffn_hidden_dim 256 but .* have ffn_hidden_dim 200",
        "--model.tie_embeddings true": r"model\.tie_embeddings is True but .* have tie_embeddings False",
    }
    for override, message in contradictions.items():
        with pytest.raises(UserError, match=message) as error:
            load_recipe(None, from_hf(hf_dir, dataset, *override.split()))
        assert "\n" not in str(error.value)


def test_a_dataset_prepared_with_another_tokenizer_is_refused(hf_dir, tmp_path):
    other = make_dataset(tmp_path / "other", vocab_size=280)
    with pytest.raises(UserError) as error:
        launch(None, from_hf(hf_dir, other, "--train.max_steps", "1"), tmp_path / "run", resume=False)
    message = str(error.value)
    assert f"data.path {other} was prepared with a tokenizer that is neither model.init_from's {hf_dir}" in message
    assert "not at id" in message and f"--tokenizer {hf_dir}/tokenizer.json" in message and "\n" not in message
    assert not (tmp_path / "run").exists()


def test_without_a_tokenizer_beside_the_weights_only_the_vocabulary_is_checked(dataset, tmp_path):
    small, large = tmp_path / "small", tmp_path / "large"
    write_hf_llama(small, 256)
    write_hf_llama(large, 320)
    with pytest.raises(UserError, match=r"larger than model\.vocab_size 256; prepare the data with the tokenizer of"):
        launch(None, from_hf(small, dataset, "--train.max_steps", "1"), tmp_path / "small-run", resume=False)
    assert not (tmp_path / "small-run").exists()
    assert launch(None, from_hf(large, dataset, "--train.max_steps", "1"), tmp_path / "run", resume=False) == 0


def _without_weights(folder: Path) -> None:
    for file in folder.glob("model*"):
        file.unlink()


def _with_pickle_only(folder: Path) -> None:
    _without_weights(folder)
    (folder / "pytorch_model.bin").write_bytes(b"not read")


def _gpt2(folder: Path) -> None:
    (folder / "config.json").write_text(json.dumps({"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]}))


def _missing_shard(folder: Path) -> None:
    (folder / "model-00003-of-00008.safetensors").unlink()


def _truncated(folder: Path) -> None:
    shard = folder / "model-00002-of-00008.safetensors"
    shard.write_bytes(shard.read_bytes()[:-1000])


def _config_disagrees(folder: Path) -> None:
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "intermediate_size": 256}))


BAD_FOLDERS = {
    "no weights": (_without_weights, r"holds no weights: neither model\.safetensors nor model\.safetensors\.index"),
    "pickles only": (_with_pickle_only, r"holds pytorch_model\.bin but no safetensors"),
    "another architecture": (_gpt2, r"describes GPT2LMHeadModel, not a Llama model"),
    "missing shard": (_missing_shard, r"names the shard model-00003-of-00008\.safetensors, which is missing"),
    "truncated shard": (_truncated, r"model-00002-of-00008\.safetensors: .* truncated or damaged, download it again"),
    "config disagrees": (_config_disagrees, r"has shape \[200, 64\], the model's .* has \[256, 64\]"),
}


@pytest.mark.parametrize("case", BAD_FOLDERS)
def test_a_bad_folder_is_one_line_and_nothing_is_written(case, hf_dir, dataset, tmp_path):
    damage, message = BAD_FOLDERS[case]
    folder = tmp_path / "llama"
    shutil.copytree(hf_dir, folder)
    damage(folder)
    with pytest.raises(UserError, match=message) as error:
        launch(None, from_hf(folder, dataset, "--train.max_steps", "1"), tmp_path / "run", resume=False)
    assert "\n" not in str(error.value)
    assert not (tmp_path / "run").exists()


def test_no_folder_or_an_unknown_one_is_one_line(dataset, tmp_path):
    (tmp_path / "empty").mkdir()
    expected = {
        tmp_path / "missing": r"model\.init_from \S+missing does not exist or is not a folder",
        tmp_path / "empty": r"model\.init_from \S+empty is neither a Hugging Face folder \(config\.json\), a dlx model",
    }
    for path, message in expected.items():
        with pytest.raises(UserError, match=message):
            load_recipe(None, from_hf(path, dataset))


def test_the_command_line_says_it_in_one_line_with_exit_2(hf_dir, dataset, tmp_path):
    folder = tmp_path / "llama"
    shutil.copytree(hf_dir, folder)
    _truncated(folder)
    result = run_cli(["pretrain", *from_hf(folder, dataset), "--run-dir", str(tmp_path / "run")], tmp_path)
    assert result.returncode == 2, result.stderr
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("error: cannot read "), result.stderr
    assert not (tmp_path / "run").exists()


def test_init_from_a_run_a_checkpoint_and_a_model_folder(tmp_path):
    run_dir = train_quietly([*TINY, "--train.max_steps", "2", "--checkpoint.every", "1"], tmp_path / "a")
    newest, previous = run_dir / "checkpoints" / "step-00000002", run_dir / "checkpoints" / "step-00000001"
    save_model(load_model(previous), tmp_path / "model")
    config = load_recipe(None, [*BASE, "--model.init_from", str(run_dir), "--train.max_steps", "1"])
    assert config.model.args == load_model(newest).args
    for given, kind, weights in [
        (run_dir, "run", newest),
        (previous, "checkpoint", previous),
        (tmp_path / "model", "model", tmp_path / "model"),
    ]:
        source = resolve_trained(given, "model.init_from")
        assert (source.kind, source.weights, source.notes) == (kind, weights, ())
        built, saved = build_model(config, CPU, source).state_dict(), load_model(weights).state_dict()
        assert all(torch.equal(built[name], saved[name]) for name in saved)
    (newest / "model.safetensors").write_bytes(b"\0" * 16)  # a damaged newest checkpoint is passed over, and said so
    source = resolve_trained(run_dir, "model.init_from")
    assert source.weights == previous and "step-00000002 is damaged" in source.notes[0]
    options = [*BASE, "--model.init_from", str(run_dir), "--train.max_steps", "1"]
    assert launch(None, options, tmp_path / "b", resume=False) == 0


def test_a_run_from_weights_resumes_from_its_checkpoint_even_once_they_are_gone(hf_dir, dataset, tmp_path):
    weights = tmp_path / "llama"
    shutil.copytree(hf_dir, weights)
    run_dir = tmp_path / "run"
    options = from_hf(weights, dataset, "--train.max_steps", "3", "--checkpoint.every", "1")
    assert launch(None, options, run_dir, resume=False) == 0
    uninterrupted = losses(run_dir)
    shutil.rmtree(run_dir / "checkpoints" / "step-00000003")
    shutil.rmtree(weights)
    with pytest.raises(UserError, match=r"--model\.init_from starts a new run .* --resume continues") as error:
        launch(None, ["--model.init_from", str(hf_dir)], run_dir, resume=True)
    assert "\n" not in str(error.value)
    assert launch(None, [], run_dir, resume=True) == 0
    assert losses(run_dir)[3] == uninterrupted[3]
