"""`dlx plan`'s memory estimate against what dlx's own training step uses, on this CPU, cell by cell.

Each cell (a precision, micro-batch and activation checkpointing on a scaled-down llama3.2-1b: its head layout, FFN
ratio and tied embedding at dim 512, 4 layers, a 16,384 vocabulary) runs twice, each time in a fresh process that
builds the run as `dlx pretrain` does (the recipe's builders: meta model, strategy, fused AdamW, synthetic loader) and
takes `--steps` optimizer steps through the loop's own `accumulate_gradients` and `strategy.optimizer_step`:

- **RSS growth**: the process's resident-set high-water mark (`VmHWM`, reset by `clear_refs` 5 after the baseline)
  minus its RSS at the baseline, taken once torch and dlx are imported and a tiny forward/backward has started
  torch's thread pool and kernels in both dtypes: the memory the run adds to a process that already holds the
  runtime, the C allocator's retained heaps included (which the estimate does not model; BENCHMARKS.md says why).
- **tensor peak**: the largest sum of live tensor bytes over the same steps, from the allocator's events in
  `torch.profiler` (`profile_memory`): what the estimate's terms count, without the allocator's slack or Python.

The estimate is `plan_memory(args, TrainingShape(..., device_type="cpu"))`, called directly: the peak of live tensors
(the quantity CUDA's `max_memory_allocated` measures). Its goal: at or above the tensor peak and within 15 % of it in
every cell. The RSS growth beside it shows what the CPU's allocator adds on top. Run from the repository root:

    python benchmarks/bench_memory_estimate.py [--steps 3] [--no-record]
"""

from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

MODEL = {
    "preset": "llama3.2-1b",
    "dim": 512,
    "n_layers": 4,
    "n_heads": 8,
    "n_kv_heads": 2,
    "vocab_size": 16384,
    "max_seq_len": 512,
}
"""llama3.2-1b's shape at small scale: 8 query heads over 2 kv heads (its 4:1), head dim 64, FFN 1.5 × 8/3 · dim,
tied embedding; 23.1M parameters, a step of one to a few seconds on two cores."""
SEQ_LEN = 256


@dataclass(frozen=True)
class Cell:
    precision: str
    micro_batch: int
    checkpointing: str
    seq_len: int = SEQ_LEN

    def label(self) -> str:
        return f"{self.precision}, mb {self.micro_batch}, AC {self.checkpointing}"


CELLS = (
    Cell("fp32", 4, "full"),  # the seed table's settings (fp32, activation checkpointing) at small scale
    Cell("fp32", 1, "full"),
    Cell("fp32", 4, "none"),
    Cell("bf16", 1, "none"),
    Cell("bf16", 4, "none"),
    Cell("bf16", 4, "full"),
    Cell("bf16", 4, "selective"),
)


def run_config(cell: Cell, steps: int):
    from dlx.train.config import build_config

    return build_config(
        {
            "model": dict(MODEL),
            "data": {"path": "synthetic", "seq_len": cell.seq_len, "micro_batch_size": cell.micro_batch},
            "train": {"max_steps": steps, "precision": cell.precision, "device": "cpu"},
            "parallel": {"activation_checkpointing": cell.checkpointing},
            "log": {"progress": False},
        }
    )


def warm_runtime() -> None:
    """The baseline the run's growth is measured from: dlx's training modules imported, a debug-preset model built on
    the meta device (its first meta-device build imports about 800 more modules, some 75 MB, whatever the model's
    size), and a tiny forward and backward in fp32 and under bf16 autocast (torch's thread pool, oneDNN, autograd)."""
    import torch

    import dlx.train.loop.trainer  # noqa: F401
    from dlx.model.llama import Transformer
    from dlx.model.presets import resolve_model_args

    with torch.device("meta"):
        Transformer(resolve_model_args("debug"))
    layer = torch.nn.Linear(64, 64)
    for enabled in (False, True):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=enabled):
            layer(torch.randn(8, 64)).float().sum().backward()


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        import os

        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def high_water_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def train_steps(
    cell: Cell,
    steps: int,
    watch: Callable[[], AbstractContextManager] = nullcontext,
    on_step: Callable[[float], None] = lambda loss: None,
) -> None:
    """`steps` optimizer steps as `dlx pretrain` takes them (the same builders and step functions); `watch` is entered
    once the loader is built (the synthetic loader's token-frequency table is the loader's, not the run's); `on_step`
    gets each step's loss once its optimizer step is done (bench_seed_row times the steps with it)."""
    import torch

    from dlx.metrics.timing import PhaseTimer
    from dlx.parallel.distributed import env_from_torchrun
    from dlx.precision import build_precision
    from dlx.train.build.data import build_train_loader
    from dlx.train.build.step_plan import plan_steps
    from dlx.train.loop.trainer import accumulate_gradients
    from dlx.train.run import build_run_strategy, meta_model

    config = run_config(cell, steps)
    device, env = torch.device("cpu"), env_from_torchrun()
    precision = build_precision(cell.precision, device)
    loader = build_train_loader(config, device, env.dp_rank, env.dp_size)
    try:
        with watch():
            plan = plan_steps(config, loader.batches_per_epoch, loader.windows_per_epoch, env.dp_size, env.tp)
            strategy = build_run_strategy(meta_model(config), config, device, env, precision, plan)
            timer = PhaseTimer(device)
            for _ in range(steps):
                loss = accumulate_gradients(strategy.train_model, loader, plan.grad_accum, precision, timer, strategy)
                value = loss.item()
                strategy.optimizer_step()
                timer.end_step()
                on_step(value)
    finally:
        loader.close()


