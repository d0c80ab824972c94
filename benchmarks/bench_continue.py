"""Continued pretraining: characters per token on held-out Chinese before and after `dlx tokenizer extend`.

Base tokenizer: Meta's Llama-3 tokenizer cannot be downloaded here, so the stand-in is a 32,000-token byte-level BPE
trained by `dlx.data.prepare.tokenizer.train_bpe` (Llama 3's pre-tokenizer regex, byte-level, ignore_merges) on the
first 14 M characters of Python's standard library sources (`dlx prepare --corpus stdlib`'s inputs): English and
code, no Chinese merges at all. Llama 3's own 128k vocabulary has a few thousand Chinese tokens, so its "before" is
higher than this stand-in's and its gain from the same additions smaller.

Chinese text: the Debian package manpages-zh (modern Chinese prose: the zh_CN manual pages, roff markup stripped by
`strip_roff` below), installed with `apt-get install -y manpages-zh` when missing (the benchmark says so). Each page
goes to the held-out set when the first hex digit of the MD5 of its file name is 0 (about 1 in 16), else to the
learning set. Merges are learned once for the largest N on the whole learning set (`learn_merges`); each smaller N
takes the first N of them, which is what learning N would give (the greedy order does not depend on N).

Columns: characters and UTF-8 bytes per token on the held-out Chinese; characters per token and the change in the
token count on held-in English (the last 10 % of the stdlib sample, which the base tokenizer learned from). The manual
pages carry English option names and code, so a few learned merges also apply to English: its count may fall a little,
never rise (a word that gets no new token encodes exactly as before).

With --replay, also a debug-scale continued run with 25 % replay against none (benchmarks/continue_replay.py): the
old domain's (English) bits per byte before and after, and the new domain's.

Run:  .venv/bin/python benchmarks/bench_continue.py [--replay]  (appends to BENCHMARKS.md; --no-record to only print)
"""

from __future__ import annotations

import argparse
import datetime
import gzip
import hashlib
import json
import re
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchmarks/, so that `peers` imports as a package

from tokenizers import Tokenizer

from dlx.data.prepare.inputs import InputList
from dlx.data.prepare.readers import sample_documents
from dlx.data.prepare.tokenizer import train_bpe
from dlx.data.prepare.units import choose_unit_bytes, plan_units
from dlx.data.tokenizer_extend import density, extend_json, learn_merges, word_counts
from peers.record import environment, publish

MAN_ZH = Path("/usr/share/man/zh_CN")
ROFF_TEXT_MACROS = (".SH", ".SS", ".B", ".I", ".BR", ".IR", ".BI", ".IB", ".RB", ".RI")
ROFF_ESCAPES = re.compile(r"\\f[BIRP]|\\f\(..|\\[*(]..|\\s[-+]?\d")


def strip_roff(text: str) -> str:
    """The prose of a manual page: comments and layout requests dropped, font and size escapes removed."""
    lines = []
    for line in text.splitlines():
        if line.startswith(('.\\"', "'\\\"")):
            continue
        if line.startswith("."):
            request, _, rest = line.partition(" ")
            if request not in ROFF_TEXT_MACROS or not rest:
                continue
            line = rest.replace('"', "")
        line = ROFF_ESCAPES.sub("", line)
        for escape, plain in (("\\-", "-"), ("\\ ", " "), ("\\&", ""), ("\\,", ""), ("\\/", ""), ("\\e", "\\")):
            line = line.replace(escape, plain)
        lines.append(line)
    return "\n".join(lines)


def chinese_pages() -> tuple[list[str], list[str]]:
    """(learning pages, held-out pages) of the zh_CN manual pages, installing manpages-zh first if needed."""
    if not MAN_ZH.is_dir():
        print("manpages-zh is missing: apt-get install -y manpages-zh", flush=True)
        subprocess.run(["apt-get", "install", "-y", "manpages-zh"], check=True, capture_output=True)
    learn, held = [], []
    for page in sorted(MAN_ZH.rglob("*.gz")):
        try:
            text = strip_roff(gzip.decompress(page.read_bytes()).decode("utf-8"))
        except (OSError, UnicodeDecodeError):
            continue
        (held if hashlib.md5(page.name.encode()).hexdigest()[0] == "0" else learn).append(text)
    return learn, held


def stdlib_sample(max_chars: int) -> list[str]:
    inputs = InputList((), "stdlib").measure()
    return sample_documents(plan_units(inputs, choose_unit_bytes(inputs.bytes)), "text", max_chars)


