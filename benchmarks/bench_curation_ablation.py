"""Raw against curated at the same token budget: held-out bits per byte of debug models trained on a corpus with 30 %
planted near duplicates, prepared by `dlx prepare` without and with `--dedup near`.

Steps, all offline, in a temporary folder deleted at the end:
  1. documents: Python standard library sources (`dlx prepare --corpus stdlib`'s inputs) cut at blank lines into
     pieces of at most PIECE_CHARS characters; every tenth piece (by the MD5 of its text) is held out, never copied;
  2. the training corpus: the other pieces, plus planted near copies that make 30 % of its documents, drawn from a
     popular tenth of the pieces (reposts concentrate on few originals); a copy has one word in 100 replaced and a line
     added at its top, so it is no exact duplicate;
  3. `dlx prepare` of the corpus twice, raw and `--dedup near` (one byte-level BPE learned on the unique pieces);
  4. `dlx pretrain` of the debug preset on each, the same steps × micro-batch × seq_len (the token budget: about one
     pass over the curated corpus), same lr, for each seed;
  5. bits per byte of each model on the held-out pieces: every token after the first predicted once, the summed
     cross-entropy in bits over the text's UTF-8 bytes (`continue_replay.bits_per_byte`).
The spread over seeds is the noise the difference is read against.

Run:  .venv/bin/python benchmarks/bench_curation_ablation.py  (appends to BENCHMARKS.md; --no-record to only print)
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import random
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchmarks/, so that `peers` imports as a package

from continue_replay import bits_per_byte, dlx, train, write_jsonl
from dlx.data.prepare.inputs import InputList
from dlx.data.prepare.readers import sample_documents
from dlx.data.prepare.tokenizer import train_bpe
from dlx.data.prepare.units import choose_unit_bytes, plan_units
from dlx.data.shards import read_manifest
from peers.record import environment, publish

SECTION = "Curation"
INTRO = (
    "`benchmarks/bench_curation.py`: dlx prepare's curation stages against datatrove 0.10.1's MinHash deduplication "
    "(its own pipeline, JsonlReader → signatures → buckets → clusters → filter) on one synthetic corpus with planted "
    "near duplicates, in the same run."
)
WATCHED = ["src/dlx/data/curate", "src/dlx/data/prepare", "benchmarks/bench_curation_ablation.py"]
PIECE_CHARS = 3000
DUPLICATE_SHARE = 0.3


@dataclass(frozen=True)
class AblationPlan:
    """Sized for a shared 2-core CPU (a few minutes in all); the figures are debug-scale."""

    corpus_chars: int = 1_200_000
    vocab: int = 2048
    seq_len: int = 128
    micro_batch_size: int = 8
    seeds: tuple[int, ...] = (0, 1, 2, 3)
    held_chars: int = 60_000


def pieces(max_chars: int) -> list[str]:
    """Standard library sources cut at blank lines into pieces of at most PIECE_CHARS characters."""
    inputs = InputList((), "stdlib").measure()
    out = []
    for doc in sample_documents(plan_units(inputs, choose_unit_bytes(inputs.bytes)), "text", max_chars):
        piece = ""
        for block in doc.split("\n\n"):
            if piece and len(piece) + len(block) > PIECE_CHARS:
                out.append(piece)
                piece = ""
            piece += block[:PIECE_CHARS] + "\n\n"
        if piece.strip():
            out.append(piece)
    return [p for p in out if len(p) > 200]


def held_out(text: str) -> bool:
    return hashlib.md5(text.encode("utf-8")).digest()[0] % 10 == 0


def near_copy(text: str, rng: random.Random, n: int) -> str:
    """One word in 100 replaced and a line added at the top: a repost, no exact duplicate."""
    words = text.split(" ")
    filled = [i for i, w in enumerate(words) if w]
    for _ in range(max(1, len(filled) // 100)):
        words[rng.choice(filled)] = f"w{rng.randrange(10**6)}"
    return f"# mirror {n}\n" + " ".join(words)


def corpus(unique: list[str], seed: int = 11) -> list[str]:
    """The unique pieces plus planted near copies (DUPLICATE_SHARE of the result) of a popular tenth of them."""
    rng = random.Random(seed)
    popular = rng.sample(unique, max(1, len(unique) // 10))
    copies = [near_copy(rng.choice(popular), rng, n) for n in range(round(len(unique) * DUPLICATE_SHARE / 0.7))]
    docs = unique + copies
    rng.shuffle(docs)
    return docs


def prepare(texts: Path, tokenizer: Path, out: Path, *curate: str) -> dict:
    dlx("prepare", str(texts), "--tokenizer", str(tokenizer), "--out", str(out), "--val-documents", "4", *curate)
    return read_manifest(out).summary()


def measure(work: Path, plan: AblationPlan) -> tuple[dict, dict]:
    everything = pieces(plan.corpus_chars)
    unique = [p for p in everything if not held_out(p)]
    held = "".join(p for p in everything if held_out(p))[: plan.held_chars]
    docs = corpus(unique)
    (work / "tok").mkdir(parents=True)
    train_bpe(unique, plan.vocab).save(str(work / "tok" / "tokenizer.json"))
    texts = write_jsonl(work / "corpus.jsonl", docs)
    datasets = {
        "raw": prepare(texts, work / "tok", work / "raw"),
        "curated (--dedup near)": prepare(texts, work / "tok", work / "curated", "--dedup", "near"),
    }
    steps = datasets["curated (--dedup near)"]["splits"]["train"]["tokens"] // (plan.seq_len * plan.micro_batch_size)
    results: dict[str, list[float]] = {name: [] for name in datasets}
    started = time.perf_counter()
    for seed in plan.seeds:
        for name, folder in (("raw", "raw"), ("curated (--dedup near)", "curated")):
            options = {
                "--data.path": str(work / folder),
                "--model.preset": "debug",
                "--model.vocab_size": str(plan.vocab),
                "--train.lr": "3e-3",
                "--train.seed": str(seed),
            }
            run = train(work / "runs" / f"{folder}-{seed}", plan, steps, options)
            results[name].append(bits_per_byte(run, held, plan.seq_len))
    facts = {
        "unique": len(unique),
        "copies": len(docs) - len(unique),
        "held_chars": len(held),
        "steps": steps,
        "seconds": time.perf_counter() - started,
        "datasets": datasets,
    }
    return results, facts


def report(plan: AblationPlan, results: dict, facts: dict) -> list[str]:
    budget = facts["steps"] * plan.seq_len * plan.micro_batch_size
    lines = [
        f"Ablation (`bench_curation_ablation.py`): {facts['unique']:,} unique stdlib pieces (≤ {PIECE_CHARS:,} "
        f"characters) + {facts['copies']:,} planted near copies ({DUPLICATE_SHARE:.0%} of the corpus, of a popular "
        f"tenth); debug preset, vocab {plan.vocab:,}, {facts['steps']} steps × {plan.micro_batch_size} × "
        f"{plan.seq_len} = {budget:,} tokens for both (one pass over the curated corpus), lr 3e-3, seeds "
        f"{', '.join(map(str, plan.seeds))}; held out: {facts['held_chars']:,} characters of unique pieces never "
        f"copied; {facts['seconds']:.0f} s of training and scoring.",
        "",
        "| dataset | train documents | train tokens | passes over it | held-out bits/byte per seed | mean |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name, bpbs in results.items():
        train_split = facts["datasets"][name]["splits"]["train"]
        per_seed = ", ".join(f"{b:.4f}" for b in bpbs)
        passes = budget / train_split["tokens"]
        lines.append(
            f"| {name} | {train_split['documents']:,} | {train_split['tokens']:,} | {passes:.2f} | {per_seed} | "
            f"{statistics.mean(bpbs):.4f} |"
        )
    raw, cur = results["raw"], results["curated (--dedup near)"]
    gap = statistics.mean(raw) - statistics.mean(cur)
    spread = max(max(raw) - min(raw), max(cur) - min(cur))
    verdict = "larger than" if abs(gap) > spread else "within"
    lines += [
        "",
        f"Raw − curated: {gap:+.4f} bits/byte, {verdict} the spread over seeds ({spread:.4f}).",
    ]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-record", action="store_true", help="print only; do not append to BENCHMARKS.md")
    args = parser.parse_args()
    header = environment(WATCHED)
    plan = AblationPlan()
    with tempfile.TemporaryDirectory(prefix="dlx-bench-ablation-") as tmp:
        results, facts = measure(Path(tmp), plan)
    lines = [
        f"### {datetime.datetime.now().astimezone():%Y-%m-%d %H:%M %Z}",
        "",
        *header,
        "",
        *report(plan, results, facts),
    ]
    publish(SECTION, INTRO, lines, record=not args.no_record)


if __name__ == "__main__":
    main()
