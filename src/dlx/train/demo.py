"""`dlx pretrain` with no arguments: prepare the stdlib corpus (once), train the `demo` model, print a sample.

Sized to finish in 3 to 6 minutes on a 2-core CPU (3 min 15 s with native bf16, 5 min 44 s in fp32, data included:
BENCHMARKS.md): 7.1M parameters, 400 steps of 2,048 tokens (0.22 epoch of the
3.7M-token corpus), in bf16 where the CPU has it natively (about 0.4 s a step on an idle 2-core Xeon with AMX), else in
fp32 (about 0.9 s a step on a 2-core AMD EPYC without AVX512-BF16, where bf16 is emulated and 10-30x slower).
At steps 200 and 400 lm-evaluation-harness runs the shipped `dlx_stdlib_next_line` task (100 four-way questions:
which line comes next in this stdlib function; chance 25 %) on the live model, with no network (BENCHMARKS.md, Evals:
its cost and the accuracy measured); without dlx[eval] installed the demo runs without it.
`recipes/demo.yaml` is the same recipe as a file (a test keeps the two equal).
"""

from __future__ import annotations

import copy
import importlib.util
import time
from pathlib import Path
from typing import Any

from dlx.train.config import build_config

DEMO_DATA = Path("data/stdlib-8k")
"""Where the demo's dataset goes, relative to the working directory (prepared once, reused after)."""
DEMO_VOCAB = 8192
DEMO_PROMPT = "class Reader:\n    def __init__(self"
"""Steers away from the corpus's many codec tables (`0x00b6: 0x00b1,  # ...`), which a bare `def ` often starts."""

DEMO_RECIPE: dict[str, Any] = {
    "model": {"preset": "demo"},
    "data": {"path": str(DEMO_DATA), "seq_len": 256, "micro_batch_size": 8, "num_workers": 1},
    "train": {"max_steps": 400, "lr": 1.5e-3, "min_lr": 1.5e-4, "warmup_ratio": 0.05, "weight_decay": 0.1},
    "eval": {"every": 100, "batches": 10, "tasks": ["dlx_stdlib_next_line"], "tasks_every": 200, "tasks_limit": 100},
    "checkpoint": {"every": 200, "keep_last": 2},
    "log": {"every": 25},
}


def prepare_demo_data(folder: Path = DEMO_DATA):
    """The stdlib corpus as shards with a tokenizer trained on it; a second call finds it done and returns at once."""
    from dlx.data.prepare import prepare_dataset

    print(f"dlx demo: dataset {folder} (the Python standard library, {DEMO_VOCAB:,}-token BPE tokenizer)")
    start = time.perf_counter()
    manifest = prepare_dataset(None, folder, corpus="stdlib", train_tokenizer=DEMO_VOCAB)
    print(
        f"dlx demo: dataset ready in {time.perf_counter() - start:.1f} s "
        f"({manifest.split_tokens('train'):,} train / {manifest.split_tokens('val'):,} val tokens)"
    )
    return manifest


def demo_recipe(vocab_size: int) -> dict[str, Any]:
    """The demo recipe with the model's vocabulary taken from the dataset's tokenizer; without lm-evaluation-harness
    installed, without the task evaluation (said on the console)."""
    recipe = copy.deepcopy(DEMO_RECIPE)
    recipe["model"]["vocab_size"] = vocab_size
    if importlib.util.find_spec("lm_eval") is None:
        print("dlx demo: no task accuracy (eval.tasks): lm-evaluation-harness is missing, pip install 'dlx[eval]'")
        for key in ("tasks", "tasks_every", "tasks_limit"):
            recipe["eval"].pop(key, None)
    return recipe


def run_demo(resume: bool = False, run_dir: Path | None = None) -> int:
    from dlx.train.loop.trainer import pretrain
    from dlx.train.observers.sample import continue_text

    start = time.perf_counter()
    manifest = prepare_demo_data()
    config = build_config(demo_recipe(manifest.vocab_size))
    result = pretrain(config, "demo", run_dir, resume)
    if result.stopped_by is not None:
        return result.exit_code
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(result.run_dir / "tokenizer.json"))
    text = continue_text(result.model, tokenizer, DEMO_PROMPT, max_new_tokens=120, temperature=0.7, top_k=40)
    print(summary(result, time.perf_counter() - start))
    print("sample (temperature 0.7, top-k 40):\n" + "-" * 60 + f"\n{text}\n" + "-" * 60)
    print(f"more: dlx generate {result.run_dir} --prompt 'import sys'")
    return 0


def summary(result, seconds: float) -> str:
    losses = [r["loss"] for r in result.records if r.get("loss") is not None]
    line = f"dlx demo: {seconds / 60:.1f} min; train loss {losses[0]:.3f} → {losses[-1]:.3f}" if losses else ""
    if result.eval_records:
        last = result.eval_records[-1]
        line += f"; val loss {last['loss']:.3f} (perplexity {last['perplexity']:.1f})"
        line += f", {last['bpb']:.3f} bits per byte" if last.get("bpb") is not None else ""
    return line + task_summary(result.run_dir)


def task_summary(run_dir: Path) -> str:
    """The shipped task's accuracy, first and last evaluation, against chance (lm-eval's acc_mutual_info, the metric
    that is at chance for an untrained model; tasks.jsonl)."""
    from dlx.evals.stdlib_task import CHOICES, STDLIB_NEXT_LINE
    from dlx.metrics.logger import TASKS_FILE, read_jsonl

    key = f"{STDLIB_NEXT_LINE}/acc_mutual_info"
    measured = [r for r in read_jsonl(run_dir / TASKS_FILE) if r.get(key) is not None]
    if not measured:
        return ""
    first, last = measured[0], measured[-1]
    return (
        f"; {STDLIB_NEXT_LINE} accuracy (acc_mutual_info) {first[key]:.0%} (step {first['step']}) → {last[key]:.0%} ± "
        f"{last.get(key + '_stderr') or 0:.0%} (step {last['step']}; chance {1 / CHOICES:.0%})"
    )
