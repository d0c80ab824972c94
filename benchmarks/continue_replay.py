"""The replay half of benchmarks/bench_continue.py: a debug-scale continued run with 25 % replay against none.

Steps, all offline, in a temporary folder deleted at the end:
  1. a base tokenizer (byte-level BPE, Llama 3's regex) on the first characters of the stdlib sample, extended by
     `learn_merges` on the zh_CN manual pages' learning set;
  2. three datasets by `dlx prepare`: English (stdlib documents) with the base tokenizer, the same English with the
     extended tokenizer (the replay source), Chinese with the extended tokenizer;
  3. `dlx pretrain` of a base model on English, then two continuations from it by `model.init_from` (the vocabulary
     grows to the extended tokenizer): Chinese only, and data.mix Chinese 0.75 + English 0.25; same steps, same lr;
  4. bits per byte of each model on held-out English (stdlib documents after the sample) and held-out Chinese (the
     held-out manual pages), each with its own tokenizer: every token after the first of the text predicted once
     (windows of seq_len + 1 tokens overlapping by one), the summed cross-entropy in bits over the text's UTF-8 bytes.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from dlx.data.prepare.tokenizer import train_bpe
from dlx.data.tokenizer_extend import extend_json, learn_merges, word_counts
from dlx.train.rundir.trained import load_trained, resolve_trained


@dataclass(frozen=True)
class ReplayPlan:
    """Sized for a shared 2-core CPU (a few minutes of training in all); the figures are debug-scale."""

    base_vocab: int = 4096
    added: int = 1000
    base_steps: int = 200
    continue_steps: int = 80
    seq_len: int = 128
    micro_batch_size: int = 8
    held_chars: int = 40_000


def write_jsonl(path: Path, texts: list[str]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"text": t}, ensure_ascii=False) + "\n" for t in texts), encoding="utf-8")
    return path


def dlx(*args: str) -> None:
    result = subprocess.run([sys.executable, "-m", "dlx", *args], capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"dlx {' '.join(args[:3])} failed:\n{result.stderr[-3000:]}")


def prepare(texts: Path, tokenizer: Path, out: Path) -> Path:
    dlx("prepare", str(texts), "--tokenizer", str(tokenizer), "--out", str(out), "--val-documents", "4")
    return out


TRAIN_OPTIONS = {
    "--data.num_workers": "0",
    "--train.precision": "fp32",
    "--train.warmup_ratio": "0.05",
    "--eval.every": "0",
    "--log.every": "50",
    "--log.progress": "false",
    "--log.nvml": "false",
}


def train(run_dir: Path, plan: ReplayPlan, steps: int, options: dict[str, str]) -> Path:
    shape = {"--data.seq_len": str(plan.seq_len), "--data.micro_batch_size": str(plan.micro_batch_size)}
    every = {**TRAIN_OPTIONS, **shape, "--train.max_steps": str(steps), "--run-dir": str(run_dir), **options}
    dlx("pretrain", *(part for pair in every.items() for part in pair))
    return run_dir


@torch.no_grad()
def bits_per_byte(run_dir: Path, text: str, seq_len: int) -> float:
    """The model's summed cross-entropy over every token of `text` after the first, in bits per UTF-8 byte."""
    trained = load_trained(resolve_trained(run_dir, "continue_replay"), torch.device("cpu"))
    model, tokenizer = trained.model.eval(), trained.tokenizer
    ids = torch.tensor(tokenizer.encode(text, add_special_tokens=False).ids)
    nats = 0.0
    for start in range(0, len(ids) - 1, seq_len):
        window = ids[start : start + seq_len + 1][None]
        logits = model(window[:, :-1]).float()
        nats += torch.nn.functional.cross_entropy(logits[0], window[0, 1:], reduction="sum").item()
    return nats / math.log(2) / len(text.encode("utf-8"))


def replay_experiment(
    work: Path, english: list[str], chinese: list[str], held_chinese: list[str], plan: ReplayPlan
) -> dict[str, dict[str, float]]:
    """Bits per byte on held-out English and Chinese of the base model and of both continuations."""
    held_english = "\n".join(english[len(english) * 9 // 10 :])[: plan.held_chars]
    train_english = english[: len(english) * 9 // 10]
    held_zh = "\n".join(held_chinese)[: plan.held_chars]
    base = train_bpe(train_english, plan.base_vocab)
    merges = learn_merges(base, word_counts(base, chinese), plan.added)
    (work / "base").mkdir(parents=True)
    base.save(str(work / "base" / "tokenizer.json"))
    (work / "ext").mkdir()
    extended_json = extend_json(json.loads(base.to_str()), merges)[0]
    (work / "ext" / "tokenizer.json").write_text(json.dumps(extended_json, ensure_ascii=False), encoding="utf-8")
    en_text, zh_text = write_jsonl(work / "en.jsonl", train_english), write_jsonl(work / "zh.jsonl", chinese)
    en_base = prepare(en_text, work / "base", work / "en-base")
    en_ext = prepare(en_text, work / "ext", work / "en-ext")
    zh_ext = prepare(zh_text, work / "ext", work / "zh-ext")
    base_options = {"--data.path": str(en_base), "--model.preset": "debug", "--train.lr": "3e-3"}
    base_run = train(
        work / "runs" / "base", plan, plan.base_steps, {**base_options, "--model.vocab_size": str(plan.base_vocab)}
    )
    grown = {"--model.init_from": str(base_run), "--train.lr": "1e-3"}
    steps = plan.continue_steps
    runs = {
        "base (English only)": base_run,
        "continued, no replay": train(work / "runs" / "none", plan, steps, {**grown, "--data.path": str(zh_ext)}),
        "continued, 25 % replay": train(
            work / "runs" / "replay", plan, steps, {**grown, "--data.mix": f"{zh_ext}=0.75,{en_ext}=0.25"}
        ),
    }
    return {
        name: {"en": bits_per_byte(run, held_english, plan.seq_len), "zh": bits_per_byte(run, held_zh, plan.seq_len)}
        for name, run in runs.items()
    }
