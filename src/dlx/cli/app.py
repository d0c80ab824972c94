"""The `dlx` console command. Each concern registers its subcommands from its own module."""

from __future__ import annotations

import sys

import typer

from dlx.errors import UserError

app = typer.Typer(
    name="dlx",
    help="Pretrain Llama-3-style language models from scratch.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _register_commands() -> None:
    from dlx.cli import bench_commands, model_commands, plan_commands

    model_commands.register(app)
    from dlx.cli import train_commands

    train_commands.register(app)
    plan_commands.register(app)
    bench_commands.register(app)
    from dlx.cli import data_commands

    data_commands.register(app)


def main() -> None:
    _register_commands()
    try:
        app()
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(e.exit_code)
