"""Llama 3's 128,256-token vocabulary end to end: prepare (uint32 shards) → init_from → train → export → transformers.
The tokenizer is built here (128,000 words and Llama 3's 256 special tokens, ids as in Llama 3), the model is tiny but
for its vocabulary (dim 64, 2 layers: 16.4M of its 16.5M parameters are embedding and output projection)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from dlx.cli.model_commands import export_hf
from dlx.data.shards import read_manifest
from dlx.train.build.data import build_train_loader
from dlx.train.launch import launch
from dlx.train.recipe import load_recipe
from hf_helpers import BASE, next_token_loss, write_hf_llama
from train_helpers import losses, run_cli

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("in_process_training")
VOCAB, WORDS = 128_256, 128_000
SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", *(f"<|reserved_special_token_{i}|>" for i in range(254))]


def llama3_sized_tokenizer(path: Path) -> None:
    """Word-level: `w0` … `w127999` are ids 0 … 127,999, then the special tokens at 128,000 … 128,255."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    tokenizer = Tokenizer(models.WordLevel({f"w{i}": i for i in range(WORDS)}, unk_token="w0"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.add_special_tokens(SPECIALS)
    assert tokenizer.get_vocab_size() == VOCAB and tokenizer.token_to_id("<|end_of_text|>") == 128_001
    tokenizer.save(str(path))


def documents(count: int = 60, words: int = 80) -> list[str]:
    """Text whose ids are mostly above 65,535 (uint16 could not hold them)."""
    rng = random.Random(0)
    return [" ".join(f"w{rng.randrange(1_000, WORDS)}" for _ in range(words)) for _ in range(count)]


def test_a_llama3_sized_vocabulary_goes_through_prepare_init_from_train_and_export(tmp_path):
    llama3_sized_tokenizer(tmp_path / "tokenizer.json")
    with open(tmp_path / "corpus.jsonl", "w") as f:
        f.writelines(json.dumps({"text": text}) + "\n" for text in documents())
    command = ["prepare", "corpus.jsonl", "--tokenizer", "tokenizer.json", "--val-documents", "0", "--out", "data"]
    prepared = run_cli(command, tmp_path)
    assert prepared.returncode == 0, prepared.stderr
    manifest = read_manifest(tmp_path / "data")
    assert (manifest.dtype, manifest.vocab_size, manifest.eos_id) == ("uint32", VOCAB, 128_001)

    hf_dir = tmp_path / "llama"
    write_hf_llama(hf_dir, VOCAB, tokenizer=tmp_path / "tokenizer.json", eos_token="<|end_of_text|>")
    options = [*BASE, "--model.init_from", str(hf_dir), "--data.path", str(tmp_path / "data")]
    options += ["--data.num_workers", "0", "--train.max_steps", "3"]
    config = load_recipe(None, options)
    assert config.model.args.vocab_size == VOCAB
    with build_train_loader(config, torch.device("cpu")) as loader:
        inputs, targets = next(loader)
    assert inputs.max().item() > 65_535
    hf = transformers.LlamaForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        expected = next_token_loss(hf(inputs).logits, targets)
    run_dir = tmp_path / "run"
    assert launch(None, options, run_dir, resume=False) == 0
    assert abs(losses(run_dir)[1] - expected) < 1e-5

    export_hf(run_dir, tmp_path / "exported")
    tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path / "exported")
    shard = np.fromfile(tmp_path / "data" / "train-00000.bin", dtype="<u4")
    first = shard[: int(np.argmax(shard == manifest.eos_id))].tolist()
    assert tokenizer(documents()[0], add_special_tokens=False).input_ids == first
    assert tokenizer.eos_token_id == 128_001 and len(tokenizer) == VOCAB
    exported = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "exported", dtype=torch.float32).eval()
    assert exported.config.vocab_size == VOCAB and exported.config.eos_token_id == 128_001
    with torch.no_grad():
        trained_loss = next_token_loss(exported(inputs).logits, targets)
    assert trained_loss < expected  # three steps on these batches lowered the loss, and the export carries it
