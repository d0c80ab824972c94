"""The seed's table row on this CPU, scaled down: dlx's training step against HF Trainer's on the same model.

The seed's row is fp32, micro-batch 16, seq 1024, activation checkpointing and AdamW on llama3.2-1b, trained by HF
Trainer as LLaMA-Factory's `stage: pt` runs it (plain Trainer on a causal LM, `gradient_checkpointing: true`); its GPU
half is next_contact.py's seed-dlx and seed-hf steps. Here the model is bench_memory_estimate's llama3.2-1b shape at
dim 512, 4 layers, a 16,384 vocabulary, and each cell (micro-batch, seq) runs three contenders:

- **dlx**: bench_memory_estimate's `train_steps` (`dlx pretrain`'s builders and step functions), fp32, activation
  checkpointing full, fused AdamW, its chunked loss.
- **HF Trainer**: `LlamaForCausalLM` on `dlx.model.hf.hf_config`, holding dlx's initial weights (`build_model` from
  the same train.seed), trained by `Trainer(TrainingArguments(gradient_checkpointing=True, optim="adamw_torch_fused",
  use_cpu=True, ...))` in fp32 on dlx's synthetic rows (labels = input_ids, as `stage: pt` gives them).
- **HF loop**: the same model with `activation_checkpointing_enable()` (what Trainer calls), fused AdamW, clip 1.0,
  `zero_grad(set_to_none=True)`: HF's model without Trainer, to tell Trainer's own cost from the model's.

Each contender runs in two fresh processes measured by bench_memory_estimate's `measure_run`: the profiler's
live-tensor peak (the quantity CUDA's `max_memory_allocated` measures, which the GPU target compares), and the RSS
high-water growth over the baseline, whose step stamps also give it/s (the steps after the first, which allocates
AdamW's state). An HF process's baseline also holds transformers imported and a tiny HF model's forward and backward,
and the initial weights it copies from. `dlx plan`'s estimate is bench_memory_estimate's `estimate` for the cell. Before
the cell runs, the same batch's loss through dlx's model and through the HF model holding its weights is compared
(HF reads one token more and shifts the labels itself): both contenders train the same model. Run from the repository
root:

    python benchmarks/bench_seed_row.py [--steps 4] [--no-record]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_memory_estimate as memory

CELLS = ((4, 256), (16, 256), (8, 512))
"""(micro-batch, seq): bench_memory_estimate's seed cell, the seed's micro-batch 16, and a longer sequence."""
CONTENDERS = ("dlx", "HF Trainer", "HF loop")
SAME_MODEL_TOLERANCE = 1e-5
"""The most dlx's and HF's first losses may differ: fp32 sums in another order, not another model (1.9e-6 measured)."""


def seed_cell(micro_batch: int, seq_len: int) -> memory.Cell:
    return memory.Cell("fp32", micro_batch, "full", seq_len)


def initial_model(cell: memory.Cell):
    """dlx's model with the weights `dlx pretrain` starts from (drawn from train.seed)."""
    import torch

    from dlx.train.build.model import build_model

    return build_model(memory.run_config(cell, 1), torch.device("cpu"))


def synthetic_batches(cell: memory.Cell, count: int) -> list:
    """The first `count` (inputs, targets) batches of the cell's run: what dlx trains on, and the HF contenders' rows
    (their labels = input_ids)."""
    import torch

    from dlx.train.build.data import build_train_loader

    loader = build_train_loader(memory.run_config(cell, count), torch.device("cpu"), 0, 1)
    try:
        return [next(loader)[:2] for _ in range(count)]
    finally:
        loader.close()


def hf_weights(model) -> tuple[dict, dict]:
    """The HF config and state dict (HF's names, the same tensors) of a dlx model."""
    import torch

    from dlx.model.hf import dlx_to_hf_name, hf_config
    from dlx.model.io import unique_state_dict

    config = hf_config(model.args, torch.float32)
    config.pop("torch_dtype", None)
    config["use_cache"] = False  # training: HF turns it off itself under checkpointing
    return config, {dlx_to_hf_name(name): t for name, t in unique_state_dict(model).items()}


