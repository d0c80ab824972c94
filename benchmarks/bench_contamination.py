"""Does curation matter? Two debug models trained at equal tokens on one corpus, raw and curated: the raw one on a
corpus that holds the documents of an evaluation task (planted, as benchmark items leak into web text), the curated
one on what `dlx prepare --dedup near --decontaminate TASK` keeps of it. Measured per seed: accuracy on the planted
task and on a task nobody planted (same kind, other functions), and held-out bits per byte.

Steps, all offline, in a temporary folder deleted at the end:
  1. two lm-eval tasks of `dlx_stdlib_next_line`'s kind (`evals/stdlib_task.py`: the next line of a standard-library
     function among four), `planted` and `control`, TASK_DOCUMENTS each, from disjoint functions;
  2. the corpus: standard-library sources cut at blank lines into pieces (`bench_curation_ablation.pieces`), none that
     shares a 13-gram with a document of either task (so only the planted copies contaminate), every tenth held out;
     plus near copies of a popular tenth (30 % of the pieces kept), plus COPIES copies of each `planted` document;
  3. `dlx prepare` twice with one byte-level BPE: raw, and curated (`--dedup near --decontaminate planted`);
  4. `dlx pretrain` of the debug preset on each for the same steps × micro-batch × seq_len (one pass over the curated
     corpus), for each seed;
  5. `dlx eval --tasks planted,control` (acc: the choice of highest log-likelihood) and held-out bits per byte.
The two gaps (raw − curated) are read against the spread over seeds.

Run:  .venv/bin/python benchmarks/bench_contamination.py  (appends to BENCHMARKS.md; --no-record to only print)
"""

from __future__ import annotations

import argparse
import datetime
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchmarks/, so that `peers` imports as a package

from bench_curation_ablation import INTRO, SECTION, corpus, held_out, pieces, prepare
from continue_replay import bits_per_byte, train, write_jsonl
from dlx.data.curate.decontam import build_index
from dlx.data.prepare.tokenizer import train_bpe
from dlx.evals.stdlib_task import TASK_VERSION, TASK_YAML, next_line_documents, stdlib_functions
from peers.record import environment, publish

WATCHED = ["src/dlx/data/curate", "src/dlx/data/prepare", "benchmarks/bench_contamination.py"]
TASKS = ("planted", "control")


@dataclass(frozen=True)
class ContaminationPlan:
    """Sized for a shared 2-core CPU (about ten minutes in all); the figures are debug-scale."""

    corpus_chars: int = 1_200_000
    task_documents: int = 100
    copies: int = 16
    vocab: int = 2048
    seq_len: int = 128
    micro_batch_size: int = 8
    seeds: tuple[int, ...] = (0, 1, 2, 3)
    held_chars: int = 60_000


def write_tasks(folder: Path, plan: ContaminationPlan) -> dict[str, list[str]]:
    """The two task folders' YAML and documents; {task: its documents rendered as context + answer}."""
    docs = next_line_documents(stdlib_functions(), 2 * plan.task_documents, seed=7)
    folder.mkdir(parents=True)
    rendered = {}
    for i, name in enumerate(TASKS):
        mine = docs[i * plan.task_documents : (i + 1) * plan.task_documents]
        data = folder / f"{name}.jsonl"
        data.write_text("".join(json.dumps(d) + "\n" for d in mine), encoding="utf-8")
        yaml = TASK_YAML.format(name=name, data=json.dumps(str(data)), version=TASK_VERSION)
        (folder / f"{name}.yaml").write_text(yaml, encoding="utf-8")
        rendered[name] = [d["context"] + d["choices"][d["label"]] for d in mine]
    return rendered


def training_corpus(plan: ContaminationPlan, rendered: dict[str, list[str]]) -> tuple[list[str], str, dict]:
    """(the raw corpus, the held-out text, its make-up): stdlib pieces clean of both tasks, near copies, planted
    copies, shuffled."""
    index = build_index(rendered, 13)
    everything = [p for p in pieces(plan.corpus_chars) if index.match(p) is None]
    unique = [p for p in everything if not held_out(p)]
    held = "".join(p for p in everything if held_out(p))[: plan.held_chars]
    docs = corpus(unique)
    planted = [doc for doc in rendered["planted"] for _ in range(plan.copies)]
    docs += planted
    random.Random(5).shuffle(docs)
    return (
        docs,
        held,
        {"unique": len(unique), "near_copies": len(docs) - len(unique) - len(planted), "planted": len(planted)},
    )


def accuracy(run: Path, task_dir: Path) -> dict[str, float]:
    """acc of each task (`dlx eval --json`)."""
    result = subprocess.run(
        [sys.executable, "-m", "dlx", "eval", str(run), "--tasks", ",".join(TASKS), "--task-dir", str(task_dir),
         "--device", "cpu", "--json"],
        capture_output=True, text=True,
    )  # fmt: skip
    if result.returncode != 0:
        raise SystemExit(f"dlx eval failed:\n{result.stderr[-3000:]}")
    results = json.loads(result.stdout[result.stdout.index("{") :])["results"]
    return {name: results[name]["acc,none"] for name in TASKS}


