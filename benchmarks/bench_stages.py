"""Stages (data.stages): does each stage realise the mixture it asks for, does a resume across a boundary continue on
1, 2 and 4 ranks, and what does crossing a boundary cost?

(a) Shares: three prepared datasets of counting tokens (a row's first token names its source) read by the staged
    loader as `dlx pretrain` builds it (`build_train_loader`, in-process), three stages of about 12.6 M tokens each
    (weights 0.7/0.2/0.1, then 0.2/0.3/0.5 at seq_len 1,024, then 0.5/0.25/0.25 at seq_len 4,096, where the sources'
    draws start new passes of their own). Per stage and source: the share of the stage's tokens its rows held, against
    the requested share (target within ±0.5 % absolute), and whether the loader's own count (`stage_tokens` in the
    records) equals the rows'.
(b) Resume: the debug model (fp32, SGD, global batch 8) on the stdlib's code and prose (`recipes/stdlib_corpora.py`,
    one tokenizer), stages switching the mix after step 4 and the seq_len and RoPE base after step 7, 10 steps, a
    checkpoint every step; one process uninterrupted is the reference. Uninterrupted on 2 and 4 gloo ranks (DDP, under
    torchrun), and resumed from the checkpoints of the last step of stage 0 and the first of stage 1 on 1, 2 and 4
    ranks from a run on another world size: the largest loss difference from the reference over the 10 steps. The
    windows each step reads do not depend on the world size (tests/unit/test_staged_loader.py checks it row for row);
    across world sizes the losses differ by the order of gloo's float sums only. 1 → 1 is compared bit for bit.
(c) Boundary cost: the stdlib pair, a 1.2 M-parameter model (dim 128, 2 layers, vocab 4,096), one loader worker
    process, three stages of 40 steps (the mix switches after step 40; the seq_len doubles and the RoPE base changes
    after step 80); `log.every 1`. Per boundary and repetition: the step time of the step that crosses it against
    the median step of the stage it enters (its other steps); the next stage's worker starts 32 micro-batches before.

Run:  .venv/bin/python benchmarks/bench_stages.py [--only shares,resume,boundary] [--repeats 3] [--no-record]
      (OMP_NUM_THREADS=1 is set for the training runs; everything is made in a temporary folder)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from dlx.data.shards import Manifest, ShardInfo, sha256_file, write_manifest
from dlx.train.build.data import build_train_loader
from dlx.train.config import build_config
from peers.record import ROOT, environment, publish

SECTION = "Stages"
INTRO = "Measured by `benchmarks/bench_stages.py` and `benchmarks/bench_stages_ablation.py`; see their docstrings."
SOURCE_TOKENS = 1 << 21
"""Tokens in each counting dataset; source i holds i·2^21 … (i+1)·2^21 − 1."""
SHARE_STAGES = [
    {"until": 1540, "mix": {"a": 0.7, "b": 0.2, "c": 0.1}},
    {"until": 3080, "mix": {"a": 0.2, "b": 0.3, "c": 0.5}},
    {"mix": {"a": 0.5, "b": 0.25, "c": 0.25}, "seq_len": 4096},
]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def counting_dataset(folder: Path, index: int) -> Path:
    """A prepared dataset whose train split is index·2^21 … (index+1)·2^21 − 1 (uint32), with a tiny val split."""
    folder.mkdir(parents=True)
    first = index * SOURCE_TOKENS
    shards = []
    for split, part in (("train", np.arange(first, first + SOURCE_TOKENS)), ("val", np.arange(first, first + 9000))):
        path = folder / f"{split}-00000.bin"
        part.astype("<u4").tofile(path)
        shards.append(ShardInfo(name=path.name, split=split, tokens=len(part), documents=1, sha256=sha256_file(path)))
    (folder / "tokenizer.json").write_text('{"model": {"type": "BPE", "vocab": {}, "merges": []}}')
    sha = sha256_file(folder / "tokenizer.json")
    manifest = Manifest(
        dtype="uint32", vocab_size=1 << 23, eos_id=0, tokenizer_sha256=sha, shards=shards, complete=True
    )
    write_manifest(folder, manifest)
    return folder


def shares(root: Path) -> list[str]:
    folders = {name: counting_dataset(root / name, i) for i, name in enumerate("abc")}
    stages = [dict(s, mix={str(folders[k]): w for k, w in s["mix"].items()}) for s in SHARE_STAGES]
    data = {"mix": stages[0]["mix"], "seq_len": 1024, "micro_batch_size": 8, "num_workers": 0, "stages": stages}
    model = {"preset": "debug", "vocab_size": 1 << 23, "max_seq_len": 4096}
    config = build_config({"model": model, "data": data, "train": {"max_steps": 4620}})
    loader = build_train_loader(config, torch.device("cpu"))
    counts: list[dict[str, int]] = [dict.fromkeys("abc", 0) for _ in stages]
    reported, start = [], time.perf_counter()
    for _ in range(4620):
        stage = loader.stage
        inputs = next(loader)[0]
        for source, n in zip(*np.unique(inputs[:, 0].numpy() // SOURCE_TOKENS, return_counts=True), strict=True):
            counts[stage]["abc"[source]] += int(n) * inputs.shape[1]
        if loader.stage != stage:  # the stage's last micro-batch: its count as the records give it
            reported.append(loader.stage_source_tokens())
    reported.append(loader.stage_source_tokens())
    seconds = time.perf_counter() - start
    lines = [f"(a) realised shares, {sum(sum(c.values()) for c in counts) / 1e6:.1f} M tokens read in {seconds:.0f} s"]
    lines += [
        "",
        "| stage | seq_len | tokens | source | requested | realised | difference | in windows |",
        "|---:|---:|---:|---|---:|---:|---:|---:|",
    ]
    worst = 0.0
    for index, (stage, count) in enumerate(zip(SHARE_STAGES, counts, strict=True)):
        total, weights = sum(count.values()), stage["mix"]
        for name in "abc":
            asked, got = weights[name] / sum(weights.values()), count[name] / total
            worst = max(worst, abs(got - asked))
            seq_len = stage.get("seq_len", 1024)
            windows = (count[name] - asked * total) / seq_len
            lines.append(
                f"| {index} | {seq_len:,} | {total:,} | {name} | {asked:.2%} | {got:.4%} | {got - asked:+.4%} | "
                f"{windows:+.1f} |"
            )
    same = reported == counts
    lines += [
        "",
        f"Largest difference {worst:.4%} absolute (target ±0.5 %); the loader's own counts equal the rows': "
        f"{'yes' if same else 'NO'}.",
    ]
    return lines


def stdlib_pair(root: Path) -> dict[str, Path]:
    """The stdlib's code and prose as two prepared datasets with one 4,096-token BPE trained on both."""
    text = root / "text"
    subprocess.run(
        [sys.executable, str(ROOT / "recipes" / "stdlib_corpora.py"), str(text)],
        check=True,
        env=ENV,
        capture_output=True,
    )
    both = root / "both"
    dlx(
        [
            "prepare",
            str(text / "code.jsonl"),
            str(text / "prose.jsonl"),
            "--train-tokenizer",
            "4096",
            "--out",
            str(both),
        ]
    )
    out = {}
    for name, val in (("code", "20"), ("prose", "40")):
        out[name] = root / name
        dlx(
            [
                "prepare",
                str(text / f"{name}.jsonl"),
                "--tokenizer",
                str(both),
                "--val-documents",
                val,
                "--out",
                str(out[name]),
            ]
        )
    return out