def measure(cell: Cell, steps: int, mode: str) -> dict:
    """In this (fresh) process: `rss` (high-water growth over the baseline) or `tensors` (the profiler's peak)."""
    return measure_run(lambda watch: train_steps(cell, steps, watch), mode)


def measure_run(run: Callable[[Callable[[], AbstractContextManager]], None], mode: str) -> dict:
    """`run(watch)` in this (fresh) process, measured by `mode` from the baseline `warm_runtime` leaves; `watch` is
    the context `run` enters around the part it measures."""
    warm_runtime()
    if mode == "rss":
        baseline = rss_bytes()
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # VmHWM back to the current RSS
        run(nullcontext)
        return {"baseline": baseline, "growth": high_water_bytes() - baseline}
    from torch.profiler import ProfilerActivity, profile

    prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
    run(lambda: prof)
    return {"peak": live_tensor_peak(prof)}


def live_tensor_peak(prof) -> int:
    """The largest sum of live tensor bytes in a finished `profile_memory` profile: its allocations (positive) and
    frees (negative) in time order."""
    events = sorted((e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events() if e.name() == "[memory]")
    live = peak = 0
    for _, nbytes in events:
        live += nbytes
        peak = max(peak, live)
    return peak


def estimate(cell: Cell):
    from dlx.metrics.estimate import TrainingShape, plan_memory
    from dlx.model.presets import resolve_model_args

    overrides = {k: v for k, v in MODEL.items() if k != "preset"}
    args = resolve_model_args(MODEL["preset"], **overrides)
    shape = TrainingShape(
        seq_len=cell.seq_len,
        micro_batch=cell.micro_batch,
        precision=cell.precision,
        activation_checkpointing=cell.checkpointing,
        device_type="cpu",
    )
    return plan_memory(args, shape)


def in_subprocess(cell: Cell, steps: int, mode: str) -> dict:
    argv = [sys.executable, __file__, "--worker", json.dumps([cell.precision, cell.micro_batch, cell.checkpointing])]
    argv += ["--steps", str(steps), "--mode", mode]
    proc = subprocess.run(argv, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{cell.label()} ({mode}) failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def table(steps: int) -> list[str]:
    rows = [
        "| cell | est. terms GB: weights + grads + AdamW + activations + loss | est. peak GB (phase) | tensor peak GB "
        "| est. − tensor peak KB | est. ÷ tensor peak | RSS growth GB | est. ÷ RSS growth |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for cell in CELLS:
        plan = estimate(cell)
        tensors = in_subprocess(cell, steps, "tensors")["peak"] / 1e9
        rss = in_subprocess(cell, steps, "rss")["growth"] / 1e9
        parts = (plan.weights_gb, plan.grads_gb, plan.optimizer_gb, plan.activations_gb, plan.logits_gb)
        rows.append(
            f"| {cell.label()} | {' + '.join(f'{x:.3f}' for x in parts)} | {plan.total_gb:.4f} ({plan.peak_phase}) "
            f"| {tensors:.4f} | {(plan.total_gb - tensors) * 1e6:+.1f} | {plan.total_gb / tensors:.4f} | {rss:.3f} "
            f"| {plan.total_gb / rss:.2f} |"
        )
        print(rows[-1], flush=True)
    return rows


INTRO = (
    "Measured by `benchmarks/bench_memory_estimate.py`: `dlx plan`'s estimate beside what dlx's own steps use on this "
    "CPU (RSS growth over a process holding torch and dlx; the profiler's live-tensor peak); see its docstring."
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--steps",
        type=int,
        default=6,
        help="Optimizer steps per cell (the first allocates AdamW; the RSS high-water settles by the fifth).",
    )
    parser.add_argument("--no-record", action="store_true", help="Print only; do not append to BENCHMARKS.md.")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--mode", choices=("rss", "tensors"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(measure(Cell(*json.loads(args.worker)), args.steps, args.mode)))
        return
    from peers.record import environment, publish

    header = environment(["src/dlx", "benchmarks"])
    rows = table(args.steps)
    model = ", ".join(f"{k} {v}" for k, v in MODEL.items())
    lines = [
        f"### {datetime.datetime.now().astimezone():%Y-%m-%d %H:%M %Z} — estimate against measured, CPU",
        "",
        *header,
        f"- model: {model}; seq {SEQ_LEN}, synthetic data, {args.steps} optimizer steps per cell, fused AdamW",
        "",
        *rows,
    ]
    publish("Memory estimate", INTRO, lines, record=not args.no_record)


if __name__ == "__main__":
    main()
