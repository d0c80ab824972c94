"""`dlx params`, `dlx export-hf`, `dlx import-hf`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer


def params(
    model: Annotated[
        str, typer.Argument(help="A preset name (see `dlx params --list`) or a YAML/JSON of ModelArgs.")
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
    args = resolve_model_args(model)
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
    checkpoint: Annotated[
        Path,
        typer.Argument(help="A dlx model folder, checkpoint (model.safetensors or dcp/) or run folder (its newest)."),
    ],
    out_dir: Annotated[Path, typer.Argument(help="New folder for config.json + model.safetensors.")],
    overwrite: Annotated[bool, typer.Option(help="Replace OUT_DIR if it exists.")] = False,
) -> None:
    """Write a dlx checkpoint as a Hugging Face Llama folder (`LlamaForCausalLM.from_pretrained` loads it)."""
    from dlx.model.hf import save_hf
    from dlx.train.checkpoint import load_checkpoint_model

    save_hf(load_checkpoint_model(_model_folder(checkpoint)), out_dir, overwrite=overwrite)
    print(f"wrote {out_dir}/config.json and {out_dir}/model.safetensors")


def import_hf(
    hf_dir: Annotated[Path, typer.Argument(help="A Hugging Face Llama folder (config.json + safetensors).")],
    out: Annotated[Path, typer.Argument(help="New dlx model folder.")],
    overwrite: Annotated[bool, typer.Option(help="Replace OUT if it exists.")] = False,
) -> None:
    """Read a Hugging Face Llama folder into a dlx model folder."""
    from dlx.model.hf import load_hf
    from dlx.model.io import save_model

    save_model(load_hf(hf_dir), out, overwrite=overwrite)
    print(f"wrote {out}")


def _model_folder(path: Path) -> Path:
    """A model folder or checkpoint itself, or the newest checkpoint of a run folder: the newest folder holding
    model.safetensors or a DCP checkpoint (`dcp/.metadata`)."""
    from dlx.errors import UserError
    from dlx.model.io import WEIGHTS_FILE
    from dlx.train.checkpoint import DCP_METADATA

    markers = (WEIGHTS_FILE, DCP_METADATA)
    if any((path / marker).is_file() for marker in markers):
        return path
    found = [file for marker in markers for file in path.glob("**/" + marker)]
    for candidate in sorted(found, key=lambda p: p.stat().st_mtime, reverse=True):
        return candidate.parent if candidate.name == WEIGHTS_FILE else candidate.parent.parent
    raise UserError(f"{path} holds no {WEIGHTS_FILE} nor dcp/; give a dlx model folder, checkpoint or run folder")


def register(app: typer.Typer) -> None:
    app.command("params")(params)
    app.command("export-hf")(export_hf)
    app.command("import-hf")(import_hf)