def measure(added: list[int], base_vocab: int) -> tuple[list[dict], dict]:
    english = stdlib_sample(14_000_000)
    base_english, held_english = english, english[-len(english) // 10 :]
    base = train_bpe(base_english, base_vocab)
    learn, held = chinese_pages()
    started = time.perf_counter()
    merges = learn_merges(base, word_counts(base, learn), max(added))
    seconds = time.perf_counter() - started
    base_json = json.loads(base.to_str())
    rows = [{"added": 0, "zh": density(base, held), "en": density(base, held_english)}]
    for n in added:
        extended = Tokenizer.from_str(json.dumps(extend_json(base_json, merges[:n])[0]))
        rows.append({"added": len(merges[:n]), "zh": density(extended, held), "en": density(extended, held_english)})
    facts = {
        "learn_pages": len(learn),
        "learn_chars": sum(map(len, learn)),
        "held_pages": len(held),
        "held_chars": sum(map(len, held)),
        "english_chars": sum(map(len, held_english)),
        "base_vocab": base.get_vocab_size(),
        "seconds": seconds,
        "merges": len(merges),
    }
    return rows, facts


def table(rows: list[dict]) -> list[str]:
    first = rows[0]["zh"].chars_per_token
    lines = [
        "| added tokens | zh chars/token | zh bytes/token | zh vs base | en chars/token | en tokens vs base |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        zh, en = row["zh"], row["en"]
        lines.append(
            f"| {row['added']:,} | {zh.chars_per_token:.3f} | {zh.bytes_per_token:.3f} | "
            f"{zh.chars_per_token / first:.2f}x | {en.chars_per_token:.3f} | "
            f"{en.tokens - rows[0]['en'].tokens:+,} |"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--added", default="1000,4000,16000", help="numbers of added tokens, comma-separated")
    parser.add_argument("--base-vocab", type=int, default=32000, help="the stand-in base tokenizer's size")
    parser.add_argument("--no-record", action="store_true", help="print only; do not append to BENCHMARKS.md")
    parser.add_argument("--replay", action="store_true", help="also the continued runs with and without replay")
    parser.add_argument("--skip-density", action="store_true", help="only the continued runs (with --replay)")
    parser.add_argument("--scale", type=int, default=1, help="--replay: multiply the training steps by this")
    args = parser.parse_args()
    header = environment(["src/dlx/data/tokenizer_extend.py", "src/dlx/train/init/vocab_growth.py"])
    if args.replay:
        lines = replay_lines(header, args.scale)
        publish("Continued pretraining", INTRO, lines, record=not args.no_record)
    if args.skip_density:
        return
    rows, facts = measure([int(n) for n in args.added.split(",")], args.base_vocab)
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        f"### Vocabulary extension, {stamp}",
        "",
        *header,
        f"- base: {facts['base_vocab']:,}-token byte-level BPE with Llama 3's regex on the stdlib sample (stand-in)",
        f"- learned on {facts['learn_pages']} zh_CN manual pages ({facts['learn_chars']:,} characters): "
        f"{facts['merges']:,} merges in {facts['seconds']:.0f} s; held out: {facts['held_pages']} pages "
        f"({facts['held_chars']:,} characters); English: {facts['english_chars']:,} characters of the stdlib sample",
        "",
        *table(rows),
    ]
    publish("Continued pretraining", INTRO, lines, record=not args.no_record)


def replay_lines(header: list[str], scale: int) -> list[str]:
    """The continued runs of benchmarks/continue_replay.py, as BENCHMARKS.md lines."""
    import shutil
    import tempfile

    from continue_replay import ReplayPlan, replay_experiment

    plan = ReplayPlan()
    plan = ReplayPlan(base_steps=plan.base_steps * scale, continue_steps=plan.continue_steps * scale)
    learn, held = chinese_pages()
    chinese, chars = [], 0
    for page in learn:
        chinese.append(page)
        chars += len(page)
        if chars > 1_500_000:
            break
    work = Path(tempfile.mkdtemp(prefix="dlx-bench-continue-"))
    started = time.perf_counter()
    try:
        results = replay_experiment(work, stdlib_sample(3_000_000), chinese, held, plan)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    base_en = results["base (English only)"]["en"]
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        f"### Replay against forgetting (debug scale), {stamp}",
        "",
        *header,
        f"- debug preset (dim 64, 2 layers), base tokenizer {plan.base_vocab:,} + {plan.added:,} learned on "
        f"{chars:,} characters of zh_CN pages; base: {plan.base_steps} steps on English (stdlib), continuations: "
        f"{plan.continue_steps} steps each, {plan.micro_batch_size} x {plan.seq_len} tokens per step, fp32 CPU; "
        f"{time.perf_counter() - started:.0f} s in all",
        "",
        "| model | English bits/byte | drift vs base | Chinese bits/byte |",
        "|---|---:|---:|---:|",
    ]
    for name, bpb in results.items():
        drift = (bpb["en"] - base_en) / base_en
        lines.append(f"| {name} | {bpb['en']:.4f} | {drift:+.1%} | {bpb['zh']:.4f} |")
    return lines


INTRO = "Measured by `benchmarks/bench_continue.py`; see its docstring."


if __name__ == "__main__":
    main()
