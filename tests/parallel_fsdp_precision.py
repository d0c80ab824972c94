"""Run by torchrun from tests/integration/test_parallel.py: FSDP2 in bf16 on 2 gloo ranks, one accumulated step of 2
micro-steps through dlx's `accumulate_gradients`, the loss in several chunks. Writes as JSON: the dtypes that enter and
leave every block (the residual stream), the output weight's gradient dtype, and its largest difference from one
process's bf16-autocast gradient on all ranks' micro-batches (fp32 master weights, no FSDP)."""

from __future__ import annotations

import copy
import gc
import json
import sys

import torch

from dlx.metrics.timing import PhaseTimer
from dlx.model.llama import Transformer
from dlx.model.loss import OutputLoss
from dlx.model.presets import resolve_model_args
from dlx.parallel import distributed
from dlx.parallel.config import ParallelConfig
from dlx.parallel.strategy import FSDPStrategy, Strategy
from dlx.parallel.wrap import parallelize
from dlx.precision import build_precision
from dlx.train.loop.trainer import accumulate_gradients
from parallel_grads import ACCUM, batches_of, full_gradients


def record_block_dtypes(model: torch.nn.Module) -> set[str]:
    seen: set[str] = set()
    for block in model.layers:
        block.register_forward_hook(lambda module, args, out: seen.update({str(args[0].dtype), str(out.dtype)}))
    return seen


def main(out_path: str) -> None:
    cpu = torch.device("cpu")
    env = distributed.init_distributed(cpu, needs_group=True, timeout_s=120)
    try:
        torch.manual_seed(0)
        base = Transformer(resolve_model_args("debug"))
        base.loss_fn = OutputLoss(chunk_logits=5 * base.args.vocab_size)  # 7 chunks per micro-batch of 32 tokens
        precision = build_precision("bf16", cpu)
        reference = copy.deepcopy(base)
        every = [b for rank in range(env.world_size) for b in batches_of(rank, env.world_size, base.args.vocab_size)]
        one = Strategy(reference, reference, torch.optim.SGD(reference.parameters(), lr=0.0), precision, 0.0, env)
        one.env = distributed.DistEnv()
        accumulate_gradients(reference, iter(every), len(every), precision, PhaseTimer(cpu), one)
        model = copy.deepcopy(base)
        train_model = parallelize(model, ParallelConfig(strategy="fsdp"), False, cpu, env, "bf16")
        dtypes = record_block_dtypes(model)
        strategy = FSDPStrategy(model, train_model, torch.optim.SGD(model.parameters(), lr=0.0), precision, 0.0, env)
        batches = iter(batches_of(env.rank, env.world_size, base.args.vocab_size))
        accumulate_gradients(train_model, batches, ACCUM, precision, PhaseTimer(cpu), strategy)
        grads, expected = full_gradients(model)["output.weight"], full_gradients(reference)["output.weight"]
        if env.is_main:
            with open(out_path, "w") as f:
                json.dump(
                    {
                        "block_dtypes": sorted(dtypes),
                        "output_grad_dtype": str(model.output.weight.grad.dtype),
                        "output_vs_one_process": (grads - expected).abs().max().item(),
                        "output_largest": expected.abs().max().item(),
                    },
                    f,
                )
    finally:
        gc.collect()
        distributed.teardown()


if __name__ == "__main__":
    main(sys.argv[1])
