"""From the command line to `pretrain`: the recipe (or a resumed run's own config), overrides, exit status."""

from __future__ import annotations

from pathlib import Path

from dlx.train import folder
from dlx.train.recipe import load_recipe


def launch(recipe: str | None, overrides: list[str], run_dir: Path | None, resume: bool) -> int:
    """Train; 0 when the run finished, 128 + signal number when a signal stopped it (after a checkpoint)."""
    if recipe is None and resume and run_dir is not None:
        config = load_recipe(None, overrides, base=folder.saved_config(run_dir))
        name = run_dir.name
    else:
        config = load_recipe(recipe, overrides)
        name = Path(recipe).stem if recipe else "run"
    from dlx.train.trainer import pretrain  # torch and the rest only once the recipe is known to be valid

    result = pretrain(config, name, run_dir, resume)
    return 0 if result.stopped_by is None else result.exit_code
