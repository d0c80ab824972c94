"""`dlx prepare`'s curation as a user meets it: a rules file with a non-finite threshold or a key given twice is
refused in one line; a corpus that curation empties says so (not "no documents found"); declared kinds and PII scopes
reach the dataset; the tokenizer learns from the documents kept, not from the near copies deduplication removes."""

from __future__ import annotations

import json
import random

import pytest

from dlx.data.curate.spec import build_spec
from dlx.data.prepare import prepare_dataset
from prepare_helpers import assert_one_line_error, dlx, tiny_tokenizer, write_jsonl

__all__ = ["tiny_tokenizer"]

PROSE = [
    "The mailing list is the place to ask: say what you ran, what it printed and what you expected instead, "
    f"and the archive keeps the answer for the next person who searches for it (question {i})."
    for i in range(30)
]


@pytest.mark.parametrize(
    ("rules", "needles"),
    [
        ("prose:\n  min_width: .nan\n", ("prose.min_width", "finite")),
        ("code:\n  max_line_chars: .inf\n", ("code.max_line_chars", "finite")),
        ("prose:\n  min_width: 10\n  min_width: 20\n", ("'min_width' is given twice",)),
    ],
)
def test_a_rules_file_with_a_non_finite_threshold_or_a_key_twice_is_refused(tmp_path, tiny_tokenizer, rules, needles):
    corpus = write_jsonl(tmp_path / "c.jsonl", PROSE)
    (tmp_path / "rules.yaml").write_text(rules)
    out = tmp_path / "out"
    result = dlx(
        "prepare", str(corpus), "--out", str(out), "--tokenizer", str(tiny_tokenizer),
        "--quality", str(tmp_path / "rules.yaml"),
    )  # fmt: skip
    assert_one_line_error(result, "--quality", *needles)
    assert not out.exists()


def test_a_corpus_that_curation_empties_says_which_stages_removed_it(tmp_path, tiny_tokenizer):
    corpus = write_jsonl(tmp_path / "c.jsonl", ["too short"] * 3 + ["这是一段中文。" * 20] * 2)
    out = tmp_path / "out"
    result = dlx(
        "prepare", str(corpus), "--out", str(out), "--tokenizer", str(tiny_tokenizer),
        "--quality", "default", "--languages", "en",
    )  # fmt: skip
    assert_one_line_error(
        result,
        "curation removed all 5 documents of 1 input file(s) (quality.prose.min_width 3, language 2)",
        "--dry-run",
    )
    assert not out.exists()


def test_declared_kinds_and_pii_scopes_reach_the_dataset(tmp_path, tiny_tokenizer):
    """The Stack's records declare Python by `lang`; a folder declared code keeps its private address; a prose
    input's public address is redacted; the audit trail names the removed record by its id."""
    stack = tmp_path / "stack.jsonl"
    code = "import socket\n\nHOST = '8.8.8.8'  # public, but code: kept\nPORT = 53\nADMIN = 'ops@example.com'\n"
    records = [{"id": "py-1", "lang": "Python", "content": code}]
    records.append({"id": "py-2", "lang": "Python", "content": "x = 1\n" + "+-+-\n" * 40})  # alphanumeric share
    stack.write_text("".join(json.dumps(r) + "\n" for r in records))
    notes = tmp_path / "notes"
    notes.mkdir()
    write_jsonl(notes / "n.jsonl", [p + " Ask 202.96.128.86." for p in PROSE], field="content")
    out = tmp_path / "out"
    result = dlx(
        "prepare", str(stack), str(notes), "--out", str(out), "--tokenizer", str(tiny_tokenizer),
        "--text-field", "content", "--quality", "default", "--pii", "redact", "--kind", f"{notes}=prose",
        "--pii-kinds", "code=email", "--val-documents", "0", "--no-progress",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    curation = manifest["source"]["scan"]["curation"]["sources"]
    assert curation[str(stack)]["kinds"] == {"code (declared)": 2}
    assert curation[str(stack)]["redacted"] == {"email": 1}
    assert curation[str(notes)]["kinds"] == {"prose (declared)": 30}
    assert curation[str(notes)]["redacted"] == {"ip": 30}
    request = manifest["source"]["request"]["curation"]
    assert request["pii"]["kinds"]["code"] == ["email"] and request["kinds"] == {"inputs": {str(notes): "prose"}}
    [removed] = [json.loads(line) for line in (out / "curation-removed.jsonl").read_text().splitlines()]
    assert removed == {
        "file": str(stack),
        "line": 2,
        "id": "py-2",
        "reason": "quality.code.min_alnum_share",
        "measured": removed["measured"],
    }
    info = dlx("data", "info", str(out))
    assert "curation-removed.jsonl (1 documents, 1 with an id or url; quality.code.min_alnum_share 1)" in info.stdout


def test_the_tokenizer_learns_from_the_documents_curation_keeps(tmp_path):
    """A mirror banner carried only by near copies becomes a vocabulary string when the tokenizer is trained on the
    raw corpus, and none when it is trained on what deduplication keeps (the manifest says which)."""
    rng = random.Random(3)
    words = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(3, 8))) for _ in range(400)]
    originals = [" ".join(rng.choice(words) for _ in range(120)) + "." for _ in range(60)]
    copies = [f"zqxmirror zqxmirror copy {i}\n" + originals[i % 20] for i in range(40)]  # 20 copied twice
    corpus = write_jsonl(tmp_path / "c.jsonl", originals + copies)
    common = dict(train_tokenizer=1000, workers=1, progress=False, val_documents=0)
    raw = prepare_dataset([str(corpus)], tmp_path / "raw", curate=build_spec(languages=None), **common)
    curated = prepare_dataset([str(corpus)], tmp_path / "cur", curate=build_spec(dedup="near"), **common)
    vocab = {
        name: set(json.loads((tmp_path / name / "tokenizer.json").read_text())["model"]["vocab"])
        for name in ("raw", "cur")
    }
    banner = {token for token in vocab["raw"] if "zqx" in token}
    assert banner and not {token for token in vocab["cur"] if "zqx" in token}
    assert curated.source["request"]["tokenizer"] == {"train_vocab_size": 1000, "trained_on": "curated"}
    assert raw.source["request"]["tokenizer"] == {"train_vocab_size": 1000}
    assert curated.source["scan"]["curation"]["sources"]["corpus"]["removed"]["near_duplicate"][0] == 40
