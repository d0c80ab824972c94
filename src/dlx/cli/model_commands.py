"""`dlx params`, `dlx export-hf`, `dlx import-hf`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer


def params(
    model: Annotated[
        str,
        typer.Argument(
            help="A preset name (see `dlx params --list`), a YAML/JSON of ModelArgs, or a trained model: a run "
            "folder, a checkpoint, a Hugging Face or dlx model folder (also as an s3://, gs://, hf:// URL)."
        ),
    ] = "",
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object instead of tables.")] = False,
    list_presets: Annotated[bool, typer.Option("--list", help="List the presets with their parameter counts.")] = False,
) -> None:
    """Exact trainable / untrainable / total parameter counts, computed on the meta device (no memory)."""
    from rich.console import Console
    from rich.table import Table

    from dlx.model.presets import PRESETS, resolve_model_args
    from dlx.model.stats import model_stats

    console = Console(width=max(Console().width, 110))
    if list_presets or not model:
        table = Table("preset", "total", "non-embedding", "dim", "layers", "heads", "kv heads", "vocab")
        for name in PRESETS:
            args = resolve_model_args(name)
            stats = model_stats(args)
            table.add_row(
                name,
                f"{stats.total:,}",
                f"{stats.non_embedding:,}",
                *map(str, (args.dim, args.n_layers)),
                str(args.n_heads),
                str(args.kv_heads),
                str(args.vocab_size),
            )
        console.print(table)
        return
    from dlx.train.rundir.trained import model_args_of

    args = model_args_of(model, "dlx params")
    stats = model_stats(args)
    if as_json:
        payload = {
            "model": model,
            "trainable": stats.trainable,
            "untrainable": stats.untrainable,
            "total": stats.total,
            "embedding": stats.embedding,
            "non_embedding": stats.non_embedding,
            "per_module": stats.per_module,
            "ffn_hidden_dim": args.ffn_hidden_dim,
            "model_args": args.model_dump(),
        }
        print(json.dumps(payload, indent=2))
        return
    console.print(f"[bold]{model}[/]: ffn_hidden_dim {args.ffn_hidden_dim}, head_dim {args.head_dim}")
    console.print(f"trainable params: {stats.trainable:,}")
    console.print(f"untrainable params: {stats.untrainable:,}")
    console.print(f"total params: {stats.total:,} ({stats.total / 1e6:.3f}M)")
    table = Table("module", "parameters", "share")
    for name, count in stats.per_module.items():
        table.add_row(name, f"{count:,}", f"{100 * count / stats.total:.1f}%")
    console.print(table)


def export_hf(
    source: Annotated[
        str,
        typer.Argument(
            metavar="RUN_DIR_OR_CHECKPOINT",
            help="A run folder (its newest complete checkpoint), a checkpoint or a dlx model folder; also an s3://, "
            "gs://, hf:// run folder or checkpoint.",
        ),
    ],
    out_dir: Annotated[Path, typer.Argument(help="New folder for the Hugging Face model.")],
    dtype: Annotated[
        str, typer.Option(help="Weights' dtype in the export: keep (as trained), bf16, fp16 or fp32.")
    ] = "keep",
    overwrite: Annotated[bool, typer.Option(help="Replace OUT_DIR if it exists.")] = False,
) -> None:
    """Write a Hugging Face Llama folder: weights, config.json and, with the run's tokenizer, tokenizer.json,
    tokenizer_config.json, special_tokens_map.json and generation_config.json (AutoTokenizer, AutoModelForCausalLM,
    pipeline and lm-evaluation-harness load it as it is). max_position_embeddings: the source's for a run started from
    weights whose RoPE it kept, else the context the model's RoPE was configured for (yarn: original × factor; else
    the trained max_seq_len); a line says which."""
    from dlx.device import PRECISION_DTYPES
    from dlx.errors import UserError
    from dlx.model.hf import save_hf
    from dlx.train.init.init_from import export_context
    from dlx.train.rundir.trained import resolve_trained, say_on_stderr

    if dtype != "keep" and dtype not in PRECISION_DTYPES:
        raise UserError(f"--dtype {dtype!r}: choose keep, {', '.join(PRECISION_DTYPES)}")
    found = resolve_trained(source, "dlx export-hf", say_on_stderr)
    if found.kind == "hf":
        raise UserError(f"{source} is a Hugging Face folder already; give a run folder, checkpoint or dlx model folder")
    model = found.load()  # model.safetensors, or the whole weights read from dcp/
    if dtype != "keep":
        model.to(PRECISION_DTYPES[dtype])
    context, why = export_context(found)
    save_hf(model, out_dir, overwrite=overwrite, tokenizer=found.tokenizer, context=context)
    print(f"wrote {out_dir} from {found.describe()}: " + ", ".join(sorted(p.name for p in out_dir.iterdir())))
    if why:
        print(why)
    if found.tokenizer is None:
        print(
            f"note: no tokenizer.json beside {found.weights} or in its run folder (synthetic data?), so {out_dir} has "
            "none: AutoTokenizer will not load it"
        )


def import_hf(
    hf_dir: Annotated[Path, typer.Argument(help="A Hugging Face Llama folder (config.json + safetensors).")],
    out: Annotated[Path, typer.Argument(help="New dlx model folder.")],
    overwrite: Annotated[bool, typer.Option(help="Replace OUT if it exists.")] = False,
) -> None:
    """Read a Hugging Face Llama folder into a dlx model folder, keeping its tokenizer files."""
    from dlx.model.hf import import_hf as import_folder

    kept = import_folder(hf_dir, out, overwrite=overwrite)
    print(f"wrote {out}" + (f" (tokenizer kept: {', '.join(kept)})" if kept else " (the folder has no tokenizer)"))


def register(app: typer.Typer) -> None:
    app.command("params")(params)
    app.command("export-hf")(export_hf)
    app.command("import-hf")(import_hf)
