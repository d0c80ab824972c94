"""PII redaction on adversarial text against ordinary text of the same length: documents per second of
`dlx.data.curate.pii.redact` (every kind) on 150 KB documents, with this checkout's code and, given `--baseline REV`,
with that commit's (in the same run, each in a fresh interpreter).

Ordinary documents: the English and Chinese Debian Reference (Debian `debian-reference-en`, `debian-reference-zh-cn`)
and standard-library Python, cut into 150 KB pieces. Adversarial ones: 150 KB of random hex, of one letter, of one
digit, of `1.`, of `a@`, of `ab.`, of `+1 `, of escaped quotes; a pattern that rescans from every start position is
quadratic on them. A baseline measure that passes BASELINE_CAP_S seconds for one document is stopped and reported as
more than that. The target: adversarial within 3× of ordinary.

Run:  .venv/bin/python benchmarks/bench_pii_bounds.py --baseline 4016c00  (appends to BENCHMARKS.md, section Trust)
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import random
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

import curation_real
import real_corpora
from peers.record import environment, publish

SECTION = "Trust"
INTRO = "Every number and message true."
WATCHED = ["src/dlx/data/curate", "benchmarks/bench_pii_bounds.py"]
DOC_CHARS = 150_000
BASELINE_CAP_S = 120
SCRIPT = """
import json, sys, time
from collections import Counter
from dlx.data.curate.pii import redact
docs = json.load(open(sys.argv[1], encoding="utf-8"))
started = time.process_time()
for doc in docs:
    redact(doc, Counter())
print(len(docs) / max(time.process_time() - started, 1e-9))
"""


def ordinary(n_docs: int) -> list[str]:
    """150 KB pieces of real English, Chinese and Python."""
    parts = []
    for kind in ("en_prose", "zh_prose"):
        try:
            parts.append("\n\n".join(real_corpora.documents(kind)))
        except real_corpora.Missing as e:
            print(f"skipping {kind}: {e}", file=sys.stderr)
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    parts.append("\n\n".join(p.read_text(encoding="utf-8") for p in sorted(stdlib.glob("*.py"))[:80]))
    pieces = [text[i : i + DOC_CHARS] for text in parts for i in range(0, len(text) - DOC_CHARS, DOC_CHARS)]
    return random.Random(0).sample(pieces, min(n_docs, len(pieces)))


def adversarial() -> dict[str, str]:
    rng = random.Random(0)
    n = DOC_CHARS
    return {
        "hex": "".join(rng.choice("0123456789abcdef") for _ in range(n)),
        "one letter": "a" * n,
        "one digit": "1" * n,
        "`1.` repeated": "1." * (n // 2),
        "`a@` repeated": "a@" * (n // 2),
        "`ab.` repeated": "ab." * (n // 3),
        "`+1 ` repeated": "+1 " * (n // 3),
        "escaped quotes": '"' + '\\"' * (n // 2),
    }


def docs_per_second(src: Path, docs: list[str], work: Path, cap_s: float | None) -> float | None:
    """Documents per CPU second of redaction with dlx from `src`; None when it passed `cap_s`."""
    path = work / "docs.json"
    path.write_text(json.dumps(docs, ensure_ascii=False), encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(src)}
    try:
        result = subprocess.run(
            [sys.executable, "-c", SCRIPT, str(path)], capture_output=True, text=True, env=env, timeout=cap_s
        )
    except subprocess.TimeoutExpired:
        return None
    if result.returncode != 0:
        raise SystemExit(f"redaction with {src} failed:\n{result.stderr[-2000:]}")
    return float(result.stdout.split()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", metavar="REV", help="also measure this commit's redaction")
    parser.add_argument("--no-record", action="store_true", help="print only; do not append to BENCHMARKS.md")
    args = parser.parse_args()
    header = environment(WATCHED)
    with tempfile.TemporaryDirectory(prefix="dlx-bench-pii-") as tmp:
        tmp = Path(tmp)
        trees = {"this": curation_real.source_tree(None, tmp)}
        if args.baseline:
            trees[args.baseline] = curation_real.source_tree(args.baseline, tmp)
        normal = ordinary(12)
        rates = {label: {"ordinary": docs_per_second(src, normal, tmp, None)} for label, src in trees.items()}
        for name, doc in adversarial().items():
            for label, src in trees.items():
                rates[label][name] = docs_per_second(src, [doc], tmp, None if label == "this" else BASELINE_CAP_S)
    lines = [
        f"### {datetime.datetime.now().astimezone():%Y-%m-%d %H:%M %Z}",
        "",
        *header,
        "",
        f"PII redaction (`bench_pii_bounds.py`, every kind) on documents of {DOC_CHARS // 1000} KB: "
        f"{len(normal)} ordinary ones (real English, Chinese, Python) against adversarial ones; documents per CPU "
        "second, and the ordinary rate over each (target ≤ 3).",
        "",
        "| document | " + " | ".join(f"{label}: docs/s | {label}: ordinary ÷ this" for label in trees) + " |",
        "|---|" + "---:|---:|" * len(trees),
    ]
    for name in rates["this"]:
        cells = []
        for label in trees:
            rate, base = rates[label][name], rates[label]["ordinary"]
            if rate is None:
                cells += [
                    f"< {1 / BASELINE_CAP_S:.3f} (stopped after {BASELINE_CAP_S} s)",
                    f"> {base * BASELINE_CAP_S:,.0f}",
                ]
            else:
                cells += [f"{rate:,.2f}", f"{base / rate:.2f}"]
        lines.append(f"| {name} | {' | '.join(cells)} |")
    publish(SECTION, INTRO, lines, record=not args.no_record)


if __name__ == "__main__":
    main()
