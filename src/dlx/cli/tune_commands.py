"""`dlx tune`: the fastest layout of a recipe that fits, measured, written as a recipe."""

from __future__ import annotations

import contextlib
import json
import math
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Annotated, Any

import typer

TUNE_HELP = """Choose the layout of RECIPE whose whole run ends first: strategy, tp, cp, activation checkpointing,
micro-batch × accumulation (at the recipe's global batch), train.compile, train.float8 (where the device has it) and
train.attention. Layouts whose `dlx plan` estimate (with a stated margin) does not fit, or that the world size rules
out, are dropped unrun; the rest are ranked by the recipe's whole run (its steps priced by a time model calibrated on
this machine, its evaluations, task evaluations and saves, and the compile warm-up over train.max_steps), and the best
are measured with short runs of the real step until --budget-min. Prints the winner, the measured layouts and the best
unmeasured one (--all: every candidate); writes the winner as a recipe (--out), with OUT.md (every candidate:
predicted and measured whole run and step, tokens/s, MFU, memory, why dropped) and OUT.json. Without torchrun it
measures for --world-size 1 only; for more ranks it ranks by the model alone, unless launched under torchrun with that
many ranks. Recipe keys are overridden as for `dlx pretrain` (`--train.compile false`).
"""


def tune(
    ctx: typer.Context,
    world_size: Annotated[
        int | None, typer.Option(min=1, help="Ranks the layouts are for (default: torchrun's, else 1).")
    ] = None,
    budget_min: Annotated[float, typer.Option(help="Minutes the whole search may take.")] = 5.0,
    out: Annotated[Path | None, typer.Option(help="The tuned recipe (default runs/tune/RECIPE-tuned.yaml).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object instead of the table.")] = False,
    memory_limit_gb: Annotated[
        float | None, typer.Option(help="Memory per rank a layout may use (default: the device's).")
    ] = None,
    keep: Annotated[
        list[str] | None, typer.Option(help="Hold a searched key at the recipe's value, e.g. --keep train.compile.")
    ] = None,
    steps: Annotated[int, typer.Option(min=1, help="Timed optimizer steps per measured layout.")] = 3,
    warmup: Annotated[int, typer.Option(min=0, help="Untimed optimizer steps before them.")] = 2,
    link_gbps: Annotated[
        float | None, typer.Option(help="Per-rank link rate for the model where torchrun cannot measure it.")
    ] = None,
    every: Annotated[bool, typer.Option("--all", help="List every candidate, not only the measured and the best.")] = (
        False
    ),
) -> None:
    from dlx.errors import UserError
    from dlx.train.recipe import split_command_line

    recipe, overrides = split_command_line(list(ctx.args))
    if recipe is None:
        raise UserError("dlx tune needs a recipe: dlx tune RECIPE.yaml [--section.key VALUE ...]")
    if not math.isfinite(budget_min) or budget_min <= 0:
        raise UserError(f"--budget-min must be a positive number of minutes, got {budget_min}")
    out_path = out or Path("runs") / "tune" / f"{Path(recipe).stem}-tuned.yaml"
    options = {
        "world_size": world_size,
        "budget_s": 60 * budget_min,
        "memory_limit_gb": memory_limit_gb,
        "keep": tuple(key for item in keep or [] for key in item.split(",") if key),
        "steps": steps,
        "warmup": warmup,
        "link_gbps": link_gbps,
    }
    options["save_folder"] = str(out_path.parent)
    run_tune_command(recipe, overrides, options, out_path, as_json, every)


