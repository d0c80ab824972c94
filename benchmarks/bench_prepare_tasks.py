"""`dlx prepare` across machines: one machine against N tasks + merge, the merge of 10,000 work units, and a projection
for 5 TB on 16 nodes × 64 cores.

1. One machine vs two tasks. The corpus of bench_tokenize.py (stdlib code, English docstrings, synthetic Chinese) as
   JSON lines files, a 32k BPE trained on 40 % of it. Per round, interleaved (the order alternates): `dlx prepare
   --workers 2` (one machine, both cores), and two `dlx prepare --tasks 2 --task-index I --workers 1` processes
   started together followed by `dlx prepare --merge --workers 2`. Wall clocks are of whole commands (process start
   included); MB/s counts input bytes. The merged folder is compared byte for byte with the one-machine folder each
   round. On a copy of the task folders, in this process: the rate of a merge worker's copy loop (`parts.copy_split`
   into a `ShardWriter`: read, route, write, SHA-256, fsync; every part 5 times over, page cache warm), and a whole
   `merge_tasks(workers=1)` (no process start).
2. Merge of 10,000 work units: a JSON lines file of 10,000 documents cut into ~10,000 units (the unit size lowered in
   this process), encoded by two tasks; then `dlx prepare --merge` with 1 and 2 workers: wall clock and peak resident
   memory (the merging process's VmHWM, also once dlx is imported; its workers polled). The same corpus in 100 units
   separates the cost per unit.
3. JSON array reading: `readers.read_file` on the corpus as one JSON array (ijson) and as JSON lines, MB/s.
4. Projection for 5 TB on 16 nodes × 64 cores, from the per-core fast-path rate in BENCHMARKS.md's Tokenization
   section and the merge rates measured here; every assumption is printed with it.

Run:  .venv/bin/python benchmarks/bench_prepare_tasks.py     (appends to BENCHMARKS.md; --no-record to only print)
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import psutil

from bench_tokenize import add_corpus_options, build_corpus
from dlx.data.prepare import merge_tasks, prepare_task, units
from dlx.data.prepare.inputs import InputList
from dlx.data.prepare.parts import copy_split
from dlx.data.prepare.readers import read_file
from dlx.data.prepare.tokenizer import train_bpe
from dlx.data.prepare.writer import ShardWriter
from dlx.data.shards import read_manifest
from peers.record import environment as shared_environment
from peers.record import package_versions, publish

ROOT = Path(__file__).resolve().parent.parent
SECTION = "Prepare across machines"
CORPUS_TB = 5.0
NODES, CORES = 16, 64
SYNTHETIC_DOC_CHARS = 1000


def dlx(*args: str) -> list[str]:
    return [sys.executable, "-m", "dlx", "prepare", *args, "--no-progress"]


def run(cmds: list[list[str]]) -> float:
    """Wall seconds for commands started together, until the last ends."""
    start = time.perf_counter()
    procs = [subprocess.Popen(c, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) for c in cmds]
    for proc in procs:
        _, err = proc.communicate()
        if proc.returncode:
            raise RuntimeError(f"{shlex.join(proc.args)} failed:\n{err}")
    return time.perf_counter() - start


def folder_bytes(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def write_corpus(folder: Path, docs: list[str], n_files: int) -> list[str]:
    folder.mkdir()
    per_file = math.ceil(len(docs) / n_files)
    for i in range(n_files):
        lines = (json.dumps({"text": d}, ensure_ascii=False) + "\n" for d in docs[i * per_file : (i + 1) * per_file])
        (folder / f"part-{i:02d}.jsonl").write_text("".join(lines))
    return [str(folder)]


def one_vs_tasks(tmp: Path, inputs: list[str], tok: Path, rounds: int) -> dict:
    """Part 1: interleaved rounds of one machine (2 workers) and 2 tasks (1 worker each) + merge (2 workers)."""
    common = ["--tokenizer", str(tok)]
    times: dict[str, list[float]] = {
        "one": [],
        "tasks": [],
        "merge": [],
        "merge_inprocess": [],
        "copy_mbs": [],
        "copy_cpu_mbs": [],
    }
    identical = True
    for r in range(rounds):
        one, split = tmp / f"one{r}", tmp / f"split{r}"
        steps = [("one", lambda o=one: run([dlx(*inputs, "--out", str(o), *common, "--workers", "2")]))]
        steps.append(
            (
                "tasks",
                lambda s=split: run(
                    [
                        dlx(*inputs, "--out", str(s), *common, "--workers", "1", "--tasks", "2", "--task-index", str(i))
                        for i in range(2)
                    ]
                ),
            )
        )
        for name, step in steps if r % 2 == 0 else reversed(steps):
            times[name].append(step())
        copy = tmp / f"copy{r}"
        shutil.copytree(split, copy)
        times["merge"].append(run([dlx("--out", str(split), "--merge", "--workers", "2")]))
        wall_mbs, cpu_mbs = copy_rate(copy, tmp / f"copy-rate{r}")
        times["copy_mbs"].append(wall_mbs)
        times["copy_cpu_mbs"].append(cpu_mbs)
        start = time.perf_counter()
        merge_tasks(copy, workers=1, progress=False)
        times["merge_inprocess"].append(time.perf_counter() - start)
        identical &= folder_bytes(one) == folder_bytes(split) == folder_bytes(copy)
        manifest = read_manifest(one)
        shutil.rmtree(one), shutil.rmtree(split), shutil.rmtree(copy)
    token_bytes = sum(s.tokens for s in manifest.shards) * (2 if manifest.dtype == "uint16" else 4)
    return {"times": times, "identical": identical, "manifest": manifest, "token_bytes": token_bytes}


def copy_rate(folder: Path, scratch: Path, repeats: int = 5) -> tuple[float, float]:
    """MB/s of token bytes through one merge worker's copy loop, per second of wall clock and per second of this
    process's CPU time: every part of `folder`, `repeats` times, into one shard file (all documents in train: val is
    ~0.5 % of a real corpus and costs one more run per val document)."""
    plan = json.loads((folder / ".tasks" / "plan.json").read_text())
    dtype = np.dtype("uint16" if plan["tokenizer"]["vocab_size"] <= 2**16 else "uint32").newbyteorder("<")
    paths = sorted(folder.glob(".tasks/task-*/*.tok"))
    scratch.mkdir()
    writer = ShardWriter(scratch, "train", dtype.name, 2**62, plan["tokenizer"]["eos_id"])
    start, cpu = time.perf_counter(), time.process_time()
    copied = sum(
        copy_split((tok, tok.with_suffix(".doc")), 0, "train", dtype, writer.write)
        for _ in range(repeats)
        for tok in paths
    )
    writer.close()
    seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu
    shutil.rmtree(scratch)
    return copied * dtype.itemsize / seconds / 1e6, copied * dtype.itemsize / cpu_seconds / 1e6


def merge_memory(out: Path, workers: int) -> tuple[float, float, float, float]:
    """(wall s, peak RSS MB of the merging process, its RSS MB once dlx is imported (before merging), largest RSS MB
    seen of a worker) of `dlx prepare --merge`. The merging process reports its own VmHWM (exact); workers are polled
    every 20 ms."""
    code = (
        "import re, sys; from pathlib import Path; from dlx.cli.app import main\n"
        "def hwm(): return int(re.search(r'VmHWM:\\s+(\\d+)', Path('/proc/self/status').read_text()).group(1))\n"
        f"base = hwm(); sys.argv = ['dlx', 'prepare', '--out', {str(out)!r}, '--merge', '--workers', '{workers}', "
        "'--no-progress']\n"
        "try:\n    main()\nexcept SystemExit as e:\n    assert not e.code, e.code\n"
        "print(hwm(), base)"
    )
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    worker_peak = 0
    while proc.poll() is None:
        try:
            rss = [c.memory_info().rss for c in psutil.Process(proc.pid).children()]
        except psutil.Error:
            rss = []
        worker_peak = max([worker_peak, *rss])
        time.sleep(0.02)
    out_text, err = proc.communicate()
    wall = time.perf_counter() - start
    if proc.returncode:
        raise RuntimeError(f"merge failed:\n{err}")
    peak, base = map(int, out_text.split()[-2:])
    return wall, peak / 1024, base / 1024, worker_peak / 2**20


def many_units(tmp: Path, tok: Path, n_units: int) -> dict:
    """Part 2: a corpus cut into n_units units and into 100, each encoded by 2 tasks in this process, then merged."""
    docs = [f"{i} " + ("word " * (SYNTHETIC_DOC_CHARS // 5))[: SYNTHETIC_DOC_CHARS - 8] for i in range(n_units)]
    path = tmp / "units" / "docs.jsonl"
    path.parent.mkdir()
    path.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    results = {}
    saved = units.MIN_UNIT_BYTES, units.UNITS_PER_CORPUS
    try:
        for wanted in (n_units, 100):
            units.MIN_UNIT_BYTES, units.UNITS_PER_CORPUS = 1, wanted
            out = tmp / f"units{wanted}"
            start = time.perf_counter()
            for i in range(2):
                prepare_task([str(path)], out, tasks=2, task_index=i, tokenizer=tok, workers=1, progress=False)
            encode = time.perf_counter() - start
            plan = json.loads((out / ".tasks" / "plan.json").read_text())
            copy = tmp / f"units{wanted}-copy"
            shutil.copytree(out, copy)
            one = merge_memory(out, 1)
            two = merge_memory(copy, 2)
            manifest = read_manifest(out)
            results[wanted] = {"units": plan["units"], "encode": encode, "w1": one, "w2": two, "manifest": manifest}
    finally:
        units.MIN_UNIT_BYTES, units.UNITS_PER_CORPUS = saved
    return results


def json_array_rates(tmp: Path, docs: list[str], rounds: int) -> dict[str, float]:
    """Part 3: MB/s of reading the documents from one JSON array file (ijson) and from JSON lines."""
    array, lines = tmp / "docs.json", tmp / "docs.jsonl"
    array.write_text(json.dumps([{"id": i, "text": d} for i, d in enumerate(docs)], ensure_ascii=False))
    lines.write_text("".join(json.dumps({"id": i, "text": d}, ensure_ascii=False) + "\n" for i, d in enumerate(docs)))
    rates: dict[str, list[float]] = {"JSON array (ijson)": [], "JSON lines": []}
    for _ in range(rounds):
        for name, path in (("JSON array (ijson)", array), ("JSON lines", lines)):
            [f] = list(InputList((str(path),)).measure())
            start = time.perf_counter()
            n = sum(isinstance(item, str) for item in read_file(f, "text"))
            assert n == len(docs)
            rates[name].append(f.size / (time.perf_counter() - start) / 1e6)
    return {name: statistics.median(r) for name, r in rates.items()}


def fast_path_rate() -> float:
    """The per-core MB/s of the tiktoken fast path in BENCHMARKS.md's Tokenization section (the latest entry)."""
    text = (ROOT / "BENCHMARKS.md").read_text()
    section = text[text.index("\n## Tokenization\n") :]
    section = section[: section.find("\n## ", 1)]
    rows = re.findall(r"^\| dlx fast path \(tiktoken\) \| ([\d.]+) ", section, re.MULTILINE)
    return float(rows[-1])


