"""`bench_curation.py`'s measures on real text, each taken from one source tree given as a folder (this checkout's
`src`, or an earlier commit's, extracted by `git archive`), so that before and after run in the same benchmark run:
- the share of each kind's unique documents (`real_corpora.py`) that the per-document stages keep, with the default
  quality rules alone and with `--languages zh,en` as well; files of Python and C arrive as `.py`/`.h` files (as a
  source tree does), prose as JSON lines;
- near-copy recall and precision on real code: short functions of the standard library, and copies of some with one
  comment line (a real comment of the standard library, indented to fit) inserted; datatrove's MinHash beside it;
- documents per second per core of the whole pass (`dlx prepare`, every stage, one worker) on a given corpus.
Each runs in a fresh interpreter with PYTHONPATH set to the tree.
"""

from __future__ import annotations

import ast
import io
import json
import os
import random
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
import tokenize
from pathlib import Path

import real_corpora
from curation_peer import datatrove_clusters, pairs_of, scores, write_jsonl
from dlx.data.prepare.tokenizer import train_bpe

ROOT = Path(__file__).resolve().parents[1]
SUFFIX = {"python": ".py", "c": ".h"}
COMMENT_COPIES = 240

KEPT_SCRIPT = """
import json, sys
from dlx.data.curate.spec import build_spec
from dlx.data.curate.stages import Curator
docs = json.load(open(sys.argv[1], encoding="utf-8"))
out = {}
for name, languages in (("quality", None), ("quality + languages zh,en", ["zh", "en"])):
    spec = build_spec(quality=True, languages=languages, sources=[("corpus", "/")])
    for kind, (suffix, texts) in docs.items():
        counts = {"sources": {}, "examples": {}}
        curator = Curator(spec, False)
        kept = sum(curator.process(t, f"/corpus/{kind}/{i}{suffix}", counts) is not None for i, t in enumerate(texts))
        removed = counts["sources"]["corpus"]["removed"]
        out.setdefault(kind, {})[name] = [kept, len(texts), {r: n for r, (n, _) in removed.items()}]
print(json.dumps(out))
"""

CLUSTER_SCRIPT = """
import json, sys
import numpy as np
from dlx.data.curate.dedup import components, find_duplicates
from dlx.data.curate.spec import build_spec
from dlx.data.curate.stages import Curator
texts = json.load(open(sys.argv[1], encoding="utf-8"))
curator = Curator(build_spec(dedup="near"), signatures=True)
for i, text in enumerate(texts):
    curator.sign(0, i, text, 0, "/corpus/x.py")
sigs = curator.take_signatures()
reason = find_duplicates(sigs, near=True)[0]
alive = np.flatnonzero(reason != 1)
roots = components(sigs["bands"][alive])
cluster = {int(d): int(alive[r]) for d, r in zip(alive, roots)}
first = {}
for i, h in enumerate(sigs["exact"].tolist()):
    first.setdefault(h, i)
    cluster.setdefault(i, cluster[first[h]])
print(json.dumps(cluster))
"""

PASS_SCRIPT = """
import sys, time
from pathlib import Path
from dlx.data.curate.spec import build_spec
from dlx.data.prepare import prepare_dataset
spec = build_spec(dedup="near", languages=["zh", "en"], quality=True, pii="redact", sources=[("corpus", "/")])
started = time.perf_counter()
prepare_dataset([sys.argv[1]], Path(sys.argv[2]), tokenizer=sys.argv[3], workers=1, progress=False, curate=spec,
                val_documents=0)
print(time.perf_counter() - started)
"""


def source_tree(rev: str | None, work: Path) -> Path:
    """This checkout's src (rev None), or `rev`'s src extracted into `work`."""
    if rev is None:
        return ROOT / "src"
    archive = work / "src.tar"
    subprocess.run(["git", "-C", str(ROOT), "archive", "-o", str(archive), rev, "src"], check=True)
    with tarfile.open(archive) as tar:
        tar.extractall(work / rev, filter="data")
    return work / rev / "src"


