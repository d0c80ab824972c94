"""Tokenization throughput per core: Hugging Face `encode_batch` against dlx prepare's tiktoken fast path.

Corpus (~20 MB, nothing downloaded): the interpreter's standard library sources (code), the English docstrings
extracted from them (prose), and synthesized Chinese text (common words and punctuation), shuffled together into
documents. Tokenizer: a Llama-3-shaped byte-level BPE (Llama 3 regex, ignore_merges) trained by dlx on a sample of the
same mix, or `--tokenizer PATH` (e.g. a real Llama 3 tokenizer.json).

Measured on one core (TOKENIZERS_PARALLELISM=false makes HF's encode_batch serial; tiktoken is called per document;
the table's CPU/wall column checks it), in 1 MB batches as prepare's workers
encode, the runs of each path interleaved, after an untimed warm-up:
  hf encode_batch        Tokenizer.encode_batch(texts, add_special_tokens=False): the baseline
  hf encode_batch_fast   the same without offsets: what prepare falls back to when the fast path does not apply
  dlx fast path          TiktokenEncoder.encode: the BPE converted to a tiktoken.Encoding
  dlx prepare, 1 worker  prepare_dataset(workers=1) end to end on the corpus as JSON lines: scan pass, fast-path check,
                         encode pass, shard writes and checksums; one run
MB/s counts UTF-8 bytes of document text; tokens/s counts token ids produced (no EOS). The projection for a 200 GB
corpus is 200e9 bytes / (MB/s per core), in hours, for one core (divide by the worker count).

Run:  .venv/bin/python benchmarks/bench_tokenize.py        (appends to BENCHMARKS.md; --no-record to only print)
"""

from __future__ import annotations

import argparse
import ast
import datetime
import json
import os
import random
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from tokenizers import Tokenizer

from dlx.data.prepare import prepare_dataset
from dlx.data.prepare.encoders import TiktokenEncoder
from dlx.data.prepare.inputs import InputList
from dlx.data.prepare.tokenizer import train_bpe
from peers.record import environment as shared_environment
from peers.record import package_versions, publish

ROOT = Path(__file__).resolve().parent.parent
BATCH_BYTES = 1 << 20
CORPUS_GB = 200
NOTE = (
    "The fast path's target is ≥ 4× hf encode_batch. The end-to-end row includes prepare's fixed start-up "
    "(tokenizer loads, the fast-path check against HF on a 256 KB sample) and the scan pass, which weigh heavily "
    "on 18 MB; the projection uses each row's rate as measured."
)
_HANZI = (
    "我们 中国 发展 经济 社会 问题 工作 国家 人民 历史 文化 科学 技术 研究 时间 世界 教育 学生 老师 城市 农村 "
    "政府 企业 市场 生活 环境 计算机 程序 数据 模型 语言 训练 今天 明天 已经 可以 因为 所以 但是 如果 非常 重要 "
    "需要 认为 进行 通过 关于 以及 他们 自己 这个 一个 没有 什么 时候 地方 朋友 孩子 家庭 医院 公司 银行 电话 手机 "
    "网络 信息 系统 方法 结果"
)
HANZI_WORDS = _HANZI.split()


def english_documents(files: list[Path], limit: int) -> list[str]:
    """Docstrings of the stdlib (real English prose), grouped into documents of a few KB."""
    docs, current = [], []
    for path in files:
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, ValueError):
            continue
        for node in ast.walk(tree):
            documented = isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
            if documented and (doc := ast.get_docstring(node)) and len(doc) > 80:
                current.append(doc)
                if sum(map(len, current)) > 4000:
                    docs.append("\n\n".join(current))
                    current = []
        if sum(map(len, docs)) > limit:
            break
    return docs


