"""The measuring half of benchmarks/bench_tp.py, run once per measurement (under torchrun where it is distributed):

state OUT.json OVERRIDES...   build the run's model and strategy as `dlx pretrain` does, take one optimizer
                              step (AdamW, fp32), and write each rank's bytes of parameters, gradients, AdamW state
meta OUT.json PRESET DP TP [--materialize]
                              one process playing rank 0 of DP × TP ranks (torch's fake process group: collectives
                              are no-ops, shapes are real): build PRESET on the meta device, apply TP and FSDP2, and
                              with --materialize give rank 0 its shards; write the peak resident set size
saves OUT.json ARGS...        `dlx pretrain ARGS` with the wall time of every checkpoint save the step loop waits
                              for (the stall), per rank
"""

from __future__ import annotations

import json
import resource
import sys
import time
from pathlib import Path

import torch


def rss_peak_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9  # Linux reports KiB


def local_bytes(tensor: torch.Tensor) -> int:
    local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
    return local.numel() * local.element_size()


def gather(value: dict) -> list[dict]:
    """Every rank's value, on every rank."""
    import torch.distributed as dist

    if not dist.is_initialized():
        return [value]
    values: list = [None] * dist.get_world_size()
    dist.all_gather_object(values, value)
    return values


def state_bytes(out: Path, overrides: list[str]) -> None:
    from dlx.metrics.timing import PhaseTimer
    from dlx.parallel import distributed
    from dlx.parallel.tensor import check_layout
    from dlx.precision import build_precision
    from dlx.train.build.data import build_train_loader
    from dlx.train.build.model import build_run_strategy, meta_model
    from dlx.train.build.step_plan import plan_steps
    from dlx.train.loop.trainer import accumulate_gradients
    from dlx.train.recipe import load_recipe

    config = load_recipe(None, overrides)
    device = torch.device("cpu")
    needs_group = config.parallel.strategy == "fsdp"
    env = distributed.init_distributed(device, needs_group, 300.0, config.parallel.tp)
    try:
        check_layout(config.parallel, env.world_size)
        precision = build_precision("fp32", device)
        loader = build_train_loader(config, device, env.dp_rank, env.dp_size)
        plan = plan_steps(config, None, None, env.dp_size, env.tp)
        strategy = build_run_strategy(meta_model(config), config, device, env, precision, plan)
        model = strategy.model
        accumulate_gradients(strategy.train_model, loader, 1, precision, PhaseTimer(device), strategy)
        params = sum(local_bytes(p) for p in model.parameters())
        grads = sum(local_bytes(p.grad) for p in model.parameters() if p.grad is not None)
        strategy.optimizer_step()
        optimizer = sum(
            local_bytes(value)
            for state in strategy.optimizer.state.values()
            for value in state.values()
            if isinstance(value, torch.Tensor) and value.ndim > 0  # the moments; `step` is a scalar per parameter
        )
        rows = gather({"params": params, "grads": grads, "optimizer": optimizer})
        if env.is_main:
            out.write_text(json.dumps(rows))
        loader.close()
    finally:
        distributed.teardown()


def meta_build(out: Path, preset: str, dp: int, tp: int, materialize: bool) -> None:
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from dlx.model.llama import Transformer
    from dlx.model.presets import resolve_model_args
    from dlx.parallel.config import ParallelConfig
    from dlx.parallel.distributed import DistEnv
    from dlx.parallel.tensor import build_mesh
    from dlx.parallel.wrap import apply_fsdp, parallelize

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=dp * tp)
    try:
        start = time.perf_counter()
        env, device = DistEnv(0, dp * tp, 0, tp), torch.device("cpu")
        with torch.device("meta"):
            model = Transformer(resolve_model_args(preset))
        mesh = build_mesh(env, "fsdp", device)
        if materialize:
            parallelize(model, ParallelConfig(strategy="fsdp", tp=tp), False, device, env, "fp32", mesh, seed=0)
        else:
            from dlx.parallel.tensor import apply_tp

            apply_tp(model, mesh)
            apply_fsdp(model, "fp32", True, mesh)
        shard_bytes = sum(local_bytes(p) for p in model.parameters() if not p.is_meta)
        out.write_text(
            json.dumps(
                {"peak_rss_gb": rss_peak_gb(), "shard_gb": shard_bytes / 1e9, "seconds": time.perf_counter() - start}
            )
        )
    finally:
        dist.destroy_process_group()


def timed_saves(out: Path, args: list[str]) -> None:
    """`dlx pretrain ARGS`, timing `trainer.save` (what between_steps waits for) on every rank."""
    import os

    from dlx.cli.app import main
    from dlx.train.loop import finish, trainer

    durations: list[float] = []
    save = trainer.save

    def timed(run, final=False):
        start = time.perf_counter()
        save(run, final)
        if not final:  # the final save is synchronous in both modes: not a stall on a step
            durations.append(time.perf_counter() - start)

    trainer.save = timed
    finish.write_report = lambda *a, **k: None
    sys.argv = ["dlx", "pretrain", *args]
    try:
        main()
    except SystemExit as e:
        if e.code:
            raise
    finally:
        rank = os.environ.get("RANK", "0")
        Path(f"{out}.rank{rank}").write_text(json.dumps(durations))


if __name__ == "__main__":
    kind, out, rest = sys.argv[1], Path(sys.argv[2]), sys.argv[3:]
    if kind == "state":
        state_bytes(out, rest)
    elif kind == "meta":
        meta_build(out, rest[0], int(rest[1]), int(rest[2]), "--materialize" in rest)
    elif kind == "saves":
        timed_saves(out, rest)
    else:
        raise SystemExit(f"unknown measurement {kind!r}; see the docstring")
