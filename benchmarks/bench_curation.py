"""Curation in `dlx prepare` against datatrove's MinHash deduplication, on one synthetic corpus in the same run.

The corpus: originals of three kinds (English-like word text, Chinese text, CodeNet-like C++ solutions: about four
independent solutions per task, sharing its constants and output format, which are not duplicates), plus planted near
duplicates (30 % of the corpus): words replaced (English), characters replaced (Chinese), identifiers renamed and the
layout reformatted (code). Measured:
- near-duplicate clusters: the pairs of documents each method puts in one cluster, their Jaccard agreement with
  datatrove's (both at 5-grams, 14 bands × 8 rows), overall and on the English part (where both shingle by words);
  recall (planted pairs found) and precision (found pairs that were planted) against the planted groups;
- documents per second per core: dlx's whole pass (read, curate, tokenize, write; 1 worker) with near dedup only and
  with every stage, against datatrove's four MinHash stages alone (1 task, 1 worker);
- peak memory (the pass's allocations and the RSS of a fresh process) against documents and against text per document;
- the language verdict on a document's first 2,000 characters against the whole text's;
- the WuDao projection (200 GB, about 3.4 KB per document) on one 64-core machine, on paper from the measured rate;
- on real text (`real_corpora.py`, `curation_real.py`; with `--baseline REV`, also with that commit's code, in the
  same run): the share of each kind's unique documents the default rules keep, near-copy recall and precision on
  standard-library functions with a comment line inserted (datatrove beside it), and documents per second per core
  of the whole pass, every stage, before and after.
"""

from __future__ import annotations

import argparse
import datetime
import random
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import curation_real
from curation_peer import datatrove_clusters, pairs_of, scores, write_jsonl
from dlx.data.curate import language
from dlx.data.curate import text as curate_text
from dlx.data.curate.dedup import components, find_duplicates
from dlx.data.curate.minhash import SEED, MinHasher, collision_probability
from dlx.data.curate.spec import build_spec
from dlx.data.curate.stages import Curator, signature_dtype
from dlx.data.prepare import prepare_dataset
from dlx.data.prepare.tokenizer import train_bpe
from peers.record import environment, publish

SECTION = "Curation"
INTRO = (
    "`benchmarks/bench_curation.py`: dlx prepare's curation stages against datatrove 0.10.1's MinHash deduplication "
    "(its own pipeline, JsonlReader → signatures → buckets → clusters → filter) on one synthetic corpus with planted "
    "near duplicates, in the same run."
)
WATCHED = ["src/dlx/data/curate", "src/dlx/data/prepare", "benchmarks/bench_curation.py", "benchmarks/curation_real.py"]
HAN = [chr(0x4E00 + i) for i in range(0, 3000, 3)]
OPS = ["+", "-", "*", "/", "%", "<<", "^", "&"]
NAMES = ["n", "m", "k", "a", "b", "c", "x", "y", "s", "t", "ans", "res", "cnt", "sum", "mx", "mn", "cur", "tmp"]
NAMES += ["val", "len2", "total", "best", "lo", "hi", "mid", "dp", "acc", "num", "q", "r"]
"""What contestants call their variables: independent solutions share many of them."""
RENAMED = [f"{name}_{i}" for i, name in enumerate(reversed(NAMES))]
NAME_OR_STRING = re.compile(r'"(?:\\.|[^"\\])*"|\b(?:' + "|".join(NAMES) + r")\b")
WUDAO_BYTES, WUDAO_DOC_BYTES = 200e9, 3.4e3


def english(rng: random.Random, vocab: list[str]) -> str:
    return " ".join(rng.choice(vocab) for _ in range(rng.randint(60, 160))).capitalize() + "."


def chinese(rng: random.Random) -> str:
    return "".join(rng.choice(HAN) + ("。" if rng.random() < 0.05 else "") for _ in range(rng.randint(150, 400)))


