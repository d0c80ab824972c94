"""Evaluation task documents as text, for decontaminating training data: each document rendered as lm-eval renders
it (the context, then the answer: for a multiple-choice task the correct choice), resolved and loaded offline like
`eval.tasks` (`harness.load_tasks`)."""

from __future__ import annotations

from typing import Any

from dlx.evals.harness import load_tasks, offline


def task_documents(
    names: list[str], task_dir: str | None = None, option: str = "--decontaminate"
) -> dict[str, list[str]]:
    """{task name: [context + answer per evaluation document]}; UserError (from load_tasks) for a task not on disk."""
    task_set = load_tasks(names, task_dir, None, option)
    with offline():
        loaded = task_set.manager.load(task_set.entries)["tasks"]
    return {name: [_rendered(task, doc) for doc in task.eval_docs] for name, task in loaded.items()}


def _rendered(task: Any, doc: Any) -> str:
    context, target = task.doc_to_text(doc), task.doc_to_target(doc)
    if task.OUTPUT_TYPE == "multiple_choice":
        choices = task.doc_to_choice(doc)
        target = choices[target] if isinstance(target, int) else target
    return f"{context}{task.config.target_delimiter}{target}"