def hf_model(config: dict, state: dict):
    """`LlamaForCausalLM` built as HF builds it, then given dlx's weights (lm_head is tied to the embedding)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    model = LlamaForCausalLM(LlamaConfig(**config, attn_implementation="sdpa"))
    missing, unexpected = model.load_state_dict(state, strict=False)
    if unexpected or set(missing) - {"lm_head.weight"}:
        raise RuntimeError(f"HF model does not take dlx's weights: missing {missing}, unexpected {unexpected}")
    return model


def same_model_gap(cell: memory.Cell) -> float:
    """|dlx's loss − HF's loss| on dlx's first batch from the same initial weights (HF gets the inputs and the last
    target, and shifts its labels itself)."""
    import torch

    model, (inputs, targets) = initial_model(cell), synthetic_batches(cell, 1)[0]
    hf = hf_model(*hf_weights(model))
    with torch.no_grad():
        dlx_loss = model(inputs, targets=targets).loss.item()
        window = torch.cat([inputs, targets[:, -1:]], dim=1)
        hf_loss = hf(input_ids=window, labels=window).loss.item()
    return abs(dlx_loss - hf_loss)


def warm_transformers() -> None:
    """transformers, its Trainer and a tiny Llama's forward and backward, before an HF process's baseline."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments  # noqa: F401

    tiny = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=4)
    tiny.vocab_size = 128
    ids = torch.randint(0, 128, (2, 8))
    LlamaForCausalLM(tiny)(input_ids=ids, labels=ids).loss.backward()


