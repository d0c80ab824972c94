"""Run by torchrun from tests/integration/test_tp.py on 2 ranks (tp 2) or 4 ranks (fsdp × tp 2 and ddp × tp 2). For each
layout the model is built on the meta device and wrapped as `dlx pretrain` wraps it; the script reports, as JSON from
rank 0:

- whether every parameter starts bitwise equal to the one-process model (the same seed, materialised whole);
- the largest difference between each rank's full gradients after one accumulated step through dlx's own
  `accumulate_gradients` and one process's on all replicas' micro-batches, and between the ranks;
- how many parameter elements each rank holds (no rank may hold the whole model when it is sharded), and whether its
  gradients are as many (each gradient in its parameter's layout);
- on the first layout: a background DCP save whose weights are changed the moment it returns reads back unchanged
  (DCP staged a copy).
"""

from __future__ import annotations

import gc
import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from dlx.metrics.timing import PhaseTimer
from dlx.model.io import empty_model
from dlx.model.llama import Transformer
from dlx.model.presets import resolve_model_args
from dlx.parallel import dcp, distributed
from dlx.parallel.build import STRATEGIES
from dlx.parallel.config import ParallelConfig
from dlx.parallel.materialize import materialize
from dlx.parallel.strategy import Strategy
from dlx.parallel.tensor import build_mesh
from dlx.parallel.wrap import parallelize
from dlx.precision import build_precision
from dlx.train.loop.trainer import accumulate_gradients

ACCUM, MICRO, SEQ, SEED = 2, 2, 16, 3
LAYOUTS = {2: [("none", 2)], 4: [("fsdp", 2), ("ddp", 2)]}
CPU = torch.device("cpu")


def batches_of(dp_rank: int, dp_size: int, vocab: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Replica r's micro-batches: its share of one global batch that every rank can rebuild."""
    tokens = torch.randint(0, vocab, (dp_size * ACCUM * MICRO, SEQ + 1), generator=torch.Generator().manual_seed(7))
    mine = tokens[dp_rank * ACCUM * MICRO : (dp_rank + 1) * ACCUM * MICRO]
    return [(mine[i : i + MICRO, :-1], mine[i : i + MICRO, 1:]) for i in range(0, len(mine), MICRO)]


def local(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


def full(tensor: torch.Tensor) -> torch.Tensor:
    return (tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor).detach().clone()


def one_process(args, dp_size: int) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """The reference: materialised whole in this process, gradients on every replica's micro-batches."""
    with torch.device("meta"):
        model = Transformer(args)
    materialize(model, CPU, SEED)
    weights = {name: p.detach().clone() for name, p in model.named_parameters()}
    precision = build_precision("fp32", CPU)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    strategy = Strategy(model, model, optimizer, precision, 0.0, distributed.DistEnv())
    every = [b for r in range(dp_size) for b in batches_of(r, dp_size, args.vocab_size)]
    accumulate_gradients(model, iter(every), len(every), precision, PhaseTimer(CPU), strategy)
    return weights, {name: full(p.grad) for name, p in model.named_parameters()}


def check_layout(kind: str, tp: int, args, reference: tuple, env: distributed.DistEnv, scratch: Path) -> dict:
    env = distributed.DistEnv(env.rank, env.world_size, env.local_rank, tp)
    with torch.device("meta"):
        model = Transformer(args)
    mesh = build_mesh(env, kind, CPU)
    train_model = parallelize(model, ParallelConfig(strategy=kind, tp=tp), False, CPU, env, "fp32", mesh, SEED)
    precision = build_precision("fp32", CPU)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    strategy = STRATEGIES[kind](model, train_model, optimizer, precision, 0.0, env)
    start = {name: full(p) for name, p in model.named_parameters()}
    local_elements = sum(local(p).numel() for p in model.parameters())
    batches = iter(batches_of(env.dp_rank, env.dp_size, args.vocab_size))
    accumulate_gradients(train_model, batches, ACCUM, precision, PhaseTimer(CPU), strategy)
    grad_elements = sum(local(p.grad).numel() for p in model.parameters())
    grads = {name: full(p.grad) for name, p in model.named_parameters()}
    weights, expected = reference
    flat = torch.cat([grads[name].flatten() for name in sorted(grads)])
    gathered = [torch.empty_like(flat) for _ in range(env.world_size)]
    dist.all_gather(gathered, flat)
    elements = [torch.zeros((), dtype=torch.int64) for _ in range(env.world_size)]
    dist.all_gather(elements, torch.tensor(local_elements))
    return {
        "same_start": sorted(start) == sorted(weights) and all(torch.equal(start[n], weights[n]) for n in weights),
        "vs_one_process": max((grads[n] - expected[n]).abs().max().item() for n in expected),
        "between_ranks": max((g - gathered[0]).abs().max().item() for g in gathered),
        "local_elements": [int(e) for e in elements],
        "grad_elements_equal": grad_elements == local_elements,
        "staged_copy": staged_copy_is_saved(model, optimizer, args, start, scratch / kind),
    }


def staged_copy_is_saved(model, optimizer, args, before: dict[str, torch.Tensor], folder: Path) -> bool:
    """Save in the background, change every weight at once, wait: the checkpoint holds the weights as they were."""
    future = dcp.save(model, optimizer, folder, background=True)
    with torch.no_grad():
        for param in model.parameters():
            (param.to_local() if hasattr(param, "to_local") else param).add_(1.0)
    future.result()
    dist.barrier()
    saved = {}
    if dist.get_rank() == 0:
        whole = empty_model(args, CPU)
        dcp.load_whole_model(whole, folder)
        saved = {name: p.detach() for name, p in whole.named_parameters()}
    dist.barrier()
    return all(torch.equal(saved[name], before[name]) for name in saved) and len(saved) > 0


def main(out_path: str) -> None:
    env = distributed.init_distributed(CPU, needs_group=True, timeout_s=120)
    try:
        # 4 ranks: tied embeddings (one parameter through TP and FSDP); 2 ranks: untied (the embedding's own gradient)
        args = resolve_model_args("debug").model_copy(update={"tie_embeddings": env.world_size == 4})
        tp = LAYOUTS[env.world_size][0][1]
        reference = one_process(args, env.world_size // tp)
        scratch = Path(out_path).parent
        layouts = LAYOUTS[env.world_size]
        result = {f"{kind}-tp{tp}": check_layout(kind, tp, args, reference, env, scratch) for kind, tp in layouts}
        result["total_elements"] = sum(t.numel() for t in reference[0].values())
        if env.is_main:
            Path(out_path).write_text(json.dumps(result))
    finally:
        gc.collect()
        distributed.teardown()


if __name__ == "__main__":
    main(sys.argv[1])