def problem(rng: random.Random) -> dict:
    """A CodeNet-like task: its input limits, constants and output format, shared by all its solutions."""
    return {
        "consts": [rng.choice((10**9 + 7, 998244353, 10**5, 2 * 10**5, 10**9)), *rng.sample(range(2, 100), 3)],
        "format": rng.choice(('"%d\\n"', '"%lld\\n"', '"%d %d\\n"', '"Yes\\n"', '"%.6f\\n"')),
        "io": rng.choice(("scanf", "cin")),
    }


def program(rng: random.Random, task: dict) -> str:
    """One solution to `task`, written independently of its other solutions: its own names, statements and order,
    the task's constants and output format."""
    names = rng.sample(NAMES, rng.randint(3, 7))
    lit = lambda: rng.choice(task["consts"] + [0, 1, 2, rng.randrange(100)])  # noqa: E731
    head = ["#include <cstdio>", "#include <iostream>", "using namespace std;"] if rng.random() < 0.5 else []
    lines = [*head, "#include <bits/stdc++.h>", "int main() {"]
    lines += [f"    long long {n} = {lit()};" for n in names]
    read = f"    cin >> {names[0]};" if task["io"] == "cin" else f'    scanf("%d", &{names[0]});'
    lines.append(read)
    for _ in range(rng.randint(6, 20)):
        a, b, c = (rng.choice(names) for _ in range(3))
        shape = rng.randrange(6)
        if shape == 0:
            lines.append(f"    {a} = ({b} {rng.choice(OPS)} {c} {rng.choice(OPS)} {lit()}) % {task['consts'][0]};")
        elif shape == 1:
            lines.append(f"    for (int i = 0; i < {b}; i++) {{ {a} {rng.choice(OPS)}= i {rng.choice(OPS)} {lit()}; }}")
        elif shape == 2:
            lines.append(f"    if ({a} > {b}) {{ {c} = {a} {rng.choice(OPS)} {b}; }} else {{ {c}++; }}")
        elif shape == 3:
            lines.append(f"    while ({a} > {lit()}) {{ {a} /= {rng.randrange(2, 10)}; {b}++; }}")
        elif shape == 4:
            lines.append(f"    {a} = max({a}, {b} {rng.choice(OPS)} {lit()});")
        else:
            lines.append(f"    {c} += {a} * {b} % {lit()};")
    lines.append(f"    printf({task['format']}, {names[-1]});")
    return "\n".join([*lines, "    return 0;", "}"]) + "\n"