def measure(work: Path, plan: ContaminationPlan) -> tuple[dict, dict]:
    rendered = write_tasks(work / "tasks", plan)
    docs, held, makeup = training_corpus(plan, rendered)
    (work / "tok").mkdir(parents=True)
    train_bpe(docs, plan.vocab).save(str(work / "tok" / "tokenizer.json"))
    texts = write_jsonl(work / "corpus.jsonl", docs)
    curate = ("--dedup", "near", "--decontaminate", "planted", "--task-dir", str(work / "tasks"))
    datasets = {
        "raw": prepare(texts, work / "tok", work / "raw"),
        "curated": prepare(texts, work / "tok", work / "curated", *curate),
    }
    steps = datasets["curated"]["splits"]["train"]["tokens"] // (plan.seq_len * plan.micro_batch_size)
    results: dict[str, list[dict]] = {name: [] for name in datasets}
    started = time.perf_counter()
    for seed in plan.seeds:
        for name in datasets:
            options = {
                "--data.path": str(work / name),
                "--model.preset": "debug",
                "--model.vocab_size": str(plan.vocab),
                "--train.lr": "3e-3",
                "--train.seed": str(seed),
            }
            run = train(work / "runs" / f"{name}-{seed}", plan, steps, options)
            results[name].append(accuracy(run, work / "tasks") | {"bpb": bits_per_byte(run, held, plan.seq_len)})
    facts = makeup | {"steps": steps, "seconds": time.perf_counter() - started, "datasets": datasets, "held": len(held)}
    return results, facts


def gap_line(results: dict, key: str, what: str) -> str:
    """The gap of the means, against the seed noise: the spread (largest minus smallest of either model) and the
    standard error of the gap (the seeds' standard deviations, n seeds each); a gap beyond both is more than noise."""
    raw, cur = [r[key] for r in results["raw"]], [r[key] for r in results["curated"]]
    gap = statistics.mean(raw) - statistics.mean(cur)
    spread = max(max(raw) - min(raw), max(cur) - min(cur))
    error = (statistics.variance(raw) / len(raw) + statistics.variance(cur) / len(cur)) ** 0.5
    verdict = "more than" if abs(gap) > max(spread, 2 * error) else "within"
    return (
        f"{what}: raw {statistics.mean(raw):.4f} ± {statistics.stdev(raw):.4f}, curated {statistics.mean(cur):.4f} ± "
        f"{statistics.stdev(cur):.4f} (mean ± sd over seeds); raw − curated {gap:+.4f}, {verdict} seed noise (spread "
        f"{spread:.4f}, twice the gap's standard error {2 * error:.4f})."
    )


def report(plan: ContaminationPlan, results: dict, facts: dict) -> list[str]:
    budget = facts["steps"] * plan.seq_len * plan.micro_batch_size
    lines = [
        f"Contamination (`bench_contamination.py`): {facts['unique']:,} unique stdlib pieces clean of both tasks + "
        f"{facts['near_copies']:,} near copies + {facts['planted']:,} planted task documents ({plan.copies} copies of "
        f"each of the {plan.task_documents} `planted` documents); tasks of `dlx_stdlib_next_line`'s kind, "
        f"{plan.task_documents} documents each (chance 0.25); debug preset, vocab {plan.vocab:,}, {facts['steps']} "
        f"steps × {plan.micro_batch_size} × {plan.seq_len} = {budget:,} tokens for both (one pass over the curated "
        f"corpus), lr 3e-3, seeds {', '.join(map(str, plan.seeds))}; held out: {facts['held']:,} characters of pieces "
        f"never copied; {facts['seconds']:.0f} s of training and scoring.",
        "",
        "| dataset | train documents | train tokens | planted acc per seed | control acc per seed "
        "| held-out bits/byte per seed |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name, runs in results.items():
        split = facts["datasets"][name]["splits"]["train"]
        cells = [
            ", ".join(f"{r[key]:.3f}" if key != "bpb" else f"{r[key]:.4f}" for r in runs)
            for key in ("planted", "control", "bpb")
        ]
        lines.append(f"| {name} | {split['documents']:,} | {split['tokens']:,} | {' | '.join(cells)} |")
    lines += [
        "",
        gap_line(results, "planted", "Planted task accuracy"),
        gap_line(results, "control", "Control task accuracy"),
        gap_line(results, "bpb", "Held-out bits per byte"),
    ]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-record", action="store_true", help="print only; do not append to BENCHMARKS.md")
    args = parser.parse_args()
    header = environment(WATCHED)
    plan = ContaminationPlan()
    with tempfile.TemporaryDirectory(prefix="dlx-bench-contamination-") as tmp:
        results, facts = measure(Path(tmp), plan)
    stamp = f"### {datetime.datetime.now().astimezone():%Y-%m-%d %H:%M %Z}"
    publish(SECTION, INTRO, [stamp, "", *header, "", *report(plan, results, facts)], record=not args.no_record)


if __name__ == "__main__":
    main()
