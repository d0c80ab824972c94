"""`dlx export-hf` writes a folder the Hugging Face ecosystem uses as it is: transformers loads model and tokenizer, the
tokenizer's ids are the dataset's, greedy generation equals `dlx generate --temperature 0` and stops at the
end-of-document token; `dlx import-hf` keeps the tokenizer, and `dlx generate` on the imported model uses it.
(lm-evaluation-harness's `--model hf` loads a folder through AutoConfig, AutoModelForCausalLM and AutoTokenizer and
reads eos, pad and the context length from them: those are checked here through transformers itself.)"""

from __future__ import annotations

import inspect
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from tokenizers import Tokenizer

from dlx.cli.model_commands import export_hf, import_hf
from dlx.data.shards import read_manifest
from dlx.errors import UserError
from dlx.model.io import load_model
from dlx.train.observers.sample import sample_text
from train_helpers import TINY, run_cli, train_quietly

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("in_process_training")
PROMPT = "def decode(self, s"
HF_FILES = {
    "config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "generation_config.json",
}


def corpus_texts() -> list[str]:
    import email.message
    import json.decoder
    import textwrap

    return [inspect.getsource(module) for module in (json.decoder, textwrap, email.message)]


def prepare_corpus(root: Path, val_documents: int) -> Path:
    """`dlx prepare` of `corpus_texts` in `root` with a Llama-3-shaped BPE it trains (begin- and end-of-document
    tokens, BOS before documents) and `val_documents` validation documents; returns the dataset folder."""
    with open(root / "corpus.jsonl", "w") as f:
        for text in corpus_texts():
            f.write(json.dumps({"text": text}) + "\n")
    command = ["prepare", "corpus.jsonl", "--train-tokenizer", "400", "--bos", "--val-documents", str(val_documents)]
    result = run_cli([*command, "--out", "data"], root)
    assert result.returncode == 0, result.stderr
    return root / "data"


@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> Path:
    return prepare_corpus(tmp_path_factory.mktemp("prepared"), val_documents=0)


@pytest.fixture(scope="module")
def run_dir(prepared, tmp_path_factory) -> Path:
    options = [*TINY, "--data.path", str(prepared), "--data.num_workers", "0", "--train.max_steps", "12"]
    return train_quietly(options, tmp_path_factory.mktemp("run") / "run")