def near_copy(text: str, kind: str, rng: random.Random) -> str:
    """English: 2 % of words replaced; Chinese: 2 % of characters; code: identifiers renamed, layout reformatted."""
    if kind == "en":
        words = text.split(" ")
        for _ in range(max(1, len(words) // 50)):
            words[rng.randrange(len(words))] = "zz" + str(rng.randrange(999))
        return " ".join(words)
    if kind == "zh":
        chars = list(text)
        for _ in range(max(1, len(chars) * 2 // 100)):
            chars[rng.randrange(len(chars))] = rng.choice(HAN)
        return "".join(chars)
    names = dict(zip(NAMES, rng.sample(RENAMED, len(NAMES)), strict=True))
    renamed = NAME_OR_STRING.sub(lambda m: names.get(m.group(0), m.group(0)), text)  # strings stay
    return "\n".join(line.strip().replace(" = ", "=").replace(" + ", "+") for line in renamed.splitlines()) + "\n"


def make_corpus(n_originals: int, seed: int = 7) -> tuple[list[str], list[str], list[int]]:
    """(texts, kinds, group per document: the index of its original) with 30 % planted near duplicates, shuffled."""
    rng = random.Random(seed)
    vocab = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 10))) for _ in range(5000)]
    kinds = [("en", "zh", "code")[i % 3] for i in range(n_originals)]
    tasks = [problem(rng) for _ in range(max(1, n_originals // 12))]  # about 4 independent solutions per task
    makers = {
        "en": lambda: english(rng, vocab),
        "zh": lambda: chinese(rng),
        "code": lambda: program(rng, rng.choice(tasks)),
    }
    texts, groups = [makers[k]() for k in kinds], list(range(n_originals))
    for _ in range(round(n_originals * 0.3 / 0.7)):
        g = rng.randrange(n_originals)
        texts.append(near_copy(texts[g], kinds[g], rng))
        kinds.append(kinds[g])
        groups.append(g)
    order = list(range(len(texts)))
    rng.shuffle(order)
    return [texts[i] for i in order], [kinds[i] for i in order], [groups[i] for i in order]


def dlx_clusters(texts: list[str], seed: int = SEED) -> tuple[dict[int, int], float]:
    """dlx's near-duplicate clusters (exact duplicates joined to their first copy), and the seconds it took;
    `seed` draws the permutations (dlx's own fixed seed by default)."""
    started = time.perf_counter()
    curator = Curator(build_spec(dedup="near"), signatures=True)
    curator.minhash = MinHasher(curator.spec.bands, curator.spec.rows, seed=seed)
    for i, text in enumerate(texts):
        curator.sign(0, i, text, 0, "x")
    sigs = curator.take_signatures()
    reason, _, _ = find_duplicates(sigs, near=True)
    alive = np.flatnonzero(reason != 1)
    roots = components(sigs["bands"][alive])
    cluster_of = {int(doc): int(alive[root]) for doc, root in zip(alive, roots, strict=True)}
    first = {}
    for i, h in enumerate(sigs["exact"].tolist()):
        first.setdefault(h, i)
        cluster_of.setdefault(i, cluster_of[first[h]])
    return cluster_of, time.perf_counter() - started


def whole_pass(corpus: Path, out: Path, tokenizer: Path, every_stage: bool) -> float:
    """Seconds of dlx prepare on 1 worker: read, curate, tokenize, write."""
    options = dict(dedup="near", sources=[("corpus", "/")])
    if every_stage:
        options |= dict(languages=["zh", "en"], quality=True, pii="redact")
    spec = build_spec(**options)
    started = time.perf_counter()
    prepare_dataset([str(corpus)], out, tokenizer=tokenizer, workers=1, progress=False, curate=spec, val_documents=0)
    return time.perf_counter() - started


PEAK_SCRIPT = """
import resource, sys, tracemalloc
from pathlib import Path
from dlx.data.curate.spec import build_spec
from dlx.data.prepare import prepare_dataset
spec = build_spec(dedup="near", sources=[("corpus", "/")])
tracemalloc.start()
prepare_dataset([sys.argv[1]], Path(sys.argv[2]), tokenizer=sys.argv[3], workers=1, progress=False, curate=spec)
print(tracemalloc.get_traced_memory()[1] / 1024, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


def peak_rss_mb(corpus: Path, out: Path, tokenizer: Path) -> tuple[float, float]:
    """(peak of the pass's Python and numpy allocations (tracemalloc), peak RSS of the process), MB."""
    argv = [sys.executable, "-c", PEAK_SCRIPT, str(corpus), str(out), str(tokenizer)]
    base, peak = subprocess.run(argv, check=True, capture_output=True, text=True).stdout.split()[-2:]
    return float(base) / 1024, int(peak) / 1024


MEMORY_COPIES = 8
"""The memory corpora start from 8 near copies of every document (24,000 at the default size), so that the
signatures, not the interpreter and the tokenizer, are what a difference in peak allocation can come from."""


def memory_corpora(texts: list[str]) -> list[tuple[str, list[str]]]:
    """Three corpora for the peak-memory rows: a base, the same documents with 4× the text each, 4× the documents."""
    base = [t + f" {k}" for k in range(MEMORY_COPIES) for t in texts]
    longer = [" ".join([t] * 4) for t in base]
    more = [t + f" {k}" for k in range(4 * MEMORY_COPIES) for t in texts]
    return [("base", base), ("4x text per document", longer), ("4x documents", more)]


def prefix_agreement() -> tuple[int, int]:
    """(agreeing, compared): windows of real English (Python's own documentation, `pydoc_data.topics`: 6,000
    characters every 3,000) whose language on the first CHECK_CHARS characters equals the whole window's. The
    synthetic corpus cannot answer this: its English-like word salad is no language py3langid knows."""
    from pydoc_data.topics import topics

    text = "\n\n".join(topics[name] for name in sorted(topics))
    windows = [text[i : i + 6000] for i in range(0, len(text) - 6000, 3000)]
    agreeing = sum(language.detect(t) == language.detect(t, max_chars=None) for t in windows)
    return agreeing, len(windows)


LITERALS_KEPT = curate_text.code_tokens


def literal_blind_tokens(text: str) -> list[str]:
    """The code shingles' tokens as they were before literals were kept: numbers became `0`, strings `S`."""
    tokens = LITERALS_KEPT(text)
    return ["0" if t[0].isdigit() else "S" if t[0] in "\"'" else t for t in tokens]


def blinded_code_row(texts: list[str], kinds: list[str], planted: set) -> str:
    """Code-only recall and precision of dlx's clusters with literal-blind code shingles (the ablation of the fix)."""
    curate_text.code_tokens = literal_blind_tokens
    try:
        found = pairs_of(dlx_clusters(texts)[0])
    finally:
        curate_text.code_tokens = LITERALS_KEPT
    code = lambda pairs: {p for p in pairs if kinds[p[0]] == "code"}  # noqa: E731
    recall, precision = scores(code(found), code(planted))
    row = f"code only, dlx with literals blinded (the shingles before): recall {recall:.3f}, precision {precision:.3f}"
    return f"| {row} | | | | |"


def sampling_ceiling(texts: list[str], english: set, planted: set, ours: set) -> list[str]:
    """How far two MinHash runs that draw different permutations can agree on the English pairs: dlx against itself
    at other seeds (measured), and the expectation from each planted pair's exact shingle Jaccard (computed)."""
    en = lambda pairs: {p for p in pairs if p[0] in english and p[1] in english}  # noqa: E731
    jaccard = lambda a, b: len(a & b) / max(len(a | b), 1)  # noqa: E731
    mine = en(ours)
    selves = [jaccard(mine, en(pairs_of(dlx_clusters(texts, seed)[0]))) for seed in (SEED + 1, SEED + 2, SEED + 3)]
    spec = build_spec(dedup="near")
    sets = {i: set(curate_text.shingles(texts[i], spec.shingle, False).tolist()) for i in english}
    p = np.array([collision_probability(jaccard(sets[a], sets[b]), spec.bands, spec.rows) for a, b in en(planted)])
    expected = (p * p).sum() / (2 * p - p * p).sum()
    return [
        f"| English agreement, dlx against itself at seeds {SEED + 1}–{SEED + 3} (other permutations): "
        f"{', '.join(f'{x:.3f}' for x in selves)}; expected of any two independent draws from the planted pairs' "
        f"exact Jaccard (mean collision probability {p.mean():.3f}): {expected:.3f} | | | | |"
    ]


def near_only(args) -> list[str]:
    """The near-duplicate table alone: dlx's clusters and datatrove's on the same corpus."""
    texts, kinds, groups = make_corpus(args.originals)
    with tempfile.TemporaryDirectory(prefix="dlx-bench-curation-") as tmp:
        corpus = write_jsonl(Path(tmp) / "in" / "corpus.jsonl", texts)
        ours, theirs = dlx_clusters(texts)[0], datatrove_clusters(corpus, Path(tmp) / "dt")[0]
    english = {i for i, k in enumerate(kinds) if k == "en"}
    planted = pairs_of(dict(enumerate(groups)))
    lines = near_report(args, texts, kinds, planted, english, pairs_of(ours), pairs_of(theirs))
    return [*lines, blinded_code_row(texts, kinds, planted)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--originals", type=int, default=2800, help="original documents (plus 30 %% planted copies)")
    parser.add_argument("--no-record", action="store_true", help="print only; do not append to BENCHMARKS.md")
    parser.add_argument("--near-only", action="store_true", help="only the near-duplicate table (no pass timings)")
    parser.add_argument("--baseline", metavar="REV", help="also measure the real-text rows with this commit's code")
    parser.add_argument("--real-only", action="store_true", help="only the real-text tables")
    args = parser.parse_args()
    header = environment(WATCHED)
    stamp = f"### {datetime.datetime.now().astimezone():%Y-%m-%d %H:%M %Z}"
    if args.near_only or args.real_only:
        lines = (
            near_only(args)
            if args.near_only
            else curation_real.real_text(args.baseline, args.originals // 3, make_corpus(args.originals)[0])
        )
        return publish(SECTION, INTRO, [stamp, "", *header, "", *lines], record=not args.no_record)
    texts, kinds, groups = make_corpus(args.originals)
    planted = pairs_of(dict(enumerate(groups)))
    english = {i for i, k in enumerate(kinds) if k == "en"}
    with tempfile.TemporaryDirectory(prefix="dlx-bench-curation-") as tmp:
        tmp = Path(tmp)
        corpus = write_jsonl(tmp / "in" / "corpus.jsonl", texts)
        tok = tmp / "tokenizer.json"
        tok.write_text(train_bpe(texts[:500], 2000).to_str())
        ours, dlx_dedup_s = dlx_clusters(texts)
        theirs, datatrove_s = datatrove_clusters(corpus, tmp / "dt")
        dedup_only_s = whole_pass(corpus, tmp / "o1", tok, every_stage=False)
        every_s = whole_pass(corpus, tmp / "o2", tok, every_stage=True)
        sizes, peaks = [], []
        for name, docs in memory_corpora(texts):
            part = write_jsonl(tmp / f"mem-{name}" / "c.jsonl", docs)
            sizes.append((name, len(docs), sum(len(d.encode()) for d in docs)))
            peaks.append(peak_rss_mb(part, tmp / f"mo-{name}", tok))
        prefix = prefix_agreement()
    ours_pairs, theirs_pairs = pairs_of(ours), pairs_of(theirs)
    lines = report(
        args,
        texts,
        kinds,
        planted,
        english,
        ours_pairs,
        theirs_pairs,
        (dlx_dedup_s, datatrove_s, dedup_only_s, every_s),
        sizes,
        peaks,
        prefix,
    )
    lines = [
        stamp,
        "",
        *header,
        "",
        *lines,
        "",
        *curation_real.real_text(args.baseline, args.originals // 3, make_corpus(args.originals)[0]),
    ]
    publish(SECTION, INTRO, lines, record=not args.no_record)


def near_report(args, texts, kinds, planted, english, ours, theirs) -> list[str]:
    """The near-duplicate table: pairs found, agreement with datatrove, recall and precision (overall, per kind)."""
    n, nbytes = len(texts), sum(len(t.encode()) for t in texts)
    agree = len(ours & theirs) / max(len(ours | theirs), 1)
    en = lambda pairs: {p for p in pairs if p[0] in english and p[1] in english}  # noqa: E731
    agree_en = len(en(ours) & en(theirs)) / max(len(en(ours) | en(theirs)), 1)
    lines = [
        f"Corpus: {n:,} documents ({nbytes / 1e6:.1f} MB; {args.originals:,} originals, one third each English-like, "
        f"Chinese, CodeNet-like C++; {n - args.originals:,} planted near copies, {len(planted):,} planted pairs).",
        "",
        "| method | pairs found | agreement with datatrove (all / English) | recall | precision |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, pairs in (("dlx --dedup near", ours), ("datatrove MinHash", theirs)):
        recall, precision = scores(pairs, planted)
        agreement = f"{agree:.3f} / {agree_en:.3f}" if name.startswith("dlx") else "1 / 1"
        lines.append(f"| {name} | {len(pairs):,} | {agreement} | {recall:.3f} | {precision:.3f} |")
    for kind in ("en", "zh", "code"):
        of_kind = lambda pairs, kind=kind: {p for p in pairs if kinds[p[0]] == kind}  # noqa: E731
        (r_ours, p_ours), (r_theirs, p_theirs) = (scores(of_kind(x), of_kind(planted)) for x in (ours, theirs))
        p_theirs = f"{p_theirs:.3f}" if of_kind(theirs) else "none found"
        lines.append(
            f"| {kind} only: recall dlx {r_ours:.3f}, datatrove {r_theirs:.3f}; precision dlx {p_ours:.3f}, "
            f"datatrove {p_theirs} | | | | |"
        )
    return lines + sampling_ceiling(texts, english, planted, ours)


def report(args, texts, kinds, planted, english, ours, theirs, seconds, sizes, peaks, prefix) -> list[str]:
    dlx_dedup_s, datatrove_s, dedup_only_s, every_s = seconds
    n, nbytes = len(texts), sum(len(t.encode()) for t in texts)
    lines = near_report(args, texts, kinds, planted, english, ours, theirs)
    rate = lambda s: n / s  # noqa: E731 - documents per second on one core
    lines += ["", "| pass (1 core) | seconds | documents/s/core | ÷ datatrove's dedup alone |", "|---|---:|---:|---:|"]
    for name, s in (
        ("datatrove MinHash, 4 stages (dedup alone)", datatrove_s),
        ("dlx signatures + clusters alone (in-process)", dlx_dedup_s),
        ("dlx prepare --dedup near (read, curate, tokenize, write)", dedup_only_s),
        ("dlx prepare, every stage (near, languages, quality, pii)", every_s),
    ):
        lines.append(f"| {name} | {s:.1f} | {rate(s):,.0f} | {rate(s) / rate(datatrove_s):.2f}× |")
    lines += ["", "| corpus (near dedup only) | documents | text MB | peak MB allocated by the pass (tracemalloc) "]
    lines[-1] += "| peak RSS MB of the process |"
    lines += ["|---|---:|---:|---:|---:|"]
    for (name, docs, text_bytes), (base, peak) in zip(sizes, peaks, strict=True):
        lines.append(f"| {name} | {docs:,} | {text_bytes / 1e6:.1f} | {base:.0f} | {peak:.0f} |")
    per_doc = max(peaks[2][0] - peaks[0][0], 0) * 1e6 / (sizes[2][1] - sizes[0][1])
    per_text_byte = (peaks[1][0] - peaks[0][0]) * 1e6 / (sizes[1][2] - sizes[0][2])
    record = signature_dtype(14).itemsize
    rate_bps = nbytes / every_s
    hours = WUDAO_BYTES / (rate_bps * 64) / 3600
    wudao_docs = WUDAO_BYTES / WUDAO_DOC_BYTES
    lines += [
        "",
        f"Growth of the pass's peak allocation: {per_doc:,.0f} B per added document (a signature record is "
        f"{record} B; union-find and sort buffers add about 40 B per document at the decision), "
        f"{per_text_byte:.3f} B per added byte of text at the same document count.",
        f"Language on the first {language.CHECK_CHARS:,} characters equal to the whole text's: {prefix[0]:,} of "
        f"{prefix[1]:,} windows of 6,000 characters of Python's documentation (English; no Chinese prose is on "
        "this machine's disk to measure it on).",
        f"WuDao on paper (200 GB, about {wudao_docs / 1e6:.0f} M documents of {WUDAO_DOC_BYTES / 1e3:.1f} KB): every "
        f"stage at {rate_bps / 1e6:.2f} MB/s/core on this corpus, 64 cores: {hours:.1f} h; the deduplicating process "
        f"holds {wudao_docs * per_doc / 1e9:.1f} GB at the growth measured above per document (the text's share "
        "is bounded by the 16 MB work unit, whatever the corpus).",
    ]
    return lines


if __name__ == "__main__":
    main()
