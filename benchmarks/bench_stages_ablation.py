"""Does a data schedule matter, at debug scale? An anneal on the smaller, "high-quality" source with replay, against
one mixture at equal tokens.

Data: the standard library's code (2.75 M tokens) and its prose (docstrings and the language reference, 0.61 M
tokens), one 4,096-token BPE trained on both (`recipes/stdlib_corpora.py`, `dlx prepare`; the held-out validation
splits are 20 code and 40 prose documents). Model: 1.2 M parameters (demo preset at dim 128, 2 layers, vocab 4,096),
seq_len 128, micro-batch 8, 300 steps (307,200 tokens), WSD (lr 3e-3, 5 % warm-up, decay over the last 20 %, 1-sqrt,
to 3e-4), fp32, one torch thread. Two arms with the same steps, tokens and schedule:
  - one mixture: code 70 %, prose 30 % throughout;
  - anneal: the same mixture until the decay begins (`until: decay`, steps 1-240), then prose 79 %, code 21 % (the
    decay anneals on prose with 30 % replay of the first stage's mix: 0.7 + 0.3 × 0.3 prose, 0.3 × 0.7 code).
Measured at the end of each run: bits per byte on each source's held-out split (eval.batches 20 at seq_len 128) and
`dlx_stdlib_next_line` through lm-evaluation-harness in the loop (100 documents, `acc_mutual_info`: chance 25 %), for
seeds 0, 1 and 2 (train.seed: weights and data order). Reported: each arm's mean and the seeds' spread (min-max), and
the anneal's difference from one mixture per seed (same seed, same weights at step 0).

Run:  .venv/bin/python benchmarks/bench_stages_ablation.py [--seeds 3] [--steps 300] [--no-record]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

from bench_stages import INTRO, SECTION, dlx, stdlib_pair
from peers.record import environment, publish

TASK = "dlx_stdlib_next_line"
METRICS = ("code bpb", "prose bpb", f"{TASK} acc_mutual_info")


def arm_args(pair: dict[str, Path], steps: int, seed: int, anneal: bool) -> list[str]:
    code, prose = str(pair["code"]), str(pair["prose"])
    argv = ["--model.preset", "demo", "--model.vocab_size", "4096", "--model.dim", "128", "--model.n_layers", "2"]
    argv += ["--data.seq_len", "128", "--data.micro_batch_size", "8", "--data.num_workers", "0"]
    argv += ["--train.max_steps", str(steps), "--train.seed", str(seed), "--train.precision", "fp32"]
    argv += ["--train.schedule", "wsd", "--train.decay_ratio", "0.2", "--train.lr", "3e-3", "--train.min_lr", "3e-4"]
    argv += ["--eval.every", str(steps), "--eval.batches", "20", "--eval.tasks", json.dumps([TASK])]
    argv += ["--eval.tasks_limit", "100", "--log.every", "50", "--log.progress", "false", "--checkpoint.keep_last", "1"]
    argv += ["--data.mix", f"{code}=0.7,{prose}=0.3"]
    if anneal:
        argv += ["--data.stages", json.dumps([{"until": "decay"}, {"mix": {prose: 0.79, code: 0.21}}])]
    return argv


def figures(run: Path) -> dict[str, float]:
    evaluation = json.loads((run / "eval.jsonl").read_text().splitlines()[-1])
    tasks = json.loads((run / "tasks.jsonl").read_text().splitlines()[-1])
    bpb = evaluation["source_bpb"]
    return dict(zip(METRICS, (bpb["code"], bpb["prose"], tasks[f"{TASK}/acc_mutual_info"]), strict=True))


def spread(values: list[float]) -> str:
    return f"{statistics.mean(values):.4f} ({min(values):.4f}-{max(values):.4f})"


def table(results: dict[str, list[dict[str, float]]]) -> list[str]:
    seeds = len(results["one mixture"])
    lines = [f"| arm | {' | '.join(METRICS)} |", "|---|" + "---|" * len(METRICS)]
    for arm, runs in results.items():
        lines.append(
            f"| {arm}, mean (min-max over {seeds} seeds) | "
            + " | ".join(spread([r[m] for r in runs]) for m in METRICS)
            + " |"
        )
    paired = [[a[m] - b[m] for a, b in zip(results["anneal"], results["one mixture"], strict=True)] for m in METRICS]
    lines.append(
        "| anneal − one mixture, per seed | "
        + " | ".join(", ".join(f"{d:+.4f}" for d in diffs) for diffs in paired)
        + " |"
    )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--no-record", action="store_true")
    options = parser.parse_args()
    header = ["### Stages: anneal with replay against one mixture (debug scale)", "", *environment(["src/dlx"]), ""]
    results: dict[str, list[dict[str, float]]] = {"one mixture": [], "anneal": []}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        pair = stdlib_pair(root / "stdlib")
        for seed in range(options.seeds):
            for arm in results:
                run = root / f"{arm.replace(' ', '-')}-{seed}"
                dlx(["pretrain", *arm_args(pair, options.steps, seed, arm == "anneal"), "--run-dir", str(run)])
                results[arm].append(figures(run))
                print(arm, seed, results[arm][-1], flush=True)
    tokens = f"{options.steps} steps of {8 * 128:,} tokens per arm and seed"
    body = [f"{tokens}; lower bits per byte is better, higher accuracy is better.", ""]
    publish(SECTION, INTRO, header + body + table(results) + [""], record=not options.no_record)


if __name__ == "__main__":
    main()
