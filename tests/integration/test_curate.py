"""Curation inside `dlx prepare`: planted exact and near duplicates (code with renamed identifiers and reformatting,
Chinese with small edits), PII and task documents are removed or redacted and counted; the kept documents are the
same for any task count and after a crash."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from dlx.data.curate.decontam import build_index
from dlx.data.curate.dedup import find_duplicates
from dlx.data.curate.pii import prc_id_valid, redact
from dlx.data.curate.quality import failed_rule, load_rules
from dlx.data.curate.report import decontamination_note
from dlx.data.curate.spec import build_spec
from dlx.data.curate.stages import Curator
from dlx.data.curate.text import code_tokens
from dlx.data.prepare import encode, merge_tasks, prepare_dataset, prepare_task, tasks
from dlx.data.prepare.curation import REMOVED_FILE, REPORT_FILE
from dlx.errors import UserError
from prepare_helpers import assert_one_line_error, dlx, tiny_tokenizer, write_jsonl

__all__ = ["tiny_tokenizer"]

HAN = "的一是在不了有和人这中大为上个国我以要他时来用们生到作地于出就分对成会可也你说年"
CODE = """#include <cstdio>
int main() {
    int total = 0;
    for (int index = 0; index < 10; index++) {
        total += index * index;
    }
    printf("%d\\n", total);
    return 0;
}
"""
CODE_RENAMED = """#include <cstdio>
int main(){ int s=0;
  for(int k=0;k<10;k++){ s+=k*k; }
  printf("%d\\n",s); return 0; }
