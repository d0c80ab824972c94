"""The `dlx` console command. Each concern registers its subcommands from its own module."""

from __future__ import annotations

import os
import sys
from typing import Any

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
    from dlx.cli import tune_commands

    tune_commands.register(app)
    from dlx.cli import data_commands, eval_commands

    data_commands.register(app)
    eval_commands.register(app)
    from dlx.cli import tokenizer_commands

    tokenizer_commands.register(app)
    from dlx.cli import passkey_commands

    passkey_commands.register(app)
    from dlx.cli import view_commands

    view_commands.register(app)


BOOL_WORDS = {"true": True, "yes": True, "on": True, "1": True, "false": False, "no": False, "off": False, "0": False}
"""Values a boolean flag also takes, as in a recipe: `--json true`, `--json=false`."""


FLAG_WORDS = {("pretrain", "--resume"): ("auto",)}
"""Words a boolean flag of a command takes besides true and false; the command reads the word itself (`--resume auto`:
`train_commands.take_auto`). `--flag=WORD` is passed on as `--flag WORD`, the spelling the command reads."""


def spell_bool_flags(command: Any, args: list[str]) -> list[str]:
    """`--flag true|false` (or `--flag=true`) as click's flags take them: `--flag`, or nothing (`--no-flag` where
    the flag has one), for the (sub)command that `args` invoke; `--flag=WORD` as `--flag WORD` for a word of
    FLAG_WORDS. Other arguments pass through unchanged."""
    start = 0
    while start < len(args) and args[start] in (getattr(command, "commands", None) or {}):
        command, start = command.commands[args[start]], start + 1
    flags = _bool_flags(command)
    out, i = list(args[:start]), start
    while i < len(args):
        name, has_value, value = args[i].partition("=")
        if name in flags and not has_value and i + 1 < len(args) and args[i + 1].lower() in BOOL_WORDS:
            has_value, value, i = True, args[i + 1], i + 1
        if name not in flags or not has_value:
            out.append(args[i])
        elif value.lower() in FLAG_WORDS.get((command.name, name), ()):
            out += [name, value.lower()]
        elif value.lower() not in BOOL_WORDS:
            words = "".join(f", {word}" for word in FLAG_WORDS.get((command.name, name), ()))
            raise UserError(f"{name} takes true{words} or false (or no value), not {value!r}")
        else:
            spelled = flags[name][0 if BOOL_WORDS[value.lower()] else 1]
            out += [spelled] if spelled else []
        i += 1
    return out


def _bool_flags(command: Any) -> dict[str, tuple[str | None, str | None]]:
    """Each boolean flag's spellings -> (what sets it true, what sets it false: its --no- twin or nothing)."""
    flags: dict[str, tuple[str | None, str | None]] = {}
    for param in command.params:
        if getattr(param, "is_bool_flag", False):
            on, off = param.opts[0], (param.secondary_opts or [None])[0]
            flags.update(dict.fromkeys(param.opts, (on, off)))
            flags.update(dict.fromkeys(param.secondary_opts, (off, on)))
    return flags


def main() -> None:
    from dlx.data.pool import WorkerError

    _register_commands()
    try:
        app(args=spell_bool_flags(typer.main.get_command(app), sys.argv[1:]))
    except UserError as e:
        print_user_error(e)
        sys.exit(e.exit_code)
    except WorkerError as e:  # a data worker's failure: its own traceback (where it failed), then one line
        if e.worker_traceback:
            print(e.worker_traceback, file=sys.stderr)
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)


def print_user_error(error: UserError) -> None:
    """`error: ...` on one line; under torchrun, an error raised alike on every rank is printed by rank 0 alone, with
    whether torchrun will start the job again (`--max-restarts`)."""
    if error.every_rank and os.environ.get("RANK", "0") != "0":
        return
    from dlx.data.storage import shown

    print(f"error: {shown(str(error))}{launcher_note()}", file=sys.stderr, flush=True)


def launcher_note() -> str:
    """Under torchrun: which attempt this was and whether torchrun retries (it restarts the job after any failure)."""
    if "TORCHELASTIC_MAX_RESTARTS" not in os.environ:
        return ""
    restarts = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    most = int(os.environ["TORCHELASTIC_MAX_RESTARTS"])
    if restarts < most:
        return f" (torchrun attempt {restarts + 1} of {most + 1}: the launcher will retry)"
    return f" (torchrun attempt {restarts + 1} of {most + 1}, the last)" if most else ""
