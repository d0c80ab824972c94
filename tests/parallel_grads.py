"""Run by torchrun from tests/integration/test_parallel.py: after one accumulated step through dlx's own
`accumulate_gradients` (DDP without sync on the first micro-step, FSDP2 likewise), every rank's gradients must equal the
gradients that one process computes on all ranks' micro-batches together, and so each other. Writes the largest
differences as JSON."""

from __future__ import annotations

import copy
import gc
import json
import sys

import torch
import torch.distributed as dist

from dlx.metrics.timing import PhaseTimer
from dlx.model.llama import Transformer
from dlx.model.presets import resolve_model_args
from dlx.parallel import distributed
from dlx.parallel.config import ParallelConfig
from dlx.parallel.strategy import DDPStrategy, FSDPStrategy, Strategy
from dlx.parallel.wrap import parallelize
from dlx.precision import build_precision
from dlx.train.loop.trainer import accumulate_gradients

ACCUM, MICRO, SEQ = 2, 2, 16


def batches_of(rank: int, world: int, vocab: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Rank r's micro-batches: its share of one global batch that every rank can rebuild."""
    tokens = torch.randint(0, vocab, (world * ACCUM * MICRO, SEQ + 1), generator=torch.Generator().manual_seed(7))
    mine = tokens[rank * ACCUM * MICRO : (rank + 1) * ACCUM * MICRO]
    return [(mine[i : i + MICRO, :-1], mine[i : i + MICRO, 1:]) for i in range(0, len(mine), MICRO)]


def full_gradients(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    grads = {}
    for name, param in model.named_parameters():
        grad = param.grad
        full = grad.full_tensor() if hasattr(grad, "full_tensor") else grad
        grads[name.replace("_checkpoint_wrapped_module.", "")] = full.detach().clone()
    return grads


def strategy_gradients(kind: str, base: torch.nn.Module, env: distributed.DistEnv) -> dict[str, torch.Tensor]:
    device, precision = torch.device("cpu"), build_precision("fp32", torch.device("cpu"))
    model = copy.deepcopy(base)
    train_model = parallelize(model, ParallelConfig(strategy=kind), False, device, env, "fp32")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    strategy = {"ddp": DDPStrategy, "fsdp": FSDPStrategy}[kind](model, train_model, optimizer, precision, 0.0, env)
    reductions = count_reductions(train_model) if kind == "ddp" else None
    batches = iter(batches_of(env.rank, env.world_size, base.args.vocab_size))
    accumulate_gradients(train_model, batches, ACCUM, precision, PhaseTimer(device), strategy)
    grads = full_gradients(model)
    if reductions is not None:  # the all-reduces of the accumulated step, against those of one synchronised backward
        in_step = len(reductions)
        inputs, targets = batches_of(env.rank, env.world_size, base.args.vocab_size)[0]
        accumulate_gradients(train_model, iter([(inputs, targets)]), 1, precision, PhaseTimer(device), strategy)
        grads["__all_reduces__"] = torch.tensor([in_step, len(reductions) - in_step], dtype=torch.float32)
    return grads


def count_reductions(ddp_model: torch.nn.Module) -> list[None]:
    """A DDP communication hook that counts the gradient buckets it all-reduces."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    calls: list[None] = []

    def hook(state, bucket):
        calls.append(None)
        return allreduce_hook(state, bucket)

    ddp_model.register_comm_hook(None, hook)
    return calls


def main(out_path: str) -> None:
    env = distributed.init_distributed(torch.device("cpu"), needs_group=True, timeout_s=120)
    try:
        torch.manual_seed(0)
        base = Transformer(resolve_model_args("debug"))
        reference = copy.deepcopy(base)  # one process, all ranks' micro-batches, the same mean loss
        every = [b for rank in range(env.world_size) for b in batches_of(rank, env.world_size, base.args.vocab_size)]
        precision = build_precision("fp32", torch.device("cpu"))
        one_process = Strategy(
            reference, reference, torch.optim.SGD(reference.parameters(), lr=0.0), precision, 0.0, distributed.DistEnv()
        )
        accumulate_gradients(
            reference, iter(every), len(every), precision, PhaseTimer(torch.device("cpu")), one_process
        )
        expected = full_gradients(reference)
        result = {}
        for kind in ("ddp", "fsdp"):
            grads = strategy_gradients(kind, base, env)
            reductions = grads.pop("__all_reduces__", None)
            flat = torch.cat([grads[name].flatten() for name in sorted(grads)])
            gathered = [torch.empty_like(flat) for _ in range(env.world_size)]
            dist.all_gather(gathered, flat)
            result[kind] = {
                "vs_one_process": max((grads[n] - expected[n]).abs().max().item() for n in expected),
                "between_ranks": max((g - gathered[0]).abs().max().item() for g in gathered),
                "names_match": sorted(grads) == sorted(expected),
                "all_reduces": None if reductions is None else reductions.tolist(),
            }
        if env.is_main:
            with open(out_path, "w") as f:
                json.dump(result, f)
    finally:
        gc.collect()  # the DDP and FSDP wrappers (reference cycles) die now, not after the group at interpreter exit
        distributed.teardown()


if __name__ == "__main__":
    main(sys.argv[1])