def projection(part1: dict, part2: dict) -> list[str]:
    """Part 4: 5 TB on 16 × 64 cores, every assumption stated."""
    rate = fast_path_rate()
    total = CORPUS_TB * 1e12
    encode_s = total / (NODES * CORES * rate * 1e6)
    manifest = part1["manifest"]
    bytes_per_token = manifest.source["scan"]["text_bytes"] / manifest.summary()["tokens"]
    token_bytes = total / bytes_per_token * 4
    merge_core = statistics.median(part1["times"]["copy_cpu_mbs"])
    units_big, units_small = part2[max(part2)], part2[100]
    per_unit = (units_big["w1"][0] - units_small["w1"][0]) / (units_big["units"] - units_small["units"])
    n_units = total / units.MAX_UNIT_BYTES
    merge_cpu_s = token_bytes / (merge_core * 1e6 * CORES) + n_units * per_unit / CORES
    io_s = {gbs: 2 * token_bytes / (gbs * 1e9) for gbs in (2, 10)}
    return [
        f"Projection for {CORPUS_TB:g} TB of text on {NODES} nodes × {CORES} cores (16 tasks of 64 workers, then one "
        "merge on one node of 64 workers):",
        "",
        f"- tasks: {encode_s / 60:.1f} min = {CORPUS_TB:g} TB / ({NODES * CORES} cores × {rate} MB/s), the fast path's "
        "per-core rate from the Tokenization section; assumes every core tokenizes at that rate (the end-to-end rate "
        "of part 1 is lower on 2 shared cores, mostly fixed start-up), that the shared filesystem serves "
        f"{NODES * CORES * rate / 1e3:.1f} GB/s of reads, and that the work units spread evenly (16 MB units: "
        f"{n_units:,.0f} of them, ~{n_units / NODES:,.0f} per task).",
        f"- merge, CPU side: {merge_cpu_s / 60:.1f} min = {token_bytes / 1e12:.2f} TB of tokens (uint32, as for a "
        f"Llama 3 vocabulary; {bytes_per_token:.2f} bytes of text per token as measured on this corpus with the "
        f"{manifest.vocab_size:,}-token BPE) at {merge_core:.0f} MB/s per busy core (part 1's copy loop, per CPU "
        f"second) × {CORES} workers, plus {n_units:,.0f} units × {per_unit * 1e3:.2f} ms per unit (part 2, 1 worker) / "
        f"{CORES} workers.",
        f"- merge, storage side: it reads and writes every token byte once, {2 * token_bytes / 1e12:.1f} TB in all: "
        f"{io_s[2] / 3600:.1f} h at 2 GB/s, {io_s[10] / 60:.0f} min at 10 GB/s of read+write for the merging node. "
        "The merge runs on one node, so on any real filesystem this, not tokenizing, is the longest step; its shards "
        "are independent jobs, which is what a merge spread over nodes would split.",
    ]


