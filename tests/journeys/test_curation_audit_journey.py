"""A user audits a curated dataset: `dlx prepare --dedup near --quality default` → `dlx data info --json` counts the
removed list → every line of curation-removed.jsonl leads back to its record in the input (by line or byte offset), a
record with the id the line names; a duplicate's `duplicate_of` leads to the kept record it copies, which the list does
not name."""

from __future__ import annotations

import difflib
import json
import random
from pathlib import Path

from prepare_helpers import dlx, tiny_tokenizer

__all__ = ["tiny_tokenizer"]


def corpus(root: Path) -> list[Path]:
    """Two JSON lines files of web-like records (id, url, text), with reposts (a word changed, a line added), exact
    copies and a few records too short to keep."""
    rng = random.Random(8)
    words = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 9))) for _ in range(900)]
    originals = [
        " ".join(rng.choice(words) for _ in range(rng.randint(80, 200))).capitalize() + "." for _ in range(240)
    ]
    records = [{"id": f"doc-{i}", "url": f"https://example.org/a/{i}", "text": t} for i, t in enumerate(originals)]
    for n in range(60):
        source = originals[rng.randrange(len(originals))].split(" ")
        source[rng.randrange(len(source))] = "changed"
        records.append(
            {"id": f"repost-{n}", "url": f"https://mirror.example.net/{n}", "text": "Repost\n" + " ".join(source)}
        )
    records += [{"id": f"copy-{n}", "text": originals[n]} for n in range(10)]
    records += [{"id": f"short-{n}", "url": f"https://example.org/s/{n}", "text": "Too short."} for n in range(5)]
    rng.shuffle(records)
    paths = [root / "part-0.jsonl", root / "part-1.jsonl"]
    for i, path in enumerate(paths):
        path.write_text("".join(json.dumps(r) + "\n" for r in records[i::2]))
    return paths


def record_at(place: dict) -> dict:
    """The input record an audit place points to."""
    with open(place["file"], "rb") as f:
        if "offset" in place:
            f.seek(place["offset"])
            return json.loads(f.readline())
        return json.loads(f.read().splitlines()[place["line"] - 1])


def test_every_removal_leads_back_to_its_record(tmp_path, tiny_tokenizer):
    (tmp_path / "in").mkdir()
    inputs = corpus(tmp_path / "in")
    out = tmp_path / "curated"
    prepared = dlx(
        "prepare", *map(str, inputs), "--out", str(out), "--tokenizer", str(tiny_tokenizer), "--dedup", "near",
        "--quality", "default", "--no-progress",
    )  # fmt: skip
    assert prepared.returncode == 0, prepared.stderr
    info = json.loads(dlx("data", "info", str(out), "--json").stdout)
    removed_total = info["curation"]["total"]["removed"][0]
    listed = info["curation"]["removed_file"]
    assert listed["documents"] == removed_total == 75  # 60 reposts, 10 copies, 5 too short
    assert listed["reasons"] == {"exact_duplicate": 10, "near_duplicate": 60, "quality.prose.min_width": 5}
    assert listed["with_id_or_url"] == 75
    lines = [json.loads(line) for line in (out / "curation-removed.jsonl").read_text().splitlines()]
    removed_ids = {line["id"] for line in lines}
    for line in lines:
        record = record_at(line)
        assert record["id"] == line["id"]  # a duplicate is named by its id, or by its url when it has none
        assert "url" not in line or line["url"] == record["url"]
        if "duplicate_of" not in line:
            assert record["text"] == "Too short." and line["reason"] == "quality.prose.min_width"
            continue
        kept = record_at(line["duplicate_of"])
        assert kept["id"] == line["duplicate_of"]["id"] and kept["id"] not in removed_ids
        texts = [
            r["text"].removeprefix("Repost\n").split() for r in (kept, record)
        ]  # the first in corpus order is kept
        similarity = difflib.SequenceMatcher(None, *texts, autojunk=False).ratio()
        assert similarity > 0.95, (line, similarity)
