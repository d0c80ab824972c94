"""From the command line to `pretrain`: the recipe (or a resumed run's own config), overrides, exit status."""

from __future__ import annotations

from pathlib import Path

from dlx.errors import UserError
from dlx.train.recipe import load_recipe, parse_overrides
from dlx.train.rundir import folder


def launch(recipe: str | None, overrides: list[str], run_dir: Path | None, resume: bool | str) -> int:
    """Train; 0 when the run finished, 128 + signal number when a signal stopped it (after a checkpoint).
    `resume`: False, True, or "auto" (resume when --run-dir holds a run, else start one there)."""
    existing = resolve_resume(run_dir, resume)
    if existing:
        refuse_new_init_from(overrides)
    if recipe is None and existing and run_dir is not None:
        config = load_recipe(None, overrides, base=folder.saved_config(run_dir), resuming=True)
        name = run_dir.name
    else:
        config = load_recipe(recipe, overrides, resuming=existing)
        name = Path(recipe).stem if recipe else "run"
    from dlx.train.loop.trainer import pretrain  # torch and the rest only once the recipe is known to be valid

    result = pretrain(config, name, run_dir, existing)
    return 0 if result.stopped_by is None else result.exit_code


def resolve_resume(run_dir: Path | None, resume: bool | str) -> bool:
    """--resume auto: whether --run-dir holds a run to continue (else a new run starts there), decided here once; a
    bool goes on. Under torchrun every rank reads the folder before the process group's rendezvous, and nothing writes
    config.yaml before every rank has passed it, so the ranks read the same answer (`pretrain` then takes rank 0's)."""
    return folder.holds_a_run(run_dir) if resume == "auto" else bool(resume)


def refuse_new_init_from(overrides: list[str]) -> None:
    """`--model.init_from` starts a run from other weights; `--resume` continues a run from its own checkpoint. (A run
    started with init_from resumes from its checkpoint: its config.yaml or recipe keeps init_from as a record.)"""
    if any((section, key) == ("model", "init_from") for section, key, _ in parse_overrides(overrides)):
        raise UserError(
            "--model.init_from starts a new run from other weights and --resume continues a run from its own "
            "checkpoint; give one of them (to start from a run's weights: --model.init_from RUN_DIR without --resume)"
        )