def run_in(src: Path, script: str, *args: str) -> str:
    """stdout of `script` run with dlx from `src`."""
    env = {**os.environ, "PYTHONPATH": str(src)}
    result = subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True, env=env)
    if result.returncode != 0:
        raise SystemExit(f"measuring with {src} failed:\n{result.stderr[-3000:]}")
    return result.stdout.strip().splitlines()[-1]


def kept_shares(src: Path, docs: dict[str, list[str]], work: Path) -> dict:
    """{kind: {rules: [kept, documents, {reason: removed}]}} of the per-document stages in `src`."""
    path = work / "kinds.json"
    path.write_text(json.dumps({k: (SUFFIX.get(k, ".jsonl"), v) for k, v in docs.items()}, ensure_ascii=False))
    return json.loads(run_in(src, KEPT_SCRIPT, str(path)))


def clusters(src: Path, texts: list[str], work: Path) -> dict[int, int]:
    path = work / "functions.json"
    path.write_text(json.dumps(texts, ensure_ascii=False))
    return {int(k): v for k, v in json.loads(run_in(src, CLUSTER_SCRIPT, str(path))).items()}


def pass_seconds(src: Path, corpus: Path, out: Path, tokenizer: Path) -> float:
    return float(run_in(src, PASS_SCRIPT, str(corpus), str(out), str(tokenizer)))


def stdlib_functions(min_lines: int = 3, max_lines: int = 25) -> list[str]:
    """Short top-level and method functions of the standard library, as written (dedented), unique."""
    out = []
    for path in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py")):
        source = path.read_text(encoding="utf-8", errors="replace")
        try:
            tree = ast.parse(source)
        except SyntaxError:
            continue
        lines = source.splitlines()
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef) and min_lines <= node.end_lineno - node.lineno + 1 <= max_lines:
                body = lines[node.lineno - 1 : node.end_lineno]
                indent = len(body[0]) - len(body[0].lstrip())
                out.append("\n".join(line[indent:] for line in body) + "\n")
    return list(dict.fromkeys(out))


def stdlib_comments() -> list[str]:
    """Comment lines of the standard library (the text after `# `), for inserting into copies."""
    comments = []
    for path in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))[:60]:
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            text = line.strip()
            if text.startswith("# ") and 20 <= len(text) <= 80:
                comments.append(text)
    return comments


def string_lines(function: str) -> set[int]:
    """The 0-based lines that continue a string begun on an earlier line (a comment cannot go there)."""
    inside = set()
    for token in tokenize.generate_tokens(io.StringIO(function).readline):
        if token.type == tokenize.STRING and token.end[0] > token.start[0]:
            inside.update(range(token.start[0], token.end[0]))  # lines after the first, 0-based
    return inside


def with_comment(function: str, comment: str, rng: random.Random) -> str:
    """The function with one comment line inserted before one of its lines (not inside a string), indented like
    that line."""
    lines = function.splitlines()
    at = rng.choice([i for i in range(1, len(lines)) if i not in string_lines(function)] or [len(lines) - 1])
    indent = len(lines[at]) - len(lines[at].lstrip())
    return "\n".join([*lines[:at], " " * indent + comment, *lines[at:]]) + "\n"


def comment_corpus(n_originals: int, seed: int = 3) -> tuple[list[str], list[int]]:
    """(texts, group: the original each copies) of stdlib functions and COMMENT_COPIES commented copies, shuffled."""
    rng = random.Random(seed)
    functions = stdlib_functions()
    originals = rng.sample(functions, min(n_originals, len(functions)))
    comments = stdlib_comments()
    texts, groups = list(originals), list(range(len(originals)))
    for g in rng.sample(range(len(originals)), COMMENT_COPIES):
        texts.append(with_comment(originals[g], rng.choice(comments), rng))
        groups.append(g)
    order = list(range(len(texts)))
    rng.shuffle(order)
    return [texts[i] for i in order], [groups[i] for i in order]


def temporary() -> tempfile.TemporaryDirectory:
    return tempfile.TemporaryDirectory(prefix="dlx-bench-curation-real-")