def hf_trainer_steps(config: dict, state: dict, rows, steps: int, watch, on_step, out_dir: Path) -> None:
    from transformers import Trainer, TrainerCallback, TrainingArguments

    class Stamp(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            on_step()

    arguments = TrainingArguments(
        output_dir=str(out_dir),
        per_device_train_batch_size=len(rows) // steps,
        max_steps=steps,
        optim="adamw_torch_fused",
        gradient_checkpointing=True,
        use_cpu=True,
        logging_strategy="no",
        save_strategy="no",
        report_to=[],
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    dataset = [{"input_ids": row, "labels": row} for row in rows]
    with watch():
        model = hf_model(config, state)
        Trainer(model=model, train_dataset=dataset, callbacks=[Stamp()], args=arguments).train()


def hf_loop_steps(config: dict, state: dict, rows, steps: int, watch, on_step) -> None:
    import torch

    batch = len(rows) // steps
    with watch():
        model = hf_model(config, state)
        model.activation_checkpointing_enable()  # what Trainer calls for gradient_checkpointing=True
        model.train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=5e-5, fused=True)
        for step in range(steps):
            ids = rows[step * batch : (step + 1) * batch]
            loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            loss.item()
            on_step()


def measure(contender: str, cell: memory.Cell, steps: int, mode: str, out_dir: Path) -> dict:
    """In this (fresh) process: the contender's `steps` steps measured by `mode`, with the seconds per step after the
    first."""
    import torch

    stamps: list[float] = []

    def stamp(*_: object) -> None:
        stamps.append(time.perf_counter())

    run: Callable[[Callable[[], AbstractContextManager]], None]
    if contender == "dlx":
        run = lambda watch: memory.train_steps(cell, steps, watch, stamp)  # noqa: E731
    else:
        warm_transformers()
        config, state = hf_weights(initial_model(cell))
        rows = torch.cat([inputs for inputs, _ in synthetic_batches(cell, steps)])
        if contender == "HF Trainer":
            run = lambda watch: hf_trainer_steps(config, state, rows, steps, watch, stamp, out_dir)  # noqa: E731
        else:
            run = lambda watch: hf_loop_steps(config, state, rows, steps, watch, stamp)  # noqa: E731
    result = memory.measure_run(run, mode)
    return {**result, "step_s": (stamps[-1] - stamps[0]) / (len(stamps) - 1)}


def in_subprocess(contender: str, cell: memory.Cell, steps: int, mode: str, out_dir: Path) -> dict:
    argv = [sys.executable, __file__, "--worker", json.dumps([contender, cell.micro_batch, cell.seq_len])]
    argv += ["--steps", str(steps), "--mode", mode, "--out", str(out_dir)]
    proc = subprocess.run(argv, capture_output=True, text=True)
    if proc.returncode != 0:
        where = f"{contender}, mb {cell.micro_batch}, seq {cell.seq_len} ({mode})"
        raise RuntimeError(f"{where} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def cell_rows(cell: memory.Cell, steps: int, out_dir: Path) -> list[str]:
    """The three contenders' peaks first, then their timed runs back to back (on a shared CPU the load drifts over
    minutes; the 1-minute load average before each timed run is shown beside its it/s)."""
    plan = memory.estimate(cell)
    peaks = {c: in_subprocess(c, cell, steps, "tensors", out_dir)["peak"] / 1e9 for c in CONTENDERS}
    rows = []
    for contender in CONTENDERS:
        load = os.getloadavg()[0]
        timed = in_subprocess(contender, cell, steps, "rss", out_dir)
        est = f"{plan.total_gb / peaks['dlx']:.4f}" if contender == "dlx" else ""
        versus = f"{peaks['dlx'] / peaks[contender]:.3f}" if contender != "dlx" else ""
        rows.append(
            f"| mb {cell.micro_batch}, seq {cell.seq_len} | {contender} | {peaks[contender]:.4f} "
            f"| {timed['growth'] / 1e9:.3f} | {1 / timed['step_s']:.3f} ({load:.1f}) | {est} | {versus} |"
        )
        print(rows[-1], flush=True)
    return rows


def table(steps: int, out_dir: Path) -> list[str]:
    rows = [
        "| cell (fp32, AC full) | contender | tensor peak GB | RSS growth GB | it/s (load) | est. ÷ dlx peak "
        "| dlx ÷ this peak |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for micro_batch, seq_len in CELLS:
        rows += cell_rows(seed_cell(micro_batch, seq_len), steps, out_dir)
    return rows


INTRO = (
    "Measured by `benchmarks/bench_seed_row.py`: the seed's table row (fp32, activation checkpointing, AdamW) on this "
    "CPU at a scaled-down llama3.2-1b shape: dlx's step, HF Trainer's (as LLaMA-Factory's `stage: pt` runs it) and a "
    "plain HF loop on the same initial weights, and `dlx plan`'s estimate; see its docstring."
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--steps", type=int, default=4, help="Optimizer steps per process (it/s over those after the first)."
    )
    parser.add_argument("--no-record", action="store_true", help="Print only; do not append to BENCHMARKS.md.")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--mode", choices=("rss", "tensors"), help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        contender, micro_batch, seq_len = json.loads(args.worker)
        print(json.dumps(measure(contender, seed_cell(micro_batch, seq_len), args.steps, args.mode, Path(args.out))))
        return
    import tempfile

    from peers.record import environment, publish

    header = environment(["src/dlx", "benchmarks"])
    gap = same_model_gap(seed_cell(*CELLS[0]))
    if gap > SAME_MODEL_TOLERANCE:
        raise SystemExit(f"dlx and HF do not start from the same model: their losses differ by {gap:.2e}")
    with tempfile.TemporaryDirectory() as out:
        rows = table(args.steps, Path(out))
    model = ", ".join(f"{k} {v}" for k, v in memory.MODEL.items())
    lines = [
        f"### {datetime.datetime.now().astimezone():%Y-%m-%d %H:%M %Z} — the seed's row, scaled down, CPU",
        "",
        *header,
        f"- model: {model}; synthetic data, {args.steps} optimizer steps per process (it/s over the last "
        f"{args.steps - 1}), fp32, fused AdamW",
        f"- same model: |dlx loss − HF loss| on dlx's first batch from the same initial weights = {gap:.2e}",
        "",
        *rows,
    ]
    publish("Seed row", INTRO, lines, record=not args.no_record)


if __name__ == "__main__":
    main()