def chinese_documents(total_bytes: int, rng: random.Random) -> list[str]:
    """Synthesized Chinese: sentences of common words, Chinese punctuation, a few digits and Latin words."""
    docs, size = [], 0
    while size < total_bytes:
        sentences = []
        for _ in range(rng.randint(5, 60)):
            words = [rng.choice(HANZI_WORDS) for _ in range(rng.randint(4, 18))]
            if rng.random() < 0.1:
                words.insert(rng.randrange(len(words)), rng.choice(["2024年", "GPU", "Python", "3.5%", "100万"]))
            sentences.append("".join(words) + rng.choice("。。。，！？；"))
        doc = "".join(sentences) + "\n"
        docs.append(doc)
        size += len(doc.encode())
    return docs


def add_corpus_options(parser: argparse.ArgumentParser, code_mb: float, english_mb: float, chinese_mb: float) -> None:
    """--code-mb, --english-mb and --chinese-mb: the size of each part of `build_corpus`'s corpus."""
    parser.add_argument("--code-mb", type=float, default=code_mb)
    parser.add_argument("--english-mb", type=float, default=english_mb)
    parser.add_argument("--chinese-mb", type=float, default=chinese_mb)


def build_corpus(code_mb: float, english_mb: float, chinese_mb: float) -> list[str]:
    paths = [Path(f.path) for f in InputList(corpus="stdlib").measure()]
    code, size = [], 0
    for p in paths:
        if size >= code_mb * 1e6:
            break
        code.append(p.read_text(encoding="utf-8"))
        size += len(code[-1].encode())
    rng = random.Random(0)
    docs = (
        [d for d in code if d]
        + english_documents(paths, int(english_mb * 1e6))
        + chinese_documents(int(chinese_mb * 1e6), rng)
    )
    rng.shuffle(docs)
    return docs


def batches(docs: list[str]) -> list[list[str]]:
    out, current, size = [], [], 0
    for d in docs:
        current.append(d)
        size += len(d)
        if size >= BATCH_BYTES:
            out.append(current)
            current, size = [], 0
    return [*out, current] if current else out


def timed(encode: Callable[[list[str]], list[list[int]]], groups: list[list[str]]) -> tuple[float, float, list]:
    """(wall seconds, CPU seconds of this process, ids)."""
    start, cpu = time.perf_counter(), time.process_time()
    ids = [x for g in groups for x in encode(g)]
    return time.perf_counter() - start, time.process_time() - cpu, ids


def measure(json_text: str, docs: list[str], repeats: int) -> tuple[dict[str, list[float]], dict[str, float], int, int]:
    """Wall seconds per run for each path (interleaved), CPU/wall per path, total tokens, documents with equal ids."""
    hf = Tokenizer.from_str(json_text)
    fast = TiktokenEncoder(json_text)
    paths = {
        "hf encode_batch": lambda g: [e.ids for e in hf.encode_batch(g, add_special_tokens=False)],
        "hf encode_batch_fast": lambda g: [e.ids for e in hf.encode_batch_fast(g, add_special_tokens=False)],
        "dlx fast path (tiktoken)": fast.encode,
    }
    groups = batches(docs)
    for encode in paths.values():
        encode(groups[0])  # warm-up, untimed
    seconds: dict[str, list[float]] = {name: [] for name in paths}
    cpu: dict[str, float] = dict.fromkeys(paths, 0.0)
    results: dict[str, list[list[int]]] = {}
    for _ in range(repeats):
        for name, encode in paths.items():
            elapsed, cpu_seconds, results[name] = timed(encode, groups)
            seconds[name].append(elapsed)
            cpu[name] += cpu_seconds
    cpu_share = {name: cpu[name] / sum(seconds[name]) for name in paths}
    reference = results["hf encode_batch"]
    identical = sum(a == b for a, b in zip(reference, results["dlx fast path (tiktoken)"], strict=True))
    return seconds, cpu_share, sum(map(len, reference)), identical


