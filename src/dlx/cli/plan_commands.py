"""`dlx plan`: memory and FLOPs of a training configuration, and the step time it would take at a given MFU."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Annotated, Any

import typer


def plan(
    model: Annotated[
        str,
        typer.Argument(
            help="A preset name, a YAML/JSON of ModelArgs, or a trained model: a run folder, a checkpoint, a "
            "Hugging Face or dlx model folder (also as an s3://, gs://, hf:// URL)."
        ),
    ],
    seq_len: Annotated[int, typer.Option(help="Tokens per sequence.")] = 2048,
    micro_batch: Annotated[int, typer.Option(help="Sequences per micro-batch per rank.")] = 1,
    grad_accum: Annotated[int, typer.Option(help="Micro-batches per optimizer step.")] = 1,
    precision: Annotated[str, typer.Option(help="bf16, fp16 or fp32.")] = "bf16",
    strategy: Annotated[
        str, typer.Option(help="none, ddp, fsdp, hsdp or deepspeed (as the recipe's parallel.strategy).")
    ] = "none",
    zero_stage: Annotated[int, typer.Option(help="DeepSpeed ZeRO stage 1, 2 or 3 (strategy deepspeed).")] = 2,
    world_size: Annotated[
        int | None, typer.Option(help="Ranks (GPUs) in all: tp × data-parallel ranks (default: tp).")
    ] = None,
    tp: Annotated[int, typer.Option(help="Tensor-parallel ranks per model replica (parallel.tp).")] = 1,
    cp: Annotated[int, typer.Option(help="Context-parallel ranks per model replica (parallel.cp).")] = 1,
    dp_replicate: Annotated[int, typer.Option(help="hsdp: replicas, each sharded (parallel.dp_replicate).")] = 1,
    activation_checkpointing: Annotated[str, typer.Option(help="none, full or selective.")] = "none",
    gpu: Annotated[
        str,
        typer.Option(help="GPU of the peak table for the step time: H100, 'H100 PCIe', L40S, 'RTX 4090', MI300X ..."),
    ] = "H100",
    mfu: Annotated[float, typer.Option(help="Assumed MFU (0-1, attention convention) for the step time.")] = 0.4,
    memory_gb: Annotated[float, typer.Option(help="Device memory, for the largest micro-batch that fits.")] = 80.0,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Estimate memory per rank (weights, gradients, optimizer, activations, logits), FLOPs per token and step time."""
    from dlx.errors import UserError
    from dlx.metrics.estimate import TrainingShape
    from dlx.metrics.peak import GPUS, find_gpu

    if not 0 < mfu <= 1:
        raise UserError(f"--mfu must be in (0, 1], got {mfu}")
    world_size = tp if world_size is None else world_size
    if find_gpu(gpu) is None:
        raise UserError(f"--gpu {gpu!r} is not in dlx's peak table; the known GPUs: {', '.join(s.name for s in GPUS)}")
    layout = SimpleNamespace(
        strategy=strategy, tp=tp, cp=cp, dp_replicate=dp_replicate, zero_stage=zero_stage,
        activation_checkpointing=activation_checkpointing,
    )  # fmt: skip
    shape = TrainingShape.of(
        layout, seq_len=seq_len, micro_batch=micro_batch, grad_accum=grad_accum, precision=precision,
        world_size=world_size,
    )  # fmt: skip
    summary = plan_summary(model, shape, gpu, mfu, memory_gb)
    if as_json:
        print(json.dumps(summary, indent=2))
    else:
        print_plan(model, summary, gpu, mfu, world_size, memory_gb)


def plan_summary(model: str, shape: Any, gpu: str, mfu: float, memory_gb: float) -> dict[str, Any]:
    """Every figure `dlx plan` prints, as one flat mapping (the --json output)."""
    from dlx.errors import UserError
    from dlx.metrics.communication import communication_bytes
    from dlx.metrics.estimate import GB, max_micro_batch, plan_memory
    from dlx.metrics.peak import gpu_peak
    from dlx.parallel.tensor import divisibility_problem
    from dlx.train.rundir.trained import model_args_of

    args = model_args_of(model, "dlx plan")
    problem = divisibility_problem(args, shape.tp, "--tp")
    if problem:
        raise UserError(problem.replace("model.", "the model's "))
    result = plan_memory(args, shape)
    communication = communication_bytes(args, shape)
    peak = gpu_peak(gpu, shape.precision)
    return {
        "params": result.params,
        "weights_gb": result.weights_gb,
        "grads_gb": result.grads_gb,
        "optimizer_gb": result.optimizer_gb,
        "activations_gb": result.activations_gb,
        "logits_gb": result.logits_gb,
        "total_gb": result.total_gb,
        "peak_phase": result.peak_phase,
        "flops_per_token_dense": result.flops_per_token.dense,
        "flops_per_token_attention": result.flops_per_token.attention,
        "tokens_per_step": result.tokens_per_step,
        "predicted_step_s": result.step_seconds(peak.tflops, mfu, shape.world_size) if peak.tflops else None,
        "peak_tflops": peak.tflops,
        "peak_source": peak.source,
        "max_micro_batch": max_micro_batch(args, shape, memory_gb),
        "comm_cp_gb": communication.context_parallel / GB,
        "comm_sharding_gb": communication.sharding / GB,
        "comm_replication_gb": communication.replication / GB,
    }


def print_plan(model: str, summary: dict[str, Any], gpu: str, mfu: float, world_size: int, memory_gb: float) -> None:
    from rich.console import Console
    from rich.table import Table

    from dlx.metrics.flops import CONVENTIONS

    console = Console(width=max(Console().width, 110))
    console.print(f"{model}: {summary['params']:,} parameters")  # not a table title: rich wraps those to its width
    table = Table("memory per rank", "GB")
    for key in ("weights", "grads", "optimizer", "activations", "logits"):
        table.add_row(key, f"{summary[f'{key}_gb']:.2f}")
    # The terms are not all alive at once: the peak is the weights and optimizer state plus the largest phase.
    table.add_row(f"peak (in {summary['peak_phase']})", f"{summary['total_gb']:.2f}")
    console.print(table)
    for name, text in CONVENTIONS.items():
        console.print(f"FLOPs/token ({name}: {text}): {summary[f'flops_per_token_{name}']:.3e}")
    step_s = summary["predicted_step_s"]
    if step_s is None:
        console.print(f"predicted step time: unknown ({summary['peak_source']})")
    else:
        console.print(
            f"predicted step time at {mfu:.0%} MFU on {world_size}× {gpu} ({summary['peak_source']}, "
            f"{summary['peak_tflops']} TFLOPS): {step_s:.3f} s for {summary['tokens_per_step']:,} tokens"
        )
    fits = summary["max_micro_batch"]
    note = "" if fits else " (not even micro-batch 1 fits: shard with --strategy, checkpoint activations, or shorten)"
    console.print(f"largest micro-batch within {memory_gb:g} GB: {fits}{note}")
    sent = {"context parallel": "comm_cp_gb", "sharding": "comm_sharding_gb", "replication": "comm_replication_gb"}
    parts = " · ".join(f"{name} {summary[key]:.3f}" for name, key in sent.items() if summary[key])
    if parts:
        console.print(f"communication per rank and step, GB sent (ring collectives): {parts}")


def register(app: typer.Typer) -> None:
    app.command("plan")(plan)
