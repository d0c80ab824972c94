"""lm-evaluation-harness tasks, offline: resolve the names (lm-eval's own, local task folders, task YAML files, the
tasks dlx ships), load them once, run them on a model adapter, and flatten lm-eval's results into a record.

lm-eval never touches the network here: HF_DATASETS_OFFLINE and HF_HUB_OFFLINE are on while it loads and runs tasks
(`offline`), so a task whose data is not on disk (a hub dataset never downloaded) fails when it is loaded, before step
1, with one line. Local tasks read their documents from files (`dataset_path: json`, `dataset_kwargs.data_files`).
The metrics (and their standard errors) are lm-eval's own; nothing here computes one.

A task YAML is code: lm-eval's `!function module.name` imports `module.py` from the YAML's folder when the task is
loaded. Before loading, one line per `!function` names the task, its YAML file and the Python file it imports
(`function_lines`; rank 0 prints them under torchrun).
"""

from __future__ import annotations

import logging
import os
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dlx.errors import UserError
from dlx.evals.stdlib_task import SHIPPED_TASKS, shipped_task_dir

OFFLINE_VARIABLES = ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE")
QUIET_LOGGERS = ("lm_eval", "lm-eval", "datasets", "evaluate")
BOOTSTRAP_ITERS = 1000
"""lm-eval's bootstrap resamples for the standard errors of metrics that have no closed form (acc has one)."""


def check_lm_eval(what: str) -> None:
    """One line when lm-evaluation-harness is missing."""
    try:
        import lm_eval  # noqa: F401
    except ImportError:
        raise UserError(f"{what} needs lm-evaluation-harness: pip install 'dlx[eval]'") from None


@contextmanager
def offline() -> Iterator[None]:
    """Hugging Face datasets and hub offline, no progress bars, lm-eval's loggers at WARNING; all restored after."""
    saved = {name: os.environ.get(name) for name in OFFLINE_VARIABLES}
    os.environ.update(dict.fromkeys(OFFLINE_VARIABLES, "1"))
    flags = _offline_flags(True) + _quiet_progress()
    levels = {name: logging.getLogger(name).level for name in QUIET_LOGGERS}
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        _restore_flags(flags)
        for name, level in levels.items():
            logging.getLogger(name).setLevel(level)


def _offline_flags(value: bool) -> list[tuple[Any, str, Any]]:
    """datasets and huggingface_hub read the variables once, at import: set their copies too."""
    import datasets.config
    import huggingface_hub.constants

    saved = []
    for module, name in ((datasets.config, "HF_DATASETS_OFFLINE"), (huggingface_hub.constants, "HF_HUB_OFFLINE")):
        if hasattr(module, name):
            saved.append((module, name, getattr(module, name)))
            setattr(module, name, value)
    return saved


def _quiet_progress() -> list[tuple[Any, str, Any]]:
    """lm-eval's per-task progress bar (`Task.build_all_requests`) off: a run's console has its own progress; tqdm
    reads TQDM_DISABLE only when imported, so the bar is disabled where lm-eval's module calls it."""
    import functools

    import lm_eval.api.task
    from tqdm import tqdm

    saved = [(lm_eval.api.task, "tqdm", lm_eval.api.task.tqdm)]
    lm_eval.api.task.tqdm = functools.partial(tqdm, disable=True)
    return saved


def _restore_flags(saved: list[tuple[Any, str, Any]]) -> None:
    for module, name, value in saved:
        setattr(module, name, value)


@dataclass
class TaskSet:
    """Tasks resolved and loaded once; `run` evaluates them on a model as often as asked."""

    names: list[str]
    """The tasks as given (names or YAML paths)."""
    entries: list[Any]
    """What lm-eval gets: task names, or the configs read from YAML files."""
    manager: Any
    """lm_eval.tasks.TaskManager over the local task folders (and lm-eval's own tasks when a name needs them)."""
    limit: int | None
    """Documents per task at most; None: all."""
    resolved: list[str] = field(default_factory=list)
    """The tasks lm-eval runs, by name (a YAML file's `task`, a group's tasks): what decontamination records."""

    def run(self, lm: Any) -> dict[str, Any]:
        """lm-eval's results object ({"results": {task: {"acc,none": ..., "acc_stderr,none": ...}}, "configs", ...})
        from `lm_eval.evaluator.evaluate`: unlike `simple_evaluate` it leaves the global random generators alone (a
        training run goes on after it) and runs no git or pip to describe the environment."""
        from lm_eval.evaluator import evaluate

        with offline():
            tasks = self.manager.load(self.entries)  # fresh task objects: documents from the datasets cache
            return evaluate(
                lm, tasks, limit=self.limit, bootstrap_iters=BOOTSTRAP_ITERS, log_samples=False, verbosity="WARNING"
            )