def prepare_end_to_end(json_text: str, docs: list[str]) -> tuple[float, float]:
    with tempfile.TemporaryDirectory(prefix="dlx-bench-tokenize-") as tmp:
        corpus, tok = Path(tmp) / "corpus.jsonl", Path(tmp) / "tokenizer.json"
        corpus.write_text("".join(json.dumps({"text": d}, ensure_ascii=False) + "\n" for d in docs))
        tok.write_text(json_text)
        start, cpu = time.perf_counter(), time.process_time()
        prepare_dataset([str(corpus)], Path(tmp) / "out", tokenizer=tok, workers=1, progress=False)
        wall = time.perf_counter() - start
        return wall, (time.process_time() - cpu) / wall


def table(seconds: dict[str, list[float]], cpu_share: dict[str, float], text_bytes: int, tokens: int) -> list[str]:
    base = statistics.median(seconds["hf encode_batch"])
    rows = [
        "| path (1 core) | MB/s: median (min, max) | tokens/s (median) | × hf encode_batch | CPU/wall | "
        f"hours per core for {CORPUS_GB} GB |",
        "|---|---|---|---|---|---|",
    ]
    for name, runs in seconds.items():
        med = statistics.median(runs)
        mbs = [text_bytes / s / 1e6 for s in runs]
        hours = CORPUS_GB * 1e9 / (text_bytes / med) / 3600
        rows.append(
            f"| {name} | {text_bytes / med / 1e6:.2f} ({min(mbs):.2f}, {max(mbs):.2f}) | {tokens / med:,.0f} | "
            f"{base / med:.2f} | {cpu_share[name]:.2f} | {hours:.1f} |"
        )
    return rows


def environment(tokenizer_name: str) -> list[str]:
    """The command, git SHA, versions and hardware (peers.record), the tokenizer libraries, and the tokenizer."""
    libraries = package_versions("tokenizers", "tiktoken", "numpy")
    return [
        *shared_environment(["src/dlx", "benchmarks"]),
        f"- libraries: {libraries}",
        f"- tokenizer: {tokenizer_name}",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokenizer", type=Path, help="a tokenizer.json to measure (default: train a 32k BPE)")
    parser.add_argument("--vocab", type=int, default=32000, help="vocabulary of the trained tokenizer")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs of each path")
    add_corpus_options(parser, code_mb=12.0, english_mb=4.0, chinese_mb=4.0)
    parser.add_argument("--no-record", action="store_true", help="print only; do not append to BENCHMARKS.md")
    args = parser.parse_args()
    docs = build_corpus(args.code_mb, args.english_mb, args.chinese_mb)
    text_bytes = sum(len(d.encode()) for d in docs)
    if args.tokenizer:
        json_text, name = args.tokenizer.read_text(encoding="utf-8"), str(args.tokenizer)
    else:
        sample = docs[: len(docs) * 2 // 5]
        json_text = train_bpe(sample, args.vocab).to_str()
        name = f"byte-level BPE, vocabulary {args.vocab}, Llama 3 regex, trained by dlx on 40% of the documents"
    header = environment(name)
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # read at each call: from here on HF encodes on one core
    seconds, cpu_share, tokens, identical = measure(json_text, docs, args.repeats)
    e2e, e2e_cpu = prepare_end_to_end(json_text, docs)
    seconds["dlx prepare, 1 worker, end to end (1 run)"] = [e2e]
    cpu_share["dlx prepare, 1 worker, end to end (1 run)"] = e2e_cpu
    lines = [
        f"### {datetime.datetime.now().astimezone():%Y-%m-%d %H:%M %Z}",
        "",
        *header,
        "",
        f"{len(docs):,} documents, {text_bytes / 1e6:.1f} MB of text, {tokens:,} tokens; ids identical to hf "
        f"encode_batch on {identical:,} of {len(docs):,} documents; {args.repeats} interleaved runs per path:",
        "",
        *table(seconds, cpu_share, text_bytes, tokens),
        "",
        NOTE,
    ]
    publish(
        "Tokenization",
        "Measured by `benchmarks/bench_tokenize.py`; see its docstring.",
        lines,
        record=not args.no_record,
    )


if __name__ == "__main__":
    main()