@pytest.fixture(scope="module")
def exported(run_dir, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("export") / "hf"
    result = run_cli(["export-hf", str(run_dir), str(out)], out.parent)
    assert result.returncode == 0, result.stderr
    return out


def test_the_export_holds_what_transformers_reads(exported, prepared):
    assert {p.name for p in exported.iterdir()} == HF_FILES
    assert (exported / "tokenizer.json").read_bytes() == (prepared / "tokenizer.json").read_bytes()
    manifest = read_manifest(prepared)
    tokenizer = Tokenizer.from_file(str(prepared / "tokenizer.json"))
    eos, bos = tokenizer.token_to_id("<|end_of_text|>"), tokenizer.token_to_id("<|begin_of_text|>")
    assert (manifest.eos_id, manifest.bos_id) == (eos, bos)
    config = json.loads((exported / "config.json").read_text())
    assert (config["bos_token_id"], config["eos_token_id"], config.get("pad_token_id")) == (bos, eos, None)
    generation = json.loads((exported / "generation_config.json").read_text())
    assert generation == {"bos_token_id": bos, "eos_token_id": eos, "pad_token_id": eos}
    tokenizer_config = json.loads((exported / "tokenizer_config.json").read_text())
    assert tokenizer_config["eos_token"] == "<|end_of_text|>" and tokenizer_config["model_max_length"] == 128


def test_transformers_loads_the_tokenizer_with_the_datasets_ids(exported, prepared):
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(exported)
    manifest = read_manifest(prepared)
    shard = np.fromfile(prepared / "train-00000.bin", dtype="<u2")
    first_document = shard[1 : int(np.argmax(shard == manifest.eos_id))].tolist()  # after BOS, up to EOS
    assert hf_tokenizer(corpus_texts()[0], add_special_tokens=False).input_ids == first_document
    assert (hf_tokenizer.eos_token_id, hf_tokenizer.bos_token_id) == (manifest.eos_id, manifest.bos_id)
    assert hf_tokenizer.pad_token_id == manifest.eos_id and hf_tokenizer.model_max_length == 128


def test_transformers_loads_the_model_with_dlxs_logits(exported, run_dir, prepared):
    hf = transformers.AutoModelForCausalLM.from_pretrained(exported, dtype=torch.float32).eval()
    model = load_model(sorted((run_dir / "checkpoints").iterdir())[-1]).eval()
    tokens = torch.randint(0, 400, (2, 40), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(hf(tokens).logits, model(tokens), atol=1e-4, rtol=0)
    config = transformers.AutoConfig.from_pretrained(exported)  # what lm-evaluation-harness reads for its context
    assert config.max_position_embeddings == 128 and config.eos_token_id == read_manifest(prepared).eos_id


def test_greedy_generation_equals_dlx_generate(exported, run_dir, tmp_path):
    cli = run_cli(
        ["generate", str(run_dir), "--prompt", PROMPT, "--temperature", "0", "--max-new-tokens", "40"], tmp_path
    )
    assert cli.returncode == 0, cli.stderr
    tokenizer = transformers.AutoTokenizer.from_pretrained(exported)
    hf = transformers.AutoModelForCausalLM.from_pretrained(exported, dtype=torch.float32).eval()
    inputs = tokenizer(PROMPT, return_tensors="pt")
    out = hf.generate(**inputs, do_sample=False, max_new_tokens=40)
    expected = tokenizer.decode(out[0], skip_special_tokens=True)
    assert cli.stdout.rstrip("\n") == expected
    pipe = transformers.pipeline("text-generation", model=str(exported), dtype=torch.float32)
    assert pipe(PROMPT, do_sample=False, max_new_tokens=40)[0]["generated_text"] == expected


def test_generation_stops_at_the_end_of_document_token(exported):
    tokenizer = transformers.AutoTokenizer.from_pretrained(exported)
    hf = transformers.AutoModelForCausalLM.from_pretrained(exported, dtype=torch.float32).eval()
    eos = tokenizer.eos_token_id

    def end_the_document(module, inputs, logits):  # (B, T, vocab): the model now always ends the document
        logits[..., eos] += 1e4
        return logits

    hf.lm_head.register_forward_hook(end_the_document)
    out = hf.generate(**tokenizer("x = 1", return_tensors="pt"), do_sample=False, max_new_tokens=20)
    assert out[0, -1].item() == eos and out.shape[1] == len(tokenizer("x = 1").input_ids) + 1


def test_import_keeps_the_tokenizer_and_generate_uses_it(exported, run_dir, tmp_path, capsys):
    import_hf(exported, tmp_path / "imported")
    assert "(tokenizer kept: tokenizer.json, tokenizer_config.json" in capsys.readouterr().out
    kept = tmp_path / "imported" / "tokenizer.json"
    assert kept.read_bytes() == (exported / "tokenizer.json").read_bytes()
    from_import = sample_text(tmp_path / "imported", PROMPT, 40, temperature=0.0, device="cpu")
    assert from_import == sample_text(run_dir, PROMPT, 40, temperature=0.0, device="cpu")


def test_export_options_and_refusals(run_dir, exported, tmp_path):
    export_hf(run_dir, tmp_path / "bf16", dtype="bf16")
    assert json.loads((tmp_path / "bf16" / "config.json").read_text())["torch_dtype"] == "bfloat16"
    assert transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "bf16").dtype == torch.bfloat16
    for source, out, message in [
        (exported, tmp_path / "again", "is a Hugging Face folder already"),
        (tmp_path / "nowhere", tmp_path / "x", "does not exist or is not a folder"),
        (run_dir, exported, "already exists"),
        (run_dir, tmp_path / "y", "--dtype 'int8': choose keep, bf16, fp16, fp32"),
    ]:
        with pytest.raises(UserError, match=message) as error:
            export_hf(source, out, dtype="int8" if out.name == "y" else "keep")
        assert "\n" not in str(error.value)
    assert not (tmp_path / "again").exists() and not (tmp_path / "y").exists()


def test_a_run_without_a_tokenizer_exports_the_weights_and_says_so(tmp_path):
    synthetic = train_quietly([*TINY, "--train.max_steps", "1"], tmp_path / "run")
    export_hf(synthetic, tmp_path / "hf")
    assert {p.name for p in (tmp_path / "hf").iterdir()} == {"config.json", "model.safetensors"}
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert config["eos_token_id"] is None and config["bos_token_id"] is None  # not transformers' default 1 and 2
    with pytest.raises(UserError, match="already exists"):
        export_hf(synthetic, tmp_path / "hf")