def load_tasks(names: list[str], task_dir: str | None, limit: int | None, option: str = "eval.tasks") -> TaskSet:
    """Resolve every task and load its documents (offline); one UserError naming the first that does not."""
    check_lm_eval(option)
    from lm_eval.tasks import TaskManager
    from lm_eval.tasks._yaml_loader import load_yaml  # how lm-eval's own CLI reads a task given as a YAML path

    folders, entries = _task_folders(names, task_dir, option), []
    for name in names:
        path = Path(name)
        if name.endswith((".yaml", ".yml")):
            if not path.is_file():
                raise UserError(f"{option}: task file {name} does not exist")
            announce(function_lines(name, [path]))  # before load_yaml imports them
            entries.append(load_yaml(path, resolve_func=True))
        else:
            entries.append(name)
    wanted = [e for e in entries if isinstance(e, str)]
    with offline():
        manager = TaskManager(include_path=[str(f) for f in folders] or None, include_defaults=False)
        if any(name not in manager.all_tasks for name in wanted):
            manager = TaskManager(include_path=[str(f) for f in folders] or None)  # lm-eval's own tasks too
        unknown = [name for name in wanted if name not in manager.all_tasks]
        if unknown:
            where = f" or in eval.task_dir {task_dir}" if task_dir else ""
            raise UserError(f"{option}: unknown task {unknown[0]!r}: not one of lm-eval's tasks{where}")
        for name in wanted:
            announce(function_lines(name, _indexed_yaml(manager, name)))
        resolved = [task for entry in entries for task in _load_offline(entry, manager, option)]
    return TaskSet(list(names), entries, manager, limit, resolved)


FUNCTION_TAG = re.compile(r"!function\s+([A-Za-z_][\w.]*)")
INCLUDE_KEY = re.compile(r"^include:\s*['\"]?([^'\"\s#]+)", re.MULTILINE)


def function_lines(task: str, yaml_files: list[Path]) -> list[str]:
    """One line per `!function` in a task's YAML files (and the files they `include:`): the Python lm-eval imports."""
    lines, seen, queue = [], set(), list(yaml_files)
    while queue:
        path = queue.pop(0).resolve()
        if path in seen or not path.is_file():
            continue
        seen.add(path)
        text = path.read_text(encoding="utf-8", errors="replace")
        queue += [path.parent / include for include in INCLUDE_KEY.findall(text)]
        for target in FUNCTION_TAG.findall(text):
            module = path.parent / (target.rpartition(".")[0].replace(".", "/") + ".py")
            lines.append(f"task {task}: {path} runs Python: !function {target} imports {module}")
    return lines


def _indexed_yaml(manager: Any, name: str) -> list[Path]:
    """The YAML file lm-eval's index found the task in (None for tasks defined in Python)."""
    entry = manager.task_index.get(name)
    yaml_path = entry.get("yaml_path") if isinstance(entry, dict) else getattr(entry, "yaml_path", None)
    return [Path(yaml_path)] if yaml_path and str(yaml_path).endswith((".yaml", ".yml")) else []


def announce(lines: list[str]) -> None:
    if os.environ.get("RANK", "0") == "0":
        for line in lines:
            print(line, file=sys.stderr, flush=True)


def _task_folders(names: list[str], task_dir: str | None, option: str) -> list[Path]:
    folders = [shipped_task_dir(name) for name in names if name in SHIPPED_TASKS]  # generated at first use
    if task_dir is not None:
        if not Path(task_dir).is_dir():
            raise UserError(f"eval.task_dir {task_dir} does not exist; give a folder of lm-eval task YAML files")
        folders.append(Path(task_dir))
    return folders


def _load_offline(entry: Any, manager: Any, option: str) -> list[str]:
    """Load one task (and its documents) offline; the names of the tasks it resolves to (a group: its tasks)."""
    name = entry if isinstance(entry, str) else entry.get("task", "?")
    try:
        return list(manager.load([entry])["tasks"])
    except Exception as e:  # datasets and lm-eval raise many kinds; the first line says which
        reason = str(e).splitlines()[0][:200] if str(e) else type(e).__name__
        raise UserError(
            f"{option}: task {name!r} does not load offline ({reason}); give a local task (dataset_path: json with "
            "data_files) or download its dataset first"
        ) from None


def task_metrics(results: dict[str, Any]) -> dict[str, float | None]:
    """lm-eval's results flattened to {"task/metric": value}: every metric with its `_stderr`, the filter kept after
    a comma when it is not `none` (e.g. `gsm8k/exact_match,flexible-extract`)."""
    flat: dict[str, float | None] = {}
    for task, metrics in results.get("results", {}).items():
        for key, value in metrics.items():
            metric, _, filter_name = key.partition(",")
            if not filter_name or not (isinstance(value, (int, float)) or value in (None, "N/A")):
                continue  # alias, sample counts
            name = metric if filter_name == "none" else f"{metric},{filter_name}"
            flat[f"{task}/{name}"] = None if value in (None, "N/A") else float(value)
    return flat


def metric_table(results: dict[str, Any]) -> list[tuple[str, str, float | None, float | None]]:
    """(task, metric, value, stderr) rows, as lm-eval's own table lists them."""
    flat, rows = task_metrics(results), []
    for key, value in flat.items():
        task, metric = key.split("/", 1)
        base, _, filter_name = metric.partition(",")
        if base.endswith("_stderr"):
            continue
        stderr_key = f"{task}/{base}_stderr" + (f",{filter_name}" if filter_name else "")
        rows.append((task, metric, value, flat.get(stderr_key)))
    return rows
