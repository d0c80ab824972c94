"""`dlx passkey`: passkey retrieval accuracy of a trained model per context length and needle depth."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from dlx.errors import UserError


def _numbers(text: str, kind: type, option: str) -> list:
    try:
        values = [kind(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise UserError(f"{option} {text!r}: give comma-separated numbers, e.g. {option} 1024,2048") from None
    if not values:
        raise UserError(f"{option} is empty; give comma-separated numbers")
    return values


def passkey(
    path: Annotated[
        str,
        typer.Argument(
            metavar="RUN_DIR_OR_CHECKPOINT",
            help="A run folder, a checkpoint, a dlx or Hugging Face model folder; also an s3://, gs://, hf:// run "
            "folder or checkpoint.",
        ),
    ],
    lengths: Annotated[str, typer.Option(help="Prompt lengths in tokens, comma-separated.")] = "256,512,1024",
    depths: Annotated[str, typer.Option(help="Needle depths, fractions of the context, comma-separated.")] = "0,0.5,1",
    samples: Annotated[int, typer.Option(min=1, help="Keys per (length, depth).")] = 5,
    seed: Annotated[int, typer.Option(help="Seed of the keys.")] = 0,
    device: Annotated[str, typer.Option(help="auto, cpu, cuda or cuda:N.")] = "auto",
    as_json: Annotated[bool, typer.Option("--json", help="JSON lines, one per (length, depth).")] = False,
) -> None:
    """Hide a five-digit key in filler text at each depth of each length; print how often greedy decoding says it back
    and the answer's log-likelihood (teacher-forced, one forward pass per prompt)."""
    from dlx import device as dev
    from dlx.evals.passkey import run_passkey, score_table
    from dlx.train.rundir.trained import load_trained, resolve_trained, say_on_stderr

    trained = load_trained(resolve_trained(path, "dlx passkey", say_on_stderr), dev.resolve_device(device))
    length_list, depth_list = _numbers(lengths, int, "--lengths"), _numbers(depths, float, "--depths")
    scores = run_passkey(trained.model, trained.tokenizer, length_list, depth_list, samples, seed)
    if as_json:
        for s in scores:
            row = {"length": s.length, "depth": s.depth, "samples": s.samples, "accuracy": s.accuracy}
            print(json.dumps({**row, "mean_logprob": s.mean_logprob}))
        return
    print("\n".join(score_table(scores)))


def register(app: typer.Typer) -> None:
    app.command("passkey")(passkey)
