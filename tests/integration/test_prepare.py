"""`dlx prepare`, `dlx data info`, `dlx data verify` as a user runs them, and prepare_dataset's guarantees."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dlx.data.prepare import encode, load_tokenizer, prepare_dataset
from dlx.data.prepare.inputs import InputList, stdlib_folder
from dlx.data.prepare.units import plan_units
from dlx.data.shards import read_manifest, verify_shards
from prepare_helpers import (
    all_documents,
    assert_one_line_error,
    decoded_documents,
    dlx,
    folder_bytes,
    llama3_like_tokenizer,
    make_documents,
    read_documents,
    tiny_tokenizer,
    write_jsonl,
)

__all__ = ["llama3_like_tokenizer", "tiny_tokenizer"]


def test_cli_prepare_info_and_verify_catches_one_flipped_byte(tmp_path, tiny_tokenizer):
    docs = make_documents(200, seed=10)
    write_jsonl(tmp_path / "a.jsonl", docs)
    out = tmp_path / "out"
    result = dlx(
        "prepare",
        str(tmp_path / "a.jsonl"),
        "--out",
        str(out),
        "--tokenizer",
        str(tiny_tokenizer),
        "--shard-tokens",
        "4000",
        "--val-documents",
        "3",
        "--workers",
        "2",
    )
    assert result.returncode == 0, result.stderr
    info = json.loads(dlx("data", "info", str(out), "--json").stdout)
    assert {"tokens", "documents", "shards", "dtype", "tokenizer_sha256"} <= info.keys()
    assert info["documents"] == 200 and info["dtype"] == "uint16" and info["splits"]["val"]["documents"] == 3
    assert info["tokens"] == sum(s.tokens for s in read_manifest(out).shards) and info["shards"] >= 3
    assert dlx("data", "verify", str(out)).returncode == 0
    assert sorted(all_documents(out)) == sorted(docs)

    shard = out / "train-00001.bin"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x01
    shard.write_bytes(bytes(data))
    result = dlx("data", "verify", str(out))
    assert result.returncode == 1
    assert "train-00001.bin" in result.stderr and "checksum" in result.stderr
    assert "train-00000.bin" not in result.stderr


def _bad_cases(tmp_path, tiny_tokenizer):
    write_jsonl(tmp_path / "ok.jsonl", ["a document"] * 3)
    (tmp_path / "bad.jsonl").write_text('{"text": "fine"}\n{"text": oops}\n')
    (tmp_path / "not-a-tokenizer.json").write_text('{"hello": 1}')
    ok, tok = str(tmp_path / "ok.jsonl"), str(tiny_tokenizer)
    return {
        "missing input": (["prepare", str(tmp_path / "nope.jsonl"), "--tokenizer", tok], "nope.jsonl"),
        "strict": (["prepare", str(tmp_path / "bad.jsonl"), "--tokenizer", tok, "--strict"], "bad.jsonl:2"),
        "missing tokenizer": (["prepare", ok, "--tokenizer", str(tmp_path / "none.json")], "none.json"),
        "not a tokenizer": (["prepare", ok, "--tokenizer", str(tmp_path / "not-a-tokenizer.json")], "tokenizer.json"),
        "no tokenizer": (["prepare", ok], "--train-tokenizer"),
        "both val options": (
            ["prepare", ok, "--tokenizer", tok, "--val-fraction", ".1", "--val-documents", "1"],
            "both",
        ),
        "bad fraction": (["prepare", ok, "--tokenizer", tok, "--val-fraction", "1.5"], "--val-fraction"),
        "all val": (["prepare", ok, "--tokenizer", tok, "--val-documents", "3"], "no training data"),
        "nothing to read": (
            ["prepare", str(tmp_path / "bad.jsonl"), "--tokenizer", tok, "--text-field", "x"],
            "no doc",
        ),
    }


@pytest.mark.parametrize(
    "case",
    [
        "missing input",
        "strict",
        "missing tokenizer",
        "not a tokenizer",
        "no tokenizer",
        "both val options",
        "bad fraction",
        "all val",
        "nothing to read",
    ],
)
def test_bad_input_is_one_line_exit_2_and_writes_nothing(tmp_path, tiny_tokenizer, case):
    args, needle = _bad_cases(tmp_path, tiny_tokenizer)[case]
    out = tmp_path / "out"
    assert_one_line_error(dlx(*args, "--out", str(out), "--workers", "1"), needle)
    assert not out.exists()


def test_out_folder_of_another_tokenizer_or_other_inputs_is_refused_untouched(
    tmp_path, tiny_tokenizer, llama3_like_tokenizer
):
    write_jsonl(tmp_path / "a.jsonl", make_documents(30, seed=11))
    write_jsonl(tmp_path / "b.jsonl", make_documents(30, seed=12))
    out = tmp_path / "out"
    prepare_dataset([str(tmp_path / "a.jsonl")], out, tokenizer=tiny_tokenizer, workers=1, progress=False)
    before = folder_bytes(out)
    base = [str(tmp_path / "a.jsonl"), "--out", str(out), "--workers", "1"]
    assert_one_line_error(dlx("prepare", *base, "--tokenizer", str(llama3_like_tokenizer)), "another tokenizer")
    assert_one_line_error(dlx("prepare", *base, "--train-tokenizer", "300"), "another tokenizer")
    assert_one_line_error(dlx("prepare", *base, "--tokenizer", str(tiny_tokenizer), "--bos"), "add_bos")
    other = ["prepare", str(tmp_path / "b.jsonl"), "--out", str(out), "--tokenizer", str(tiny_tokenizer)]
    assert_one_line_error(dlx(*other), "other inputs")
    assert folder_bytes(out) == before
    (tmp_path / "foreign").mkdir()
    (tmp_path / "foreign" / "notes.txt").write_text("mine")
    foreign = [
        "prepare",
        str(tmp_path / "a.jsonl"),
        "--out",
        str(tmp_path / "foreign"),
        "--tokenizer",
        str(tiny_tokenizer),
    ]
    assert_one_line_error(dlx(*foreign), "not a dlx dataset")


def test_llama3_sized_vocabulary_uses_uint32_and_bos(tmp_path, llama3_like_tokenizer):
    docs = make_documents(40, seed=13)
    write_jsonl(tmp_path / "a.jsonl", docs)
    out = tmp_path / "out"
    m = prepare_dataset(
        [str(tmp_path / "a.jsonl")],
        out,
        tokenizer=llama3_like_tokenizer,
        add_bos=True,
        val_fraction=0.0,
        workers=1,
        progress=False,
    )
    assert (m.dtype, m.vocab_size, m.bos_id, m.eos_id) == ("uint32", 128256, 128000, 128001)
    assert (out / "train-00000.bin").stat().st_size == 4 * m.shards[0].tokens
    ids = read_documents(out)
    assert all(doc[0] == 128000 and 128000 not in doc[1:] for doc in ids)
    tok = load_tokenizer(out)
    assert [tok.decode(doc[1:]) for doc in ids] == docs


def test_validation_split_is_deterministic_by_content(tmp_path, tiny_tokenizer):
    docs = make_documents(300, seed=14)
    docs += docs[:50]  # exact duplicates must land in the same split
    write_jsonl(tmp_path / "a.jsonl", docs)
    common = dict(tokenizer=tiny_tokenizer, workers=1, progress=False)
    m = prepare_dataset([str(tmp_path / "a.jsonl")], tmp_path / "f", val_fraction=0.1, **common)
    val, train = decoded_documents(tmp_path / "f", "val"), decoded_documents(tmp_path / "f", "train")
    assert not set(val) & set(train) and 10 < len(val) < 70
    assert m.split_documents("val") == len(val)
    prepare_dataset([str(tmp_path / "a.jsonl")], tmp_path / "n", val_documents=17, **common)
    assert len(decoded_documents(tmp_path / "n", "val")) == 17
    write_jsonl(tmp_path / "small.jsonl", docs[:3])
    m = prepare_dataset([str(tmp_path / "small.jsonl")], tmp_path / "s", **common)  # default fraction: still one
    assert m.split_documents("val") == 1


def test_trained_tokenizer_is_saved_deterministic_and_round_trips(tmp_path):
    docs = make_documents(150, seed=15)
    write_jsonl(tmp_path / "a.jsonl", docs)
    kwargs = dict(train_tokenizer=300, workers=1, progress=False, shard_tokens=5000)
    prepare_dataset([str(tmp_path / "a.jsonl")], tmp_path / "one", **kwargs)
    prepare_dataset([str(tmp_path / "a.jsonl")], tmp_path / "two", **kwargs)
    assert folder_bytes(tmp_path / "one") == folder_bytes(tmp_path / "two")
    assert load_tokenizer(tmp_path / "one").get_vocab_size() == 300
    assert sorted(all_documents(tmp_path / "one")) == sorted(docs)


def test_crash_between_shard_and_manifest_resumes_from_the_last_commit(tmp_path, tiny_tokenizer, monkeypatch):
    write_jsonl(tmp_path / "a.jsonl", make_documents(1200, seed=16))
    args = dict(tokenizer=tiny_tokenizer, shard_tokens=2500, workers=1, progress=False)
    clean = prepare_dataset([str(tmp_path / "a.jsonl")], tmp_path / "clean", **args)
    assert "resume" not in clean.source  # the resume state is dropped once complete
    real_commit, real_encode, calls = encode._commit, encode.encode_unit, {"commit": 0, "encode": 0}

    def crashing_commit(*a, **k):
        calls["commit"] += 1
        if calls["commit"] == 4:  # after its shards were renamed into place, before the manifest lists them
            raise KeyboardInterrupt
        return real_commit(*a, **k)

    def counting_encode(unit):
        calls["encode"] += 1
        return real_encode(unit)

    monkeypatch.setattr(encode, "_commit", crashing_commit)
    monkeypatch.setattr(encode, "encode_unit", counting_encode)
    with pytest.raises(KeyboardInterrupt):
        prepare_dataset([str(tmp_path / "a.jsonl")], tmp_path / "out", **args)
    resume = read_manifest(tmp_path / "out").source["resume"]
    n_units = len(list(plan_units(InputList((str(tmp_path / "a.jsonl"),)).measure(), resume["unit_bytes"])))
    assert 0 < resume["next_unit"] < calls["encode"] < n_units
    calls["encode"] = 0
    monkeypatch.setattr(encode, "_commit", real_commit)
    prepare_dataset([str(tmp_path / "a.jsonl")], tmp_path / "out", **args)
    assert calls["encode"] == n_units - resume["next_unit"]
    assert folder_bytes(tmp_path / "out") == folder_bytes(tmp_path / "clean")
    assert verify_shards(tmp_path / "out") == []


def test_stdlib_corpus_is_the_interpreters_own_sources(tmp_path, tiny_tokenizer):
    files = list(InputList(corpus="stdlib").measure())
    root = str(stdlib_folder())
    rel = [f.path[len(root) + 1 :] for f in files]
    assert len(files) > 300 and all(r.endswith(".py") for r in rel)
    assert not any(r.startswith(("test/", "site-packages/")) for r in rel)
    assert "os.py" in rel and "json/decoder.py" in rel
    m = prepare_dataset(None, tmp_path / "out", corpus="stdlib", tokenizer=tiny_tokenizer, workers=2, progress=False)
    assert m.complete and m.split_documents("val") > 0 and m.source["scan"]["bad_records"] == 0
    val = set(decoded_documents(tmp_path / "out", "val"))
    texts = [t for f in files[:60] if (t := Path(f.path).read_bytes().decode()) and t not in val]
    tok = load_tokenizer(tmp_path / "out")
    assert [tok.decode(ids) for ids in read_documents(tmp_path / "out")[: len(texts)]] == texts