def run_tune_command(
    recipe: str, overrides: list[str], options: dict[str, Any], out: Path, as_json: bool, every: bool = False
) -> dict[str, Any] | None:
    """Tune, write OUT, OUT.md and OUT.json on rank 0 and print the table (or the JSON); returns the JSON object on
    rank 0, None on the other ranks."""
    from dlx.bench.tune.report import markdown_lines, tune_json, write_outputs
    from dlx.bench.tune.search import TuneSettings, run_tune
    from dlx.parallel.distributed import env_from_torchrun

    is_main = env_from_torchrun().is_main
    settings = TuneSettings(recipe, tuple(overrides), **options)
    quiet = stdout_to_stderr() if as_json else contextlib.nullcontext()
    with quiet, measuring_bar(settings.budget_s, is_main and not as_json) as progress:
        result = run_tune(settings, progress)
    if not is_main:
        return None
    written = write_outputs(result, recipe, out)
    summary = tune_json(result, out)
    if as_json:
        print(json.dumps(summary))
    else:
        print("\n".join(markdown_lines(result, every)))
        print(f"winner: {result.winner.layout.label()}")
        print("wrote " + ", ".join(str(path) for path in written))
    return summary


@contextlib.contextmanager
def stdout_to_stderr() -> Iterator[None]:
    """Standard output sent to standard error, at the file descriptor too, while the search runs: what DeepSpeed and
    its op builders print must not precede `--json`'s one object."""
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def pretrain_tuned(
    recipe: str | None, overrides: list[str], run_dir: Path | None, resume: bool, budget_min: float
) -> int:
    """`dlx pretrain --tune`: tune the recipe, train with the winner in RUN_DIR, and leave tune.yaml, tune.md and
    tune.json (every candidate) in the run folder. Under torchrun every rank takes part in the search and trains with
    the same winner (rank 0's measurements decide)."""
    import shutil
    import tempfile

    from dlx.bench.tune.report import tuned_recipe_text, write_outputs
    from dlx.bench.tune.search import TuneSettings, run_tune
    from dlx.errors import UserError
    from dlx.parallel.distributed import env_from_torchrun
    from dlx.train.launch import launch
    from dlx.train.rundir import folder

    if recipe is None or resume:
        raise UserError("--tune needs a recipe and a new run: dlx pretrain RECIPE.yaml --tune (without --resume)")
    if not math.isfinite(budget_min) or budget_min <= 0:
        raise UserError(f"--tune-budget-min must be a positive number of minutes, got {budget_min}")
    launched = env_from_torchrun()
    if launched.world_size > 1 and run_dir is None:
        raise UserError("--tune under torchrun needs --run-dir DIR: every rank must train in the same folder")
    run_dir = folder.new_run_dir(Path(recipe).stem, run_dir)
    with measuring_bar(60 * budget_min, launched.is_main) as progress:
        result = run_tune(TuneSettings(recipe, tuple(overrides), budget_s=60 * budget_min), progress)
    with tempfile.TemporaryDirectory() as tmp:
        tuned = Path(tmp) / f"{Path(recipe).stem}-tuned.yaml"
        if launched.is_main:
            write_outputs(result, recipe, tuned)
            print(f"tuned: {result.winner.layout.label()}")
        else:
            tuned.write_text(tuned_recipe_text(result, recipe))
        try:
            return launch(str(tuned), [], run_dir, False)
        finally:
            if launched.is_main and run_dir.is_dir():
                for suffix in (".yaml", ".md", ".json"):
                    shutil.copyfile(tuned.with_suffix(suffix), run_dir / f"tune{suffix}")


@contextlib.contextmanager
def measuring_bar(budget_s: float, shown: bool) -> Iterator[Callable[[str, float], None] | None]:
    """A progress bar on stderr over the budget's seconds, its text the layout being measured (None when hidden)."""
    if not shown:
        yield None
        return
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    columns = (TextColumn("tune: {task.description}"), BarColumn(), TimeElapsedColumn())
    bar = Progress(*columns, console=Console(stderr=True))
    task = bar.add_task("measuring", total=budget_s)

    def update(label: str, elapsed_s: float) -> None:
        bar.start()  # on the first measurement: a bad input's line comes alone
        bar.update(task, description=label, completed=min(elapsed_s, budget_s))

    try:
        yield update
    finally:
        bar.stop()


def register(app: typer.Typer) -> None:
    app.command(
        "tune",
        help=TUNE_HELP,
        context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
        options_metavar="RECIPE.yaml [--section.key VALUE ...] [OPTIONS]",
    )(tune)