def environment(tok_name: str) -> list[str]:
    """The command, git SHA, versions and hardware (peers.record), the tokenizer libraries, and the tokenizer."""
    libraries = package_versions("tokenizers", "tiktoken", "ijson", "numpy")
    return [*shared_environment(["src/dlx", "benchmarks"]), f"- libraries: {libraries}", f"- tokenizer: {tok_name}"]


def report(part1: dict, part2: dict, arrays: dict, corpus_mb: float, rounds: int) -> list[str]:
    t = part1["times"]
    rows = [
        "| round | one machine, 2 workers: s (MB/s) | 2 tasks × 1 worker: s | merge, 2 workers: s | tasks + merge: s "
        "(MB/s) | ratio (tasks + merge) / one machine |",
        "|---|---|---|---|---|---|",
    ]
    for r in range(rounds):
        split = t["tasks"][r] + t["merge"][r]
        one = t["one"][r]
        rows.append(
            f"| {r + 1} | {one:.1f} ({corpus_mb / one:.1f}) | {t['tasks'][r]:.1f} | {t['merge'][r]:.1f} "
            f"| {split:.1f} ({corpus_mb / split:.1f}) | {split / one:.2f} |"
        )
    m = part1["manifest"]
    lines = [
        f"Part 1: {corpus_mb:.1f} MB of JSON lines in 8 files, {m.summary()['tokens']:,} tokens in "
        f"{len(m.shards)} {m.dtype} shards; merged folder byte-identical to the one-machine folder in every round: "
        f"{'yes' if part1['identical'] else 'NO'}.",
        "",
        *rows,
        "",
        f"In this process, on a copy of the task folders: a merge worker's copy loop moves "
        f"{statistics.median(t['copy_mbs']):.0f} MB/s of tokens per second of wall clock and "
        f"{statistics.median(t['copy_cpu_mbs']):.0f} MB/s per second of its CPU time (medians; wall-clock runs: "
        f"{', '.join(f'{x:.0f}' for x in t['copy_mbs'])}, fsync included); the whole merge with 1 worker and no "
        f"process start takes {statistics.median(t['merge_inprocess']):.2f} s for "
        f"{part1['token_bytes'] / 1e6:.1f} MB of tokens (layout, copy, SHA-256, fsyncs, manifest, deleting the parts).",
        "",
        "Part 2: merge of many work units (synthetic: 1 KB documents, one per unit; 2 tasks):",
        "",
        "| units | tokens | encode (2 tasks, in-process): s | merge, 1 worker: s, peak RSS MB (before merging) | "
        "merge, 2 workers: s, peak RSS MB (merging process / largest worker) |",
        "|---|---|---|---|---|",
    ]
    for wanted in sorted(part2, reverse=True):
        p = part2[wanted]
        lines.append(
            f"| {p['units']:,} | {p['manifest'].summary()['tokens']:,} | {p['encode']:.1f} | {p['w1'][0]:.1f}, "
            f"{p['w1'][1]:.0f} ({p['w1'][2]:.0f}) | {p['w2'][0]:.1f}, {p['w2'][1]:.0f} / {p['w2'][3]:.0f} |"
        )
    lines += [
        "",
        "Part 3: reading the documents of part 1 (medians of "
        f"{rounds}): " + ", ".join(f"{name} {mbs:.0f} MB/s" for name, mbs in arrays.items()) + ".",
        "",
    ]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds of part 1")
    parser.add_argument("--units", type=int, default=10_000, help="work units of part 2")
    parser.add_argument("--vocab", type=int, default=32000)
    add_corpus_options(parser, code_mb=24.0, english_mb=6.0, chinese_mb=8.0)
    parser.add_argument("--no-record", action="store_true", help="print only; do not append to BENCHMARKS.md")
    args = parser.parse_args()
    docs = build_corpus(args.code_mb, args.english_mb, args.chinese_mb)
    header = environment(f"byte-level BPE, vocabulary {args.vocab}, trained by dlx on 40% of the documents")
    with tempfile.TemporaryDirectory(prefix="dlx-bench-tasks-") as name:
        tmp = Path(name)
        tok = tmp / "tokenizer.json"
        tok.write_text(train_bpe(docs[: len(docs) * 2 // 5], args.vocab).to_str())
        inputs = write_corpus(tmp / "corpus", docs, 8)
        corpus_mb = sum(p.stat().st_size for p in (tmp / "corpus").iterdir()) / 1e6
        part1 = one_vs_tasks(tmp, inputs, tok, args.rounds)
        part2 = many_units(tmp, tok, args.units)
        arrays = json_array_rates(tmp, docs, args.rounds)
    lines = [
        f"### {datetime.datetime.now().astimezone():%Y-%m-%d %H:%M %Z}",
        "",
        *header,
        "",
        *report(part1, part2, arrays, corpus_mb, args.rounds),
        *projection(part1, part2),
    ]
    publish(
        SECTION, "Measured by `benchmarks/bench_prepare_tasks.py`; see its docstring.", lines, record=not args.no_record
    )


if __name__ == "__main__":
    main()