"""
TASK_DOC = "the quick brown fox jumps over the lazy dog near the quiet river bank every single morning at dawn"


def english(rng: random.Random, vocab: list[str]) -> str:
    return " ".join(rng.choice(vocab) for _ in range(rng.randint(40, 90))).capitalize() + "."


def chinese(rng: random.Random, n: int) -> str:
    return "".join(rng.choice(HAN) for _ in range(n)) + "。"


def edited(text: str, rng: random.Random, edits: int) -> str:
    chars = list(text)
    for _ in range(edits):
        chars[rng.randrange(len(chars) - 1)] = rng.choice(HAN)
    return "".join(chars)


def planted_corpus(root: Path) -> tuple[list[str], dict]:
    """Three jsonl files (several units each) with planted duplicates, PII and a leaked task document."""
    rng = random.Random(5)
    vocab = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 9))) for _ in range(800)]
    base = [english(rng, vocab) for _ in range(600)]
    zh = [chinese(rng, 300) for _ in range(40)]
    docs = base[:300] + zh[:20] + [CODE]
    docs += [base[7].replace(" ", "  "), edited(zh[3], rng, 3), CODE_RENAMED]  # exact, near (zh), near (code)
    pii = "身份证11010519491231002X，手机13812345678，邮箱 li.lei@example.com，内网 10.0.0.1，外网 202.96.128.86。"
    docs += [pii + zh[30]]
    docs += ["Leaked: " + TASK_DOC + " and more words after it to make it long enough."]
    docs += base[300:] + zh[20:30]
    paths = [write_jsonl(root / f"part{i}.jsonl", docs[i::3]) for i in range(3)]
    return [str(p) for p in paths], {"zh": zh}


@pytest.fixture
def corpus(tmp_path) -> list[str]:
    (tmp_path / "in").mkdir()
    return planted_corpus(tmp_path / "in")[0]


def curated(**options) -> dict:
    spec = build_spec(
        dedup="near", quality=None, pii="redact", task_texts={"leak": [TASK_DOC]}, sources=[("corpus", "/")]
    )
    return dict(curate=spec, **options)


def test_pii_redaction_counts_each_kind_and_checks_the_id_checksum():
    assert prc_id_valid("11010519491231002X") and not prc_id_valid("110105194912310021")
    counts: dict = {}
    from collections import Counter

    counts = Counter()
    text = redact(
        "身份证11010519491231002X 假的110105194912310021 电话13812345678 +44 20 7946 0958 a@b.cn 1.2.3.4", counts
    )
    assert "<ID>" in text and "110105194912310021" in text and "<EMAIL>" in text and "<IP>" in text
    assert counts == {"prc_id": 1, "phone": 2, "email": 1, "ip": 1}


def test_near_duplicates_found_for_edited_chinese_and_renamed_code():
    rng = random.Random(1)
    zh = chinese(rng, 300)
    texts = [zh, CODE, "an unrelated english text " * 5, edited(zh, rng, 3), CODE_RENAMED, "  " + zh + "\n"]
    curator = Curator(build_spec(dedup="near"), signatures=True)
    for i, t in enumerate(texts):
        curator.sign(0, i, t, i, "x")
    reason, clusters, _ = find_duplicates(curator.take_signatures(), near=True)
    assert reason.tolist() == [0, 0, 0, 2, 2, 1]
    assert clusters == {"2": 2}


def test_code_shingles_blind_identifiers_and_layout_but_keep_literals_and_operators():
    assert code_tokens("s+=k*k;") == code_tokens("total += index * index ;") == ["I", "+", "=", "I", "*", "I", ";"]
    assert code_tokens('printf("%d", 10);') == ["printf", "(", '"%d"', ",", "10", ")", ";"]
    assert code_tokens("x = y % 7;") != code_tokens("x = y % 9;") != code_tokens("x = y / 9;")


def table_program(constants: list[int]) -> str:
    body = "".join(f"    t[{i}] = (t[{i - 1}] * {c} + {c + 1}) % 1000000007;\n" for i, c in enumerate(constants, 1))
    return "#include <cstdio>\nlong long t[64];\nint main() {\n    t[0] = 1;\n" + body + "    return 0;\n}\n"


def test_programs_that_differ_in_their_literals_are_not_near_duplicates():
    """Same statements with other constants compute something else: another program, not a copy, while the same
    program renamed and reformatted is one."""
    rng = random.Random(3)
    ours, other = table_program(rng.sample(range(10, 999), 20)), table_program(rng.sample(range(10, 999), 20))
    renamed = ours.replace("t[", "table[").replace(" = ", "=").replace("    ", "")
    curator = Curator(build_spec(dedup="near"), signatures=True)
    for i, t in enumerate([ours, other, renamed]):
        curator.sign(0, i, t, i, "x")
    reason, clusters, _ = find_duplicates(curator.take_signatures(), near=True)
    assert reason.tolist() == [0, 0, 2]
    assert clusters == {"2": 1}


def test_quality_rules_are_cjk_and_code_aware_and_yaml_is_checked(tmp_path):
    rules = load_rules(None)
    assert failed_rule(chinese(random.Random(2), 30), "prose", rules) is None  # 30 characters, width 61: enough
    assert failed_rule("too short", "prose", rules) == ("prose.min_width", 9)
    assert failed_rule("// auto-generated, do not edit\nint x;\nint y;\n", "code", rules) == ("code.generated", 1)
    bad = tmp_path / "r.yaml"
    bad.write_text("prose:\n  max_symbol_share: 3\n")
    with pytest.raises(UserError, match="is a share"):
        load_rules(str(bad))
    bad.write_text("prose:\n  nonsense: 1\n")
    with pytest.raises(UserError, match="unknown prose rule"):
        load_rules(str(bad))


def test_decontamination_matches_chinese_by_characters():
    zh = chinese(random.Random(4), 40)
    index = build_index({"a": ["short"], "b": [zh]}, 13)
    assert index.short == (1, 0)
    assert index.match("前文" + zh[5:25] + "后文") == "b" and index.match(chinese(random.Random(9), 40)) is None


def test_bad_curation_options_are_user_errors():
    for kwargs, needle in (
        (dict(dedup="fuzzy"), "--dedup"),
        (dict(languages=["xx"]), "--languages"),
        (dict(bands=0), "--near-bands"),
        (dict(pii="mask"), "--pii"),
    ):
        with pytest.raises(UserError, match=needle):
            build_spec(**kwargs)


def test_curated_prepare_is_identical_across_task_counts_and_crashes(tmp_path, corpus, tiny_tokenizer, monkeypatch):
    options = curated(tokenizer=tiny_tokenizer, shard_tokens=20_000, val_fraction=0.05)
    one = prepare_dataset(corpus, tmp_path / "one", workers=1, progress=False, **options)
    cur = one.source["scan"]["curation"]["sources"]["corpus"]
    assert cur["removed"]["exact_duplicate"][0] == 1 and cur["removed"]["near_duplicate"][0] == 2
    assert cur["removed"]["decontaminated.leak"][0] == 1
    assert cur["redacted"] == {"prc_id": 1, "phone": 1, "email": 1, "ip": 1}
    assert one.source["scan"]["documents"] == cur["in"][0] - 4
    assert one.summary()["documents"] == one.source["scan"]["documents"]
    assert "near_duplicate" in (tmp_path / "one" / REPORT_FILE).read_text()
    monkeypatch.setattr(encode, "COMMIT_SECONDS", 0.0)
    monkeypatch.setattr(tasks, "COMMIT_SECONDS", 0.0)
    crash_at(monkeypatch, encode, "_commit", 3)
    with pytest.raises(KeyboardInterrupt):
        prepare_dataset(corpus, tmp_path / "crashed", workers=1, progress=False, **options)
    assert not json.loads((tmp_path / "crashed" / "manifest.json").read_text())["complete"]
    crash_at(monkeypatch, tasks, "write_state", 2)
    with pytest.raises(KeyboardInterrupt):
        prepare_task(corpus, tmp_path / "t2", tasks=2, task_index=1, workers=1, progress=False, **options)
    monkeypatch.undo()
    outs = [tmp_path / "crashed", tmp_path / "t2", tmp_path / "t3"]
    prepare_dataset(corpus, outs[0], workers=1, progress=False, **options)
    for out, n in zip(outs[1:], (2, 3), strict=True):
        for i in reversed(range(n)):
            prepare_task(corpus, out, tasks=n, task_index=i, workers=1, progress=False, **options)
        assert merge_tasks(out, workers=1, progress=False) == one
    for out in outs:
        for name in (
            "manifest.json",
            REPORT_FILE,
            REMOVED_FILE,
            "train-00000.bin",
            "val-00000.bin",
            "curation-drops.npy",
        ):
            assert (out / name).read_bytes() == (tmp_path / "one" / name).read_bytes(), (out.name, name)


def crash_at(monkeypatch, module, name: str, call: int) -> None:
    """module.name raises KeyboardInterrupt on its `call`-th call (a kill between two commits)."""
    real, calls = getattr(module, name), [0]

    def crashing(*a, **k):
        calls[0] += 1
        if calls[0] == call:
            raise KeyboardInterrupt
        return real(*a, **k)

    monkeypatch.setattr(module, name, crashing)


def test_bad_curation_options_on_the_command_line_are_one_line_and_write_nothing(tmp_path, corpus, tiny_tokenizer):
    for flags, needle in ((["--dedup", "fuzzy"], "--dedup"), (["--languages", "zh,xx"], "'xx'")):
        out = tmp_path / "never"
        assert_one_line_error(
            dlx("prepare", *corpus, "--out", str(out), "--tokenizer", str(tiny_tokenizer), *flags), needle
        )
        assert not out.exists()


def test_a_run_names_the_tasks_its_data_was_not_decontaminated_against(tmp_path):
    request = {"curation": {"decontaminate": {"tasks": ["a"]}}}
    (tmp_path / "manifest.json").write_text(json.dumps({"source": {"request": request}}))
    assert decontamination_note(tmp_path, ["a"]) is None
    assert "b (their documents" in decontamination_note(tmp_path, ["a", "b"])
    assert decontamination_note(tmp_path / "none", ["a"]) is None


def test_dry_run_writes_only_the_report_and_the_audit_trail(tmp_path, corpus, tiny_tokenizer):
    out = tmp_path / "dry"
    assert (
        prepare_dataset(corpus, out, dry_run=True, progress=False, workers=1, **curated(tokenizer=tiny_tokenizer))
        is None
    )
    assert sorted(p.name for p in out.iterdir()) == [REMOVED_FILE, REPORT_FILE]
