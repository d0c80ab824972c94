"""`dlx eval`: lm-evaluation-harness tasks on a saved checkpoint."""

from __future__ import annotations

import json
from typing import Annotated

import typer


def eval_checkpoint(
    path: Annotated[
        str,
        typer.Argument(
            metavar="RUN_DIR_OR_CHECKPOINT",
            help="A run folder (its newest complete checkpoint), a checkpoint (any layout, DCP included) or a dlx "
            "model folder; also an s3://, gs://, hf:// run folder or checkpoint.",
        ),
    ],
    tasks: Annotated[
        str,
        typer.Option(
            help="Comma-separated lm-eval task names or task YAML paths, e.g. dlx_stdlib_next_line; `passkey` is "
            "dlx's own passkey retrieval at a quarter, half and all of the model's context (≥ 256 tokens), "
            "depths 0, 0.5, 1 (`dlx passkey` chooses them)."
        ),
    ],
    task_dir: Annotated[str | None, typer.Option(help="A folder of local lm-eval task YAML files.")] = None,
    limit: Annotated[int | None, typer.Option(min=1, help="Documents per task at most (the first ones).")] = None,
    device: Annotated[str, typer.Option(help="auto, cpu, cuda or cuda:N.")] = "auto",
    as_json: Annotated[
        bool, typer.Option("--json", help="Print lm-evaluation-harness's results object as JSON.")
    ] = False,
) -> None:
    """Run lm-evaluation-harness tasks on a trained model, offline, through the adapter a run uses (eval.tasks), and
    dlx's passkey retrieval; print lm-eval's table, or with --json its results object ({"results": {task:
    {"acc,none": ...}}, ...}; passkey's cells as tasks of their own)."""
    from dlx.errors import UserError
    from dlx.train.observers.tasks import evaluate_checkpoint
    from dlx.train.rundir.trained import resolve_trained, say_on_stderr

    names = [name.strip() for name in tasks.split(",") if name.strip()]
    if not names:
        raise UserError("--tasks names no task; give lm-eval task names or YAML paths, e.g. dlx_stdlib_next_line")
    harness = [name for name in names if name != "passkey"]
    if harness:
        from dlx.evals.harness import check_lm_eval

        check_lm_eval("dlx eval")  # before a URL's model is downloaded
    found = resolve_trained(path, "dlx eval", say_on_stderr)
    say_on_stderr(f"dlx eval: {found.describe()}")
    results = evaluate_checkpoint(found, harness, task_dir, limit, device) if harness else {"results": {}}
    if "passkey" in names:
        from dlx import device as dev
        from dlx.evals.passkey import passkey_results, run_passkey, score_table
        from dlx.train.rundir.trained import load_trained

        trained = load_trained(found, dev.resolve_device(device))
        scores = run_passkey(trained.model, trained.tokenizer, None, (0.0, 0.5, 1.0), limit or 5, 0)
        results["results"].update(passkey_results(scores))
        if not as_json:
            print("\n".join(score_table(scores)))
    if harness:
        from lm_eval.utils import handle_non_serializable, make_table

        print(json.dumps(results, indent=2, default=handle_non_serializable) if as_json else make_table(results))
    elif as_json:
        print(json.dumps(results, indent=2))


def register(app: typer.Typer) -> None:
    app.command("eval")(eval_checkpoint)
