"""`dlx pretrain` and `dlx generate`."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from dlx.data.storage import is_url

PRETRAIN_HELP = """Pretrain a model from a YAML recipe, with `--section.key VALUE` overrides (e.g. `--train.lr 1e-3`).

With no recipe, runs the embedded demo: prepares the stdlib corpus into ./data/stdlib-8k if needed, trains the
`demo` model for 3 to 6 minutes on a 2-core CPU and prints a sample.

`dlx pretrain --keys` lists every recipe key.
"""


def pretrain(
    ctx: typer.Context,
    run_dir: Annotated[
        str | None,
        typer.Option(
            "--run-dir",
            help="Run folder (default: runs/RECIPE-DATE-TIME; with --resume, the newest), or an s3://, gs://, hf:// "
            "URL: the run trains in a local staging folder uploaded there, each checkpoint with a marker written last.",
        ),
    ] = None,
    resume: Annotated[
        bool,
        typer.Option(
            "--resume",
            help="Continue the run folder from its newest complete checkpoint. `--resume auto` (with --run-dir): "
            "continue the run there, or start it when there is none (the command for restarts by torchrun, Slurm, "
            "Kubernetes).",
        ),
    ] = False,
    keys: Annotated[bool, typer.Option("--keys", help="List every recipe key with its default and meaning.")] = False,
    tune: Annotated[
        bool, typer.Option("--tune", help="Run `dlx tune` on the recipe first and train with its winner.")
    ] = False,
    tune_budget_min: Annotated[float, typer.Option(help="--tune: minutes the search may take.")] = 5.0,
) -> None:
    from dlx.faults import pause_point
    from dlx.train.build.signals import stop_outside_training
    from dlx.train.recipe import split_command_line

    stop_outside_training()  # SIGTERM before the training loop: one line, exit 143
    pause_point("start_up")  # test-only, off by default: see dlx.faults
    if keys:
        from dlx.train.config import describe_keys

        print("\n".join(describe_keys()))
        return
    args, auto = take_auto(list(ctx.args)) if resume else (list(ctx.args), False)
    recipe, overrides = split_command_line(args)
    if auto and run_dir is None:
        from dlx.errors import UserError

        raise UserError("--resume auto needs --run-dir DIR: the folder every restart of the job starts or continues")
    if run_dir is not None and is_url(run_dir):
        from dlx.train.rundir.sync import bucket_run

        with bucket_run(run_dir) as staging:
            return launch_run(recipe, overrides, staging, resume, auto, tune_budget_min if tune else None)
    launch_run(recipe, overrides, Path(run_dir) if run_dir else None, resume, auto, tune_budget_min if tune else None)


def launch_run(
    recipe: str | None, overrides: list[str], run_dir: Path | None, resume: bool, auto: bool, tune_min: float | None
) -> None:
    """The run (the demo without a recipe), after `dlx tune` when `tune_min` minutes are given for it."""
    if recipe is None and not overrides and not (resume and run_dir):
        from dlx.train.demo import run_demo

        sys.exit(run_demo(resume=resume, run_dir=run_dir))
    if tune_min is not None:
        from dlx.cli.tune_commands import pretrain_tuned

        sys.exit(pretrain_tuned(recipe, overrides, run_dir, resume, tune_min))
    from dlx.train.launch import launch

    sys.exit(launch(recipe, overrides, run_dir, "auto" if auto else resume))


def take_auto(args: list[str]) -> tuple[list[str], bool]:
    """`--resume auto`: click leaves `auto` among the positional arguments; take it out (an override's value `auto`,
    as in `--train.device auto`, stays)."""
    from dlx.train.recipe import scan_arguments

    positional, flags = scan_arguments(args)
    if "auto" not in positional:
        return args, False
    positional.remove("auto")
    return positional + [arg for _, _, raw in flags for arg in raw], True


def generate(
    path: Annotated[
        str,
        typer.Argument(
            metavar="RUN_DIR_OR_CHECKPOINT",
            help="A run folder (its newest complete checkpoint), a checkpoint, a dlx or Hugging Face model folder; "
            "also an s3://, gs://, hf:// run folder or checkpoint.",
        ),
    ],
    prompt: Annotated[str, typer.Option("--prompt", help="Text to continue.")],
    max_new_tokens: Annotated[int, typer.Option(min=1, help="Tokens to sample after the prompt.")] = 100,
    temperature: Annotated[float, typer.Option(min=0.0, help="0 is greedy decoding.")] = 0.8,
    top_k: Annotated[int | None, typer.Option(min=1, help="Sample among the k likeliest tokens.")] = 50,
    top_p: Annotated[float | None, typer.Option(min=0.0, max=1.0, help="Nucleus sampling mass.")] = None,
    seed: Annotated[int, typer.Option(help="Seed of the sampler.")] = 0,
    device: Annotated[str, typer.Option(help="auto, cpu, cuda or cuda:N.")] = "auto",
) -> None:
    """Sample a continuation of PROMPT from a trained model, with the run's tokenizer."""
    from dlx.train.observers.sample import sample_text

    text = sample_text(path, prompt, max_new_tokens, temperature, top_k, top_p, seed, device)
    print(text)


def register(app: typer.Typer) -> None:
    app.command(
        "pretrain",
        help=PRETRAIN_HELP,
        context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
        options_metavar="[RECIPE.yaml] [--section.key VALUE ...] [OPTIONS]",
    )(pretrain)
    app.command("generate")(generate)