def dlx(args: list[str], ranks: int = 0, timeout: float = 900) -> None:
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(ranks)]
    command = [*([*launcher, "-m", "dlx"] if ranks else [sys.executable, "-m", "dlx"]), *args]
    result = subprocess.run(command, env=ENV, capture_output=True, text=True, timeout=timeout)
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(command[:8])} ... failed:\n{result.stderr[-3000:]}")


def losses(run_dir: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())}


def resume_args(pair: dict[str, Path]) -> list[str]:
    stages = [
        {"until": 4},
        {"until": 7, "mix": {str(pair["code"]): 0.3, str(pair["prose"]): 0.7}},
        {"seq_len": 64, "rope_theta": 20000.0},
    ]
    argv = [
        "--model.preset",
        "debug",
        "--model.vocab_size",
        "4096",
        "--data.seq_len",
        "32",
        "--data.micro_batch_size",
        "1",
    ]
    argv += [
        "--train.global_batch_size",
        "8",
        "--train.optimizer",
        "sgd",
        "--train.lr",
        "0.5",
        "--train.warmup_ratio",
        "0",
    ]
    argv += ["--train.max_steps", "10", "--train.precision", "fp32", "--eval.every", "0", "--checkpoint.every", "1"]
    argv += ["--checkpoint.keep_last", "20", "--log.every", "1", "--log.progress", "false", "--data.num_workers", "1"]
    return [*argv, "--data.mix", f"{pair['code']}=1", "--data.stages", json.dumps(stages)]


def cut(run_dir: Path, step: int, copy: Path) -> Path:
    subprocess.run(["cp", "-r", str(run_dir), str(copy)], check=True)
    for checkpoint in (copy / "checkpoints").iterdir():
        if int(checkpoint.name.removeprefix("step-")) > step:
            subprocess.run(["rm", "-r", str(checkpoint)], check=True)
    return copy


