"""J2, the seed-001 path: continue a Hugging Face Llama whose tokenizer follows Llama 3's conventions (its special
tokens, `<|begin_of_text|>` put before every text by its post-processor) → `dlx prepare` with that tokenizer →
`dlx pretrain` from the weights (`model.init_from`) → `dlx export-hf` → transformers loads the export and generates
what `dlx generate` does. The HF folder is the one thing made by hand here (a user downloads it; no dlx command makes
it): transformers writes it with `save_pretrained`."""

from __future__ import annotations

import json

import pytest

from journey_helpers import User, stdlib_documents, write_jsonl

pytestmark = pytest.mark.journey
BOS, EOS = "<|begin_of_text|>", "<|end_of_text|>"


def write_llama3_style_model(folder, texts: list[str]) -> int:
    """A byte-level BPE with Llama 3's special tokens and BOS post-processor, and a random LlamaForCausalLM of its
    vocabulary, both saved by transformers as a downloaded model folder holds them; returns the vocabulary size."""
    import torch
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=480, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(texts, trainer)
    tokenizer.add_special_tokens([BOS, EOS])
    bos = tokenizer.token_to_id(BOS)
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, bos)]
    )
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token=BOS, eos_token=EOS)
    fast.save_pretrained(folder)
    vocab = tokenizer.get_vocab_size()
    config = transformers.LlamaConfig(
        vocab_size=vocab, hidden_size=64, intermediate_size=192, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256, bos_token_id=bos, eos_token_id=tokenizer.token_to_id(EOS),
    )  # fmt: skip
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).save_pretrained(folder)
    return vocab


def test_a_llama3_style_model_continued_and_exported_runs_in_transformers(tmp_path):
    user = User(tmp_path / "user")
    documents = stdlib_documents(60)
    write_llama3_style_model(user.home / "base", [d["text"] for d in documents])
    write_jsonl(user.home / "corpus" / "part-0.jsonl", documents)

    user.dlx("prepare", "corpus", "--tokenizer", "base", "--out", "data", "--no-progress")
    manifest = json.loads((user.home / "data" / "manifest.json").read_text())
    base_config = json.loads((user.home / "base" / "config.json").read_text())
    assert (manifest["bos_id"], manifest["eos_id"]) == (base_config["bos_token_id"], base_config["eos_token_id"])

    run = ["--model.init_from", "base", "--data.path", "data", "--data.seq_len", "64", "--data.micro_batch_size", "4"]
    run += ["--train.max_steps", "6", "--train.precision", "fp32", "--log.every", "1", "--log.progress", "false"]
    trained = user.dlx("pretrain", *run, "--run-dir", "run")
    assert "initial weights: base" in trained.stdout
    assert f"bos: {BOS} (id {manifest['bos_id']}) before every document" in trained.stdout
    exported = user.dlx("export-hf", "run", "hf")
    assert "checkpoint step 6" in exported.stdout
    config = json.loads((user.home / "hf" / "config.json").read_text())
    assert (config["bos_token_id"], config["eos_token_id"]) == (manifest["bos_id"], manifest["eos_id"])

    prompt = "def main():\n"
    ours = user.dlx("generate", "run", "--prompt", prompt, "--max-new-tokens", "10", "--temperature", "0").stdout
    theirs = user.python(
        "from transformers import AutoModelForCausalLM, AutoTokenizer\n"
        "tok = AutoTokenizer.from_pretrained('hf'); model = AutoModelForCausalLM.from_pretrained('hf')\n"
        f"ids = tok({prompt!r}, return_tensors='pt').input_ids\n"
        f"assert ids[0, 0].item() == {manifest['bos_id']}, ids  # the export's tokenizer starts texts with BOS\n"
        "out = model.generate(ids, max_new_tokens=10, do_sample=False)\n"
        "print(tok.decode(out[0], skip_special_tokens=True))\n"
    )
    assert theirs.strip() == ours.strip()