def kept_rows(shares: dict[str, dict], label: str) -> list[str]:
    """Table rows: per kind, the share kept under each rule set, and the rules that removed most."""
    rows = []
    for kind, by_rules in shares.items():
        cells = []
        for kept, total, _ in by_rules.values():
            cells.append(f"{kept / max(total, 1):.4f}")
        removed: dict[str, int] = {}
        for _, _, reasons in by_rules.values():
            for reason, n in reasons.items():
                removed[reason] = max(removed.get(reason, 0), n)
        top = ", ".join(f"{r} {n}" for r, n in sorted(removed.items(), key=lambda x: -x[1])[:3]) or "none"
        total = next(iter(by_rules.values()))[1]
        rows.append(f"| {kind} | {label} | {total:,} | {' | '.join(cells)} | {top} |")
    return rows


def kept_table(shares: dict[str, dict]) -> list[str]:
    """{label: kept_shares(...)} as one table."""
    lines = [
        "| kind | code | unique documents | kept, default quality rules | kept, + languages zh,en | removed most by |",
        "|---|---|---:|---:|---:|---|",
    ]
    for label, by_kind in shares.items():
        lines += kept_rows(by_kind, label)
    return lines


def real_documents() -> dict[str, list[str]]:
    """Each kind's real documents; a kind whose package is missing is skipped with one line."""
    docs = {}
    for kind in real_corpora.KINDS:
        try:
            docs[kind] = real_corpora.documents(kind)
        except real_corpora.Missing as e:
            print(f"skipping {kind}: {e}", file=sys.stderr)
    return docs


def real_text(baseline: str | None, n_functions: int, synthetic: list[str]) -> list[str]:
    """The real-text tables: kept shares per kind, `n_functions` functions with commented copies, the whole pass on
    the `synthetic` corpus; with this tree's code and, given a `baseline` commit, with its code."""
    with temporary() as tmp:
        tmp = Path(tmp)
        trees = {"this": source_tree(None, tmp)}
        if baseline:
            trees[baseline] = source_tree(baseline, tmp)
        docs = real_documents()
        shares = {label: kept_shares(src, docs, tmp) for label, src in trees.items()}
        texts, groups = comment_corpus(n_functions)
        planted = pairs_of(dict(enumerate(groups)))
        found = {label: pairs_of(clusters(src, texts, tmp)) for label, src in trees.items()}
        found["datatrove MinHash"] = pairs_of(
            datatrove_clusters(write_jsonl(tmp / "f" / "f.jsonl", texts), tmp / "dt")[0]
        )
        corpus = write_jsonl(tmp / "pass" / "corpus.jsonl", synthetic)
        tok = tmp / "tokenizer.json"
        tok.write_text(train_bpe(synthetic[:500], 2000).to_str())
        seconds = {label: [] for label in trees}
        for round_ in range(2):  # alternate, so that a change of load hits both
            for label, src in trees.items():
                seconds[label].append(pass_seconds(src, corpus, tmp / f"o-{label}-{round_}", tok))
    lines = [f"Real text: {', '.join(f'{k} {len(v):,}' for k, v in docs.items())} unique documents.", ""]
    lines += kept_table(shares)
    lines += ["", f"Commented copies: {len(set(groups)):,} standard-library functions of 3–25 lines, "]
    lines[-1] += f"{COMMENT_COPIES} copies with one real comment line inserted ({len(planted)} pairs)."
    lines += ["", "| method | pairs found | recall | precision | pairs joining two different functions |"]
    lines += ["|---|---:|---:|---:|---:|"]
    for label, pairs in found.items():
        recall, precision = scores(pairs, planted)
        other = len(pairs - planted)
        lines.append(
            f"| {'dlx ' + label if label != 'datatrove MinHash' else label} | {len(pairs):,} | {recall:.3f} "
            f"| {precision:.3f} | {other:,} |"
        )
    n = len(synthetic)
    lines += [
        "",
        "| whole pass, every stage (1 worker) | seconds per run | documents/s/core (best) |",
        "|---|---:|---:|",
    ]
    for label, runs in seconds.items():
        lines.append(f"| {label} | {', '.join(f'{s:.1f}' for s in runs)} | {n / min(runs):,.0f} |")
    return lines
