"""Tokenizers compared by content: a re-saved tokenizer is the same one, another vocabulary or special token is not."""

from __future__ import annotations

import json

import pytest

from dlx.data.prepare.tokenizer import train_bpe
from dlx.data.tokenizer_identity import describe_difference, read_identity, same_tokenizer
from dlx.errors import UserError

TEXTS = ["def main():\n    return 1\n", "print('hello world')\n", "数据 加载 训练\n"] * 20


@pytest.fixture(scope="module")
def tokenizer_json(tmp_path_factory):
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    train_bpe(TEXTS, 300).save(str(path))
    return path


def test_resaved_with_other_layout_and_merge_form_is_the_same(tokenizer_json, tmp_path):
    data = json.loads(tokenizer_json.read_text())
    merges = data["model"]["merges"]
    data["model"]["merges"] = [m.split(" ") if isinstance(m, str) else " ".join(m) for m in merges]
    data["model"]["vocab"] = dict(reversed(list(data["model"]["vocab"].items())))
    data["truncation"] = None
    other = tmp_path / "tokenizer.json"
    other.write_text(json.dumps(data, indent=4, sort_keys=True))
    assert other.read_bytes() != tokenizer_json.read_bytes()
    assert same_tokenizer(tokenizer_json, tmp_path)  # a folder holding tokenizer.json is read too
    assert read_identity(other).fingerprint == read_identity(tokenizer_json).fingerprint


def test_other_vocabulary_merges_or_special_tokens_differ(tokenizer_json, tmp_path):
    base = read_identity(tokenizer_json)
    data = json.loads(tokenizer_json.read_text())
    first, second = list(data["model"]["vocab"])[:2]
    vocab = data["model"]["vocab"]
    vocab[first], vocab[second] = vocab[second], vocab[first]
    (tmp_path / "swapped.json").write_text(json.dumps(data))
    assert describe_difference(base, read_identity(tmp_path / "swapped.json")) == (
        "vocabulary of 300 vs 300 ids, same size, other ids"  # the 300 ids count the added tokens
    )
    data = json.loads(tokenizer_json.read_text())
    data["model"]["merges"] = data["model"]["merges"][:-1]
    (tmp_path / "merges.json").write_text(json.dumps(data))
    assert "merges" in describe_difference(base, read_identity(tmp_path / "merges.json"))
    data = json.loads(tokenizer_json.read_text())
    data["added_tokens"][0]["content"] = "<|other|>"
    (tmp_path / "special.json").write_text(json.dumps(data))
    assert describe_difference(base, read_identity(tmp_path / "special.json")).startswith("added tokens differ")
    assert base.vocab_size == 300


def test_unreadable_or_foreign_files_are_one_line(tmp_path):
    with pytest.raises(UserError, match="cannot read tokenizer"):
        read_identity(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text('{"vocab": {}}')
    with pytest.raises(UserError, match=r"is not a Hugging Face tokenizer\.json"):
        read_identity(tmp_path / "bad.json")


def test_the_same_bytes_are_the_same_tokenizer_without_parsing(tmp_path):
    a, b, c = (tmp_path / name for name in ("a.json", "b.json", "c.json"))
    a.write_text("{}")
    b.write_text("{}")
    c.write_text("{ }")
    assert same_tokenizer(a, b)  # a run folder's copy of a dataset's tokenizer.json, whatever it holds
    with pytest.raises(UserError, match=r"is not a Hugging Face tokenizer\.json"):
        same_tokenizer(a, c)
