"""`dlx tokenizer extend`: old ids and special tokens stay, new ids follow the last one, text that gets no new token
encodes exactly as before, Chinese text takes fewer tokens; bad input is one line and exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from cpt_helpers import TOP_SPECIALS, base_tokenizer, chinese_text, english_texts
from dlx.data.tokenizer_extend import extend_tokenizer
from dlx.data.tokenizer_identity import describe_extension_problem, is_extension, read_identity
from dlx.errors import UserError
from train_helpers import run_cli


@pytest.fixture(scope="module")
def extended(tmp_path_factory) -> tuple[Path, Path, Path]:
    root = tmp_path_factory.mktemp("extend")
    base = base_tokenizer(root / "base" / "tokenizer.json")
    (root / "corpus").mkdir()
    (root / "corpus" / "zh.txt").write_text(chinese_text(2000, seed=0), encoding="utf-8")
    extend_tokenizer(base, [str(root / "corpus")], 200, root / "out", sample_chars=10**7)
    return base, root / "out" / "tokenizer.json", root


def test_every_old_token_and_special_token_keeps_its_id(extended):
    base_path, ext_path, _ = extended
    base, ext = Tokenizer.from_file(str(base_path)), Tokenizer.from_file(str(ext_path))
    old, new = base.get_vocab(with_added_tokens=True), ext.get_vocab(with_added_tokens=True)
    assert {token: new[token] for token in old} == old
    assert [ext.token_to_id(s) for s in TOP_SPECIALS] == [400, 401]  # the specials at the top stay there
    assert sorted(set(new.values()) - set(old.values())) == list(range(402, 602))  # after the last existing id
    base_json, ext_json = json.loads(base_path.read_text()), json.loads(ext_path.read_text())
    assert ext_json["model"]["merges"][: len(base_json["model"]["merges"])] == base_json["model"]["merges"]
    assert is_extension(read_identity(base_path), read_identity(ext_path))
    assert describe_extension_problem(read_identity(ext_path), read_identity(base_path)) is not None


def test_text_without_new_tokens_encodes_exactly_as_before(extended):
    base_path, ext_path, _ = extended
    base, ext = Tokenizer.from_file(str(base_path)), Tokenizer.from_file(str(ext_path))
    for text in english_texts():
        assert ext.encode(text).ids == base.encode(text).ids
    words = [w for w, _ in base.pre_tokenizer.pre_tokenize_str(chinese_text(300, seed=1) + " mixed text, 2024")]
    kept = 0
    for word in words:  # word by word: wherever no new id appears, the base's ids
        ids = [t.id for t in ext.model.tokenize(word)]
        if max(ids) < 402:
            kept += 1
            assert ids == [t.id for t in base.model.tokenize(word)]
    assert kept > 0


def test_chinese_text_takes_fewer_tokens_and_decodes_back(extended):
    base_path, ext_path, _ = extended
    base, ext = Tokenizer.from_file(str(base_path)), Tokenizer.from_file(str(ext_path))
    held_out = chinese_text(300, seed=1)
    before, after = len(base.encode(held_out).ids), len(ext.encode(held_out).ids)
    assert after < before / 2, (before, after)
    assert ext.decode(ext.encode(held_out).ids) == held_out


def test_the_command_prints_density_before_and_after(extended, tmp_path):
    base_path, _, root = extended
    args = ["tokenizer", "extend", str(base_path), str(root / "corpus"), "--add", "20", "--out", "o"]
    result = run_cli(args, tmp_path)
    assert result.returncode == 0, result.stderr
    assert "added 20 tokens (ids 402-421) to 402" in result.stdout
    assert "chars/token" in result.stdout and "bytes/token" in result.stdout
    assert json.loads((tmp_path / "o" / "tokenizer.json").read_text())["model"]["vocab"]


def _not_byte_level(path: Path) -> Path:
    from tokenizers import models, pre_tokenizers

    tokenizer = Tokenizer(models.BPE(vocab={"a": 0, "b": 1, "ab": 2}, merges=[("a", "b")]))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.save(str(path))
    return path


def test_bad_input_is_one_line_and_exit_2(extended, tmp_path):
    base_path, _, root = extended
    corpus = str(root / "corpus")
    cases = {
        "not byte-level": ([str(_not_byte_level(tmp_path / "ws.json")), corpus, "--add", "5"], "byte-level BPE"),
        "--add 0": ([str(base_path), corpus, "--add", "0"], "--add 0: give the number of new tokens"),
        "no base": ([str(tmp_path / "nothing.json"), corpus, "--add", "5"], "does not exist"),
        "no corpus": ([str(base_path), str(tmp_path / "missing"), "--add", "5"], "missing"),
    }
    for name, (args, expected) in cases.items():
        result = run_cli(["tokenizer", "extend", *args, "--out", "o"], tmp_path)
        assert result.returncode == 2, (name, result.stderr)
        assert expected in result.stderr and len(result.stderr.strip().splitlines()) == 1, (name, result.stderr)
        assert not (tmp_path / "o").exists()


def test_an_existing_output_folder_is_refused(extended):
    base_path, _, root = extended
    with pytest.raises(UserError, match="already exists"):
        extend_tokenizer(base_path, [str(root / "corpus")], 5, root / "out", 1000)