def resume(root: Path, pair: dict[str, Path]) -> list[str]:
    args = resume_args(pair)
    strategy = ["--parallel.strategy", "ddp"]
    runs = {1: root / "r1"}
    dlx(["pretrain", *args, "--run-dir", str(runs[1])])
    for ranks in (2, 4):
        runs[ranks] = root / f"r{ranks}"
        dlx(["pretrain", *args, *strategy, "--run-dir", str(runs[ranks])], ranks=ranks)
    reference = losses(runs[1])
    rows = [("uninterrupted", ranks, ranks, None, losses(runs[ranks])) for ranks in (2, 4)]
    for before, after, step in ((1, 1, 4), (1, 1, 5), (1, 2, 4), (1, 4, 5), (2, 1, 5), (4, 1, 4), (4, 2, 5), (2, 4, 4)):
        resumed = cut(runs[before], step, root / f"from{before}to{after}at{step}")
        layout = strategy if after > 1 else ["--parallel.strategy", "none"]
        dlx(["pretrain", "--resume", "--run-dir", str(resumed), *layout], ranks=after if after > 1 else 0)
        rows.append(("resumed", before, after, step, losses(resumed)))
    lines = ["(b) resume across a boundary (stage 0 ends at step 4; stage 1 reads another mix; stage 2 from step 8)"]
    lines += [
        "",
        "| run | written on | continued on | resumed after step | largest loss difference |",
        "|---|---:|---:|---:|---|",
    ]
    for kind, before, after, step, got in rows:
        assert sorted(got) == sorted(reference), (kind, before, after, step)
        diff = max(abs(got[s] - reference[s]) for s in reference)
        shown = "0 (bit-identical)" if got == reference else f"{diff:.2e}"
        lines.append(f"| {kind} | {before} | {after} | {step or '—'} | {shown} |")
    return lines


def boundary(root: Path, pair: dict[str, Path], repeats: int) -> list[str]:
    stages = [
        {"until": 40},
        {"until": 80, "mix": {str(pair["prose"]): 0.7, str(pair["code"]): 0.3}},
        {"seq_len": 256, "rope_theta": 20000.0},
    ]
    argv = ["--model.preset", "demo", "--model.vocab_size", "4096", "--model.dim", "128", "--model.n_layers", "2"]
    argv += ["--data.seq_len", "128", "--data.micro_batch_size", "8", "--train.max_steps", "120", "--eval.every", "0"]
    argv += ["--log.every", "1", "--log.progress", "false", "--data.num_workers", "1", "--checkpoint.keep_last", "1"]
    argv += ["--data.mix", f"{pair['code']}=0.7,{pair['prose']}=0.3", "--data.stages", json.dumps(stages)]
    table = {41: [], 81: []}
    for repeat in range(repeats):
        run = root / f"boundary{repeat}"
        dlx(["pretrain", *argv, "--run-dir", str(run)])
        records = {r["step"]: r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())}
        for first, last in ((41, 80), (81, 120)):
            normal = statistics.median(records[s]["step_s"] for s in range(first + 1, last + 1))
            table[first].append((records[first]["step_s"], normal, records[first]["data_wait_s"]))
    lines = ["(c) the step that crosses a boundary against the median step of the stage it enters, per repetition"]
    lines += [
        "",
        "| boundary | crossing step (s) | median step (s) | ratio | its data wait (s) |",
        "|---|---|---|---|---|",
    ]
    names = {41: "after step 40: mix", 81: "after step 80: seq_len 128 → 256, RoPE"}
    for first, rows in table.items():
        crossing = ", ".join(f"{c:.3f}" for c, _, _ in rows)
        normal = ", ".join(f"{n:.3f}" for _, n, _ in rows)
        ratio = ", ".join(f"{c / n:.2f}" for c, n, _ in rows)
        wait = ", ".join(f"{w:.4f}" for _, _, w in rows)
        lines.append(f"| {names[first]} | {crossing} | {normal} | {ratio} | {wait} |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="shares,resume,boundary")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-record", action="store_true")
    options = parser.parse_args()
    parts = options.only.split(",")
    header = [f"### Stages: {', '.join(parts)}", "", *environment(["src/dlx"]), ""]
    body: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        if "shares" in parts:
            body += [*shares(root / "shares"), ""]
        pair = stdlib_pair(root / "stdlib") if {"resume", "boundary"} & set(parts) else {}
        if "resume" in parts:
            body += [*resume(root / "resume", pair), ""]
        if "boundary" in parts:
            body += [*boundary(root / "boundary", pair, options.repeats), ""]
    publish(SECTION, INTRO, header + body, record=not options.no_record)


if __name__ == "__main__":
    main()
