"""`dlx plan`: memory and FLOPs of a training configuration, and the step time it would take at a given MFU."""

from __future__ import annotations

import json
from typing import Annotated

import typer


def plan(
    model: Annotated[str, typer.Argument(help="A preset name or a YAML/JSON of ModelArgs.")],
    seq_len: Annotated[int, typer.Option(help="Tokens per sequence.")] = 2048,
    micro_batch: Annotated[int, typer.Option(help="Sequences per micro-batch per rank.")] = 1,
    grad_accum: Annotated[int, typer.Option(help="Micro-batches per optimizer step.")] = 1,
    precision: Annotated[str, typer.Option(help="bf16, fp16 or fp32.")] = "bf16",
    strategy: Annotated[str, typer.Option(help="none, ddp, fsdp, zero1, zero2 or zero3.")] = "none",
    world_size: Annotated[int, typer.Option(help="Data-parallel ranks.")] = 1,
    activation_checkpointing: Annotated[str, typer.Option(help="none, full or selective.")] = "none",
    gpu: Annotated[str, typer.Option(help="GPU name in the peak table, for the predicted step time.")] = "H100",
    mfu: Annotated[float, typer.Option(help="Assumed MFU (0-1) for the predicted step time.")] = 0.4,
    memory_gb: Annotated[float, typer.Option(help="Device memory, for the largest micro-batch that fits.")] = 80.0,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Estimate memory (weights, gradients, optimizer, activations, logits), FLOPs per token and step time."""
    from rich.console import Console
    from rich.table import Table

    from dlx.bench.estimate import TrainingShape, max_micro_batch, plan_memory
    from dlx.errors import UserError
    from dlx.metrics.flops import CONVENTIONS
    from dlx.metrics.peak import gpu_peak
    from dlx.model.presets import resolve_model_args

    if not 0 < mfu <= 1:
        raise UserError(f"--mfu must be in (0, 1], got {mfu}")
    args = resolve_model_args(model)
    shape = TrainingShape(
        seq_len, micro_batch, grad_accum, precision, strategy, world_size, activation_checkpointing
    )  # fmt: skip
    result = plan_memory(args, shape)
    peak = gpu_peak(gpu, precision)
    step_s = result.step_seconds(peak.tflops, mfu, world_size) if peak.tflops else None
    fits = max_micro_batch(args, shape, memory_gb)
    summary = {
        "params": result.params,
        "weights_gb": result.weights_gb,
        "grads_gb": result.grads_gb,
        "optimizer_gb": result.optimizer_gb,
        "activations_gb": result.activations_gb,
        "logits_gb": result.logits_gb,
        "total_gb": result.total_gb,
        "flops_per_token_dense": result.flops_per_token.dense,
        "flops_per_token_attention": result.flops_per_token.attention,
        "tokens_per_step": result.tokens_per_step,
        "predicted_step_s": step_s,
        "peak_source": peak.source,
        "max_micro_batch": fits,
    }
    if as_json:
        print(json.dumps(summary, indent=2))
        return
    console = Console(width=max(Console().width, 110))
    table = Table("memory per rank", "GB", title=f"{model}: {result.params:,} parameters")
    for key in ("weights", "grads", "optimizer", "activations", "logits", "total"):
        table.add_row(key, f"{summary[f'{key}_gb']:.2f}")
    console.print(table)
    for name, text in CONVENTIONS.items():
        console.print(f"FLOPs/token ({name}: {text}): {summary[f'flops_per_token_{name}']:.3e}")
    if step_s is None:
        console.print(f"predicted step time: unknown ({peak.source})")
    else:
        console.print(
            f"predicted step time at {mfu:.0%} MFU on {world_size}× {gpu} ({peak.source}, {peak.tflops} TFLOPS): "
            f"{step_s:.3f} s for {result.tokens_per_step:,} tokens"
        )
    console.print(f"largest micro-batch within {memory_gb:g} GB: {fits}")


def register(app: typer.Typer) -> None:
    app.command("plan")(plan)
