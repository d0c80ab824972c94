"""Run by benchmarks/bench_context_parallel.py under torchrun: the `demo` model trained with context parallelism
(parallel.cp = the rank count, DDP over the cp ranks, fp32, SGD) for a few steps through dlx's own
`accumulate_gradients`, the bytes of the cp attention's all-gathers and reduce-scatters counted as the collectives are
called. Rank 0 writes {"gathered", "scattered", "step_ms"} per step (means over the timed steps) as JSON."""

from __future__ import annotations

import gc
import json
import sys
import time

import torch
import torch.distributed as dist

from dlx.metrics.timing import PhaseTimer
from dlx.model.llama import Transformer
from dlx.model.presets import resolve_model_args
from dlx.parallel import context, distributed
from dlx.parallel.build import build_context
from dlx.parallel.config import ParallelConfig
from dlx.parallel.strategy import DDPStrategy
from dlx.parallel.wrap import parallelize
from dlx.precision import build_precision
from dlx.train.loop.accumulate import accumulate_gradients

MODEL, SEQ, MICRO, WARMUP, STEPS = "demo", 256, 2, 1, 3


def counted_collectives() -> dict[str, int]:
    counts = {"gathered": 0, "scattered": 0}
    gather, scatter = dist.all_gather_into_tensor, dist.reduce_scatter_tensor

    def all_gather_into_tensor(out, x, **kw):
        counts["gathered"] += out.numel() * out.element_size()
        return gather(out, x, **kw)

    def reduce_scatter_tensor(out, x, **kw):
        counts["scattered"] += x.numel() * x.element_size()
        return scatter(out, x, **kw)

    context.dist.all_gather_into_tensor = all_gather_into_tensor  # what the cp attention calls
    context.dist.reduce_scatter_tensor = reduce_scatter_tensor
    return counts


def main(out_path: str, cp: int) -> None:
    device = torch.device("cpu")
    env = distributed.init_distributed(device, needs_group=True, timeout_s=300, cp=cp)
    try:
        torch.manual_seed(0)
        model = Transformer(resolve_model_args(MODEL))
        parallel = ParallelConfig(strategy="ddp", cp=cp, cp_path=True)
        ctx = build_context(parallel, env)
        model.use_attention_fn(ctx.attend)
        train_model = parallelize(model, parallel, False, device, env, "fp32")
        precision = build_precision("fp32", device)
        strategy = DDPStrategy(model, train_model, torch.optim.SGD(model.parameters(), lr=0.1), precision, 0.0, env)
        strategy.context = ctx
        counts = counted_collectives()
        tokens = torch.randint(0, model.args.vocab_size, (MICRO, SEQ + 1), generator=torch.Generator().manual_seed(1))
        batch = (tokens[:, :-1], tokens[:, 1:])
        timer, times = PhaseTimer(device), []
        for step in range(WARMUP + STEPS):
            if step == WARMUP:
                counts.update(gathered=0, scattered=0)
            start = time.perf_counter()
            accumulate_gradients(train_model, iter([batch]), 1, precision, timer, strategy)
            strategy.optimizer_step()
            times.append(time.perf_counter() - start)
        if env.is_main:
            result = {k: v / STEPS for k, v in counts.items()}
            result["step_ms"] = 1000 * sum(times[WARMUP:]) / STEPS
            with open(out_path, "w") as f:
                json.dump(result, f)
    finally:
        gc.collect()
        distributed.teardown()


def probe_torch_context_parallel(out_path: str) -> None:
    """PyTorch's experimental `context_parallel` on 2 gloo ranks, causal SDPA on the CPU: what it says."""
    import torch.nn.functional as F
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.experimental import context_parallel

    distributed.init_distributed(torch.device("cpu"), needs_group=True, timeout_s=300)
    try:
        mesh = init_device_mesh("cpu", (dist.get_world_size(),), mesh_dim_names=("cp",))
        x, w = torch.randn(1, 64, 16), torch.randn(16, 64, requires_grad=True)
        try:
            with context_parallel(mesh, buffers=[x], buffer_seq_dims=[1]):
                qkv = (x @ w).view(1, -1, 4, 16).transpose(1, 2)
                F.scaled_dot_product_attention(qkv, qkv, qkv, is_causal=True).sum().backward()
            outcome = "ran"
        except Exception as e:  # what it raises is the result
            outcome = f"{type(e).__name__}: {e}"
        if dist.get_rank() == 0:
            with open(out_path, "w") as f:
                json.dump({"outcome": outcome}, f)
    finally:
        distributed.teardown()


if __name__ == "__main__":
    if sys.argv[2] == "probe":
        probe_torch_context_parallel(sys.argv[1])
    else:
        main(sys.argv[1], int(sys.argv[2]))
