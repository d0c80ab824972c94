"""BENCHMARKS.md opens with one headline table, and a benchmark's publish step rewrites its own row of it (in the
order of the sections below), leaving the other rows and the dated entries as they were."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

from peers.record import HEADLINE_END, HEADLINE_HEADER, HEADLINE_START, update_headline  # noqa: E402

PAGE = f"""# Benchmarks

{HEADLINE_START}
{HEADLINE_HEADER}
| Loader | old | — | — | m | d | c |
| Tune | 1 | — | — | m | d | c |
{HEADLINE_END}

## Loader

entry

## Curation

entry

## Tune

entry
"""


def rows(path: Path) -> list[str]:
    text = path.read_text()
    table = text[text.index(HEADLINE_START) : text.index(HEADLINE_END)]
    return [line for line in table.splitlines() if line.startswith("| ") and not line.startswith("| benchmark")]


def test_a_publish_rewrites_its_row_and_a_new_benchmark_takes_its_place_in_section_order(tmp_path):
    page = tmp_path / "BENCHMARKS.md"
    page.write_text(PAGE)
    update_headline("Tune", "| Tune | 2 | peer | 0.9 | m | d | c |", page)
    update_headline("Curation", "| Curation | new | — | — | m | d | c |", page)
    assert rows(page) == [
        "| Loader | old | — | — | m | d | c |",
        "| Curation | new | — | — | m | d | c |",
        "| Tune | 2 | peer | 0.9 | m | d | c |",
    ]
    assert page.read_text().split(HEADLINE_END)[1] == PAGE.split(HEADLINE_END)[1]  # the entries are untouched


def test_the_repository_page_opens_with_one_row_per_section():
    text = (ROOT / "BENCHMARKS.md").read_text()
    assert text.index(HEADLINE_START) < text.index("\n## ")
    sections = [line[3:] for line in text.splitlines() if line.startswith("## ")]
    named = [row.split(" | ")[0][2:] for row in rows(ROOT / "BENCHMARKS.md")]
    assert named == [s for s in sections if s in named] and len(set(named)) == len(named)
    assert set(sections) == set(named)  # every section has its row
