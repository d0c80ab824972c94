"""The tiktoken fast path gives exactly Hugging Face's ids, and anything it cannot reproduce falls back to HF."""

from __future__ import annotations

import json

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from dlx.data.prepare import encoders, prepare_dataset
from dlx.data.prepare.encoders import PROBES, HFEncoder, TiktokenEncoder, choose_encoder
from prepare_helpers import decoded_documents, llama3_like_tokenizer, make_documents, tiny_tokenizer, write_jsonl

__all__ = ["llama3_like_tokenizer", "tiny_tokenizer"]


def _hf_reference(json_text: str, texts: list[str]) -> list[list[int]]:
    """The reference the fast path must equal: encode_batch, special-looking text encoded as text."""
    tok = Tokenizer.from_str(json_text)
    tok.encode_special_tokens = True
    return [e.ids for e in tok.encode_batch(texts, add_special_tokens=False)]


def test_fast_path_ids_equal_hf_on_every_document(tiny_tokenizer, llama3_like_tokenizer):
    texts = PROBES + make_documents(300, seed=20)
    for path in (tiny_tokenizer, llama3_like_tokenizer):
        json_text = path.read_text()
        assert choose_encoder(json_text, texts[:20])[0] == "tiktoken"
        assert TiktokenEncoder(json_text).encode(texts) == _hf_reference(json_text, texts)


def test_gpt2_style_byte_level_converts_too():
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=500,
        special_tokens=["<|endoftext|>"],
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(make_documents(200, seed=21), trainer)
    texts = PROBES + make_documents(100, seed=22)
    assert TiktokenEncoder(tok.to_str()).encode(texts) == _hf_reference(tok.to_str(), texts)


def test_unconvertible_tokenizer_falls_back_and_still_round_trips(tmp_path, tiny_tokenizer):
    tok = Tokenizer.from_file(str(tiny_tokenizer))
    tok.add_tokens(["the of"])  # a non-special added token is matched inside text: tiktoken cannot do that
    path = tmp_path / "tokenizer.json"
    path.write_text(tok.to_str())
    name, why = choose_encoder(path.read_text(), [])
    assert name == "huggingface" and "non-special added tokens" in why
    docs = make_documents(40, seed=23)
    write_jsonl(tmp_path / "a.jsonl", docs)
    prepare_dataset(
        [str(tmp_path / "a.jsonl")], tmp_path / "out", tokenizer=path, val_fraction=0.0, workers=1, progress=False
    )
    assert decoded_documents(tmp_path / "out") == docs


def test_any_difference_on_the_sample_falls_back(tiny_tokenizer, monkeypatch):
    real = TiktokenEncoder.encode
    monkeypatch.setattr(TiktokenEncoder, "encode", lambda self, texts: [ids[:-1] for ids in real(self, texts)])
    name, why = choose_encoder(tiny_tokenizer.read_text(), ["some text"])
    assert name == "huggingface" and "differ" in why


def test_conversion_refuses_what_it_cannot_reproduce(tiny_tokenizer):
    spec = json.loads(tiny_tokenizer.read_text())
    for change, reason in [
        (lambda s: s.update(normalizer={"type": "NFC"}), "normalizer"),
        (lambda s: s["model"].update(dropout=0.1), "dropout"),
        (lambda s: s["pre_tokenizer"]["pretokenizers"][1].update(add_prefix_space=True), "pre-tokenizer"),
        (lambda s: s["model"]["vocab"].pop("Ā"), "incomplete"),
    ]:
        broken = json.loads(json.dumps(spec))
        change(broken)
        try:
            encoders.tiktoken_encoding(broken)
        except encoders.NotConvertible as e:
            assert reason in str(e)
        else:
            raise AssertionError(f"converted a tokenizer with {reason}")
    assert HFEncoder(tiny_tokenizer.read_text()).encode(["<|end_of_text|>"])[0] != [1]
