"""dlx's Transformer against transformers' LlamaForCausalLM of the same config, without any trainer: forward, loss and
backward of one batch under torch.profiler, in alternating rounds; prints the per-round ratio and the busiest operators
of each side by side. Tells whether a gap in bench_peers.py lies in the model or in the training loop. A diagnostic:
nothing is recorded.

Run:  OMP_NUM_THREADS=1 .venv/bin/python benchmarks/peers/profile_models.py [--rounds 4 --steps 2]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/, so that `peers` imports as a package
from dlx.model.hf import hf_config
from dlx.model.llama import Transformer
from dlx.train.recipe import load_recipe
from peers.contenders import BATCH, SEQ, VOCAB, recipe


def build_models() -> tuple[torch.nn.Module, torch.nn.Module]:
    from transformers import LlamaConfig, LlamaForCausalLM

    args = load_recipe(None, recipe("fp32")).model.args
    torch.manual_seed(0)
    config = hf_config(args, torch.float32)
    config.pop("torch_dtype", None)
    return Transformer(args), LlamaForCausalLM(LlamaConfig(**config))


def operator_seconds(step, steps: int) -> tuple[float, dict[str, float]]:
    """Total self CPU seconds over `steps` calls, and per operator."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            step()
    per_op = {e.key: e.self_cpu_time_total / 1e6 for e in prof.key_averages()}
    return sum(per_op.values()), per_op


def interleaved(steps_by_name: dict, rounds: int, steps: int) -> tuple[dict[str, list[float]], dict[str, dict]]:
    """Per model: the total of each round, and per-operator seconds summed over rounds; the order alternates."""
    totals: dict[str, list[float]] = {name: [] for name in steps_by_name}
    ops: dict[str, dict[str, float]] = {name: {} for name in steps_by_name}
    for step in steps_by_name.values():  # untimed: allocator growth, kernel selection
        step()
    for index in range(rounds):
        for name in list(steps_by_name)[:: 1 if index % 2 == 0 else -1]:
            total, per_op = operator_seconds(steps_by_name[name], steps)
            totals[name].append(total)
            for key, seconds in per_op.items():
                ops[name][key] = ops[name].get(key, 0.0) + seconds
    return totals, ops


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4, help="interleaved rounds")
    parser.add_argument("--steps", type=int, default=2, help="profiled forward + backward passes per model per round")
    parser.add_argument("--top", type=int, default=8, help="operators to show")
    args = parser.parse_args()
    ours, hf = build_models()
    tokens = torch.randint(0, VOCAB, (BATCH, SEQ))  # (B, T)

    def step_dlx() -> None:
        logits = ours(tokens)  # (B, T, vocab)
        F.cross_entropy(logits.view(-1, VOCAB), tokens.reshape(-1)).backward()

    def step_hf() -> None:
        hf(input_ids=tokens, labels=tokens).loss.backward()

    totals, ops = interleaved({"dlx": step_dlx, "HF": step_hf}, args.rounds, args.steps)
    ratios = [d / h for d, h in zip(totals["dlx"], totals["HF"], strict=True)]
    print(
        f"demo model, seq {SEQ}, micro-batch {BATCH}, fp32, {args.rounds} rounds of {args.steps} passes, torch "
        f"threads {torch.get_num_threads()}: dlx ÷ HF per round {', '.join(f'{r:.3f}' for r in ratios)}; median "
        f"{statistics.median(ratios):.3f}"
    )
    print("| operator | dlx s | HF s |\n|---|---|---|")
    for name in sorted(ops["dlx"], key=ops["dlx"].get, reverse=True)[: args.top]:
        print(f"| {name} | {ops['dlx'][name]:.3f} | {ops['HF'].get(name, 0.0):.3f} |")


if __name__ == "__main__":
    main()
