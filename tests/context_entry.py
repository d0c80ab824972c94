"""Run by torchrun from tests/integration/test_context_parallel.py: NPROC gloo ranks train the debug model with context
parallelism (parallel.cp = NPROC, DDP averaging the cp ranks' gradients) for a few SGD steps, with and without document
masks; rank 0 trains a copy in one process on the same whole sequences beside them. Writes, per mask setting, the
largest difference of every step's loss and every step's gradients from the one-process run, and the communication
volume of one step (bytes all-gathered and reduce-scattered by the cp attention) as JSON."""

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
from dlx.parallel import context, distributed
from dlx.parallel.build import build_context
from dlx.parallel.config import ParallelConfig
from dlx.parallel.strategy import DDPStrategy, Strategy
from dlx.parallel.wrap import parallelize
from dlx.precision import build_precision
from dlx.train.build.objective import Objective
from dlx.train.loop.accumulate import accumulate_gradients

STEPS, MICRO, SEQ, EOS = 3, 2, 32, 3


def batch(step: int, vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The step's whole sequences, the same on every rank; eos tokens planted so that rows hold several documents."""
    tokens = torch.randint(4, vocab, (MICRO, SEQ + 1), generator=torch.Generator().manual_seed(11 + step))
    tokens[0, [5, 14, 27]] = EOS
    tokens[1, [20]] = EOS
    return tokens[:, :-1], tokens[:, 1:]


def gradients(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: param.grad.detach().clone() for name, param in model.named_parameters()}


def train(model, train_model, strategy, objective, vocab: int, on_step) -> None:
    """STEPS steps of one micro-batch each; `on_step(loss, gradients)` before each update."""
    precision, timer = strategy.precision, PhaseTimer(torch.device("cpu"))
    for step in range(STEPS):
        loss = accumulate_gradients(train_model, iter([batch(step, vocab)]), 1, precision, timer, strategy, objective)
        on_step(loss.detach(), gradients(model))
        strategy.optimizer.step()
        strategy.optimizer.zero_grad(set_to_none=True)


def one_process(base: Transformer, objective: Objective) -> list[tuple[torch.Tensor, dict]]:
    model = copy.deepcopy(base)
    precision = build_precision("fp32", torch.device("cpu"))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    strategy = Strategy(model, model, optimizer, precision, 0.0, distributed.DistEnv())
    record: list[tuple[torch.Tensor, dict]] = []
    train(model, model, strategy, objective, base.args.vocab_size, lambda loss, grads: record.append((loss, grads)))
    return record


def context_parallel(base: Transformer, objective: Objective, env: distributed.DistEnv) -> list[tuple[float, dict]]:
    model, device = copy.deepcopy(base), torch.device("cpu")
    parallel = ParallelConfig(strategy="ddp", cp=env.cp)
    cp = build_context(parallel, env)
    model.use_attention_fn(cp.attend)
    train_model = parallelize(model, parallel, False, device, env, "fp32")
    precision = build_precision("fp32", device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    strategy = DDPStrategy(model, train_model, optimizer, precision, 0.0, env)
    strategy.context = cp
    record: list[tuple[float, dict]] = []

    def keep(loss: torch.Tensor, grads: dict) -> None:
        record.append((distributed.all_reduce([loss.item()], "mean", device)[0], grads))

    train(model, train_model, strategy, objective, base.args.vocab_size, keep)
    return record


def count_communication() -> dict[str, int]:
    """Wrap the collectives the cp attention calls so that their bytes are counted (what the ranks send)."""
    counts = {"all_gather": 0, "reduce_scatter": 0}
    gather, scatter = dist.all_gather_into_tensor, dist.reduce_scatter_tensor

    def all_gather_into_tensor(out, x, **kw):
        counts["all_gather"] += out.numel() * out.element_size()
        return gather(out, x, **kw)

    def reduce_scatter_tensor(out, x, **kw):
        counts["reduce_scatter"] += x.numel() * x.element_size()
        return scatter(out, x, **kw)

    context.dist.all_gather_into_tensor = all_gather_into_tensor  # the module's `dist` is torch.distributed
    context.dist.reduce_scatter_tensor = reduce_scatter_tensor
    return counts


def main(out_path: str) -> None:
    cp = int(sys.argv[2])
    env = distributed.init_distributed(torch.device("cpu"), needs_group=True, timeout_s=120, cp=cp)
    try:
        torch.manual_seed(0)
        base = Transformer(resolve_model_args("debug"))
        result = {}
        counts = count_communication()
        for name, objective in (("causal", Objective()), ("documents", Objective(document_eos=EOS))):
            before = dict(counts)
            ours = context_parallel(base, objective, env)
            sent = {k: (counts[k] - before[k]) // STEPS for k in counts}
            if env.is_main:
                reference = one_process(base, objective)
                result[name] = {
                    "loss": max(abs(a[0] - b[0].item()) for a, b in zip(ours, reference, strict=True)),
                    "grads": max(
                        (a[1][n] - b[1][n]).abs().max().item()
                        for a, b in zip(ours, reference, strict=True)
                        for n in b[1]
                    ),
                    "losses": [b[0].item() for b in reference],
                    "bytes_per_step": sent,
                }
        if env.is_main:
            with open(out_path, "w") as f:
                json.dump(result, f)
    finally:
        gc.collect()
        distributed.teardown()


if __name__ == "__main__":
    main(sys.argv[1])
