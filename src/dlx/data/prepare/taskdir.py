"""A prepare split into tasks keeps its work in DIR/.tasks until the merge: the plan every task must share, the
tokenizer, and one folder per task holding its parts and its state.

    .tasks/plan.json            inputs, request, tokenizer, task count, units and each task's range (written once)
    .tasks/tokenizer.json       the tokenizer every task encoded with (written once)
    .tasks/task-00003/          parts NNNNNNNN.tok/.doc of the task's committed units, and
    .tasks/task-00003/state.json  the next unit to encode, done, and the counts of the units committed so far

The first task to arrive publishes plan.json and tokenizer.json (create-if-absent, so two tasks starting together
agree on one); every later task and the merge compare against them. Each task's state names the plan by its hash, so a
task folder that belongs to another dataset is told apart.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

from dlx.atomic import atomic_write_text, create_once, fsync_dir
from dlx.data.prepare.outdir import TASKS_DIR
from dlx.data.prepare.scan import ScanCounts
from dlx.data.shards import TOKENIZER_FILE
from dlx.errors import UserError

PLAN_FILE = "plan.json"
STATE_FILE = "state.json"
PLAN_FORMAT = "dlx-prepare-tasks"


def tasks_dir(out: Path) -> Path:
    return out / TASKS_DIR


def task_folder(out: Path, index: int) -> Path:
    return out / TASKS_DIR / f"task-{index:05d}"


def plan_id(plan: dict) -> str:
    return hashlib.sha256(json.dumps(plan, sort_keys=True).encode()).hexdigest()


def publish_plan(out: Path, plan: dict, tokenizer_json: str) -> None:
    """Write plan.json and tokenizer.json unless a task already did; UserError if that task's plan differs."""
    folder = tasks_dir(out)
    folder.mkdir(parents=True, exist_ok=True)
    create_once(folder / PLAN_FILE, (json.dumps(plan, indent=1) + "\n").encode())
    existing = read_plan(out)
    if existing != plan:
        raise UserError(
            f"--out {out} holds tasks of a prepare with other inputs or options (differs in: "
            f"{', '.join(_differences(existing, plan))}); give every task the same inputs and options, or choose "
            "another --out"
        )
    create_once(folder / TOKENIZER_FILE, tokenizer_json.encode())
    if hashlib.sha256((folder / TOKENIZER_FILE).read_bytes()).hexdigest() != plan["tokenizer"]["sha256"]:
        raise UserError(f"{folder / TOKENIZER_FILE} was changed by hand; delete {out} and run the tasks again")


def read_plan(out: Path) -> dict:
    path = tasks_dir(out) / PLAN_FILE
    if not path.is_file():
        raise UserError(
            f"{out} holds no tasks to merge ({TASKS_DIR}/{PLAN_FILE} missing); run "
            f"`dlx prepare INPUTS --out {out} --tasks N --task-index I` for every I first"
        )
    try:
        plan = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise UserError(f"{path} is damaged ({e}); delete {out} and run the tasks again") from None
    if not isinstance(plan, dict) or plan.get("format") != PLAN_FORMAT:
        raise UserError(f"{path} is not a plan of `dlx prepare --tasks`; delete {out} and run the tasks again")
    return plan


def _differences(existing: dict, plan: dict) -> list[str]:
    """Names of what differs between two plans, as a user would say them."""
    labels = {"fingerprint": "inputs", "files": "inputs", "bytes": "inputs"}
    theirs, ours = existing.get("request", {}), plan["request"]
    differ = {labels.get(k, k) for k in theirs.keys() | ours.keys() if theirs.get(k) != ours.get(k)}
    differ |= {key for key in ("inputs", "tokenizer") if existing.get(key) != plan[key]}
    if existing.get("tasks") != plan["tasks"]:
        differ.add(f"--tasks {existing.get('tasks')} there, {plan['tasks']} here")
    return sorted(differ) or ["the plan"]


@dataclass
class TaskState:
    """What one task has committed: parts of units [first, next_unit) are in its folder."""

    plan: str
    """The hash of the plan this task belongs to."""
    index: int
    next_unit: int
    done: bool = False
    tokens: int = 0
    counts: ScanCounts = field(default_factory=ScanCounts)
    """The counts of the units committed so far, folded in unit order."""


def read_state(out: Path, index: int, plan: dict) -> TaskState | None:
    """A task's state, None if it never committed; UserError if the folder belongs to another dataset or task."""
    folder = task_folder(out, index)
    path = folder / STATE_FILE
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
        state = TaskState(**{**data, "counts": ScanCounts.from_json(data["counts"])})
    except (OSError, ValueError, TypeError, KeyError) as e:
        raise UserError(f"{path} is damaged ({e}); delete {folder} and run task {index} again") from None
    if state.plan != plan_id(plan) or state.index != index:
        raise UserError(
            f"{folder} belongs to another dataset (its plan differs from {TASKS_DIR}/{PLAN_FILE}); delete that "
            f"folder and run task {index} again"
        )
    return state


def write_state(out: Path, state: TaskState) -> None:
    """Commit a task's state: its renamed parts are made durable first."""
    folder = task_folder(out, state.index)
    fsync_dir(folder)
    data = {**state.__dict__, "counts": state.counts.to_json()}
    atomic_write_text(folder / STATE_FILE, json.dumps(data) + "\n")
