"""MetricsLogger: one JSON object per line in run_dir/metrics.jsonl (train steps), eval.jsonl, tasks.jsonl
(lm-evaluation-harness metrics, `{"step", "task/metric": value, "task/metric_stderr": value, ..., "tasks_s"}`) and
samples.jsonl (text generated during training); optional TensorBoard. (Weights & Biases is an observer of the run, fed
the same records: dlx.metrics.wandb_sink, dlx.train.observers.build.)

Lines are flushed as they are written, so a crashed run keeps every step it logged; a line cut short by a crash is
skipped by `read_jsonl`. Non-finite floats (a NaN loss) are written as null: JSON has no NaN. Only the main rank
writes; the others create nothing. After a resume, `resume_step` drops the lines past the checkpoint's step so the
files hold each step once. A torn last line is ended with a newline on open, so the next record is not glued to it.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import IO, Any

from dlx.atomic import atomic_write_text
from dlx.errors import UserError

METRICS_FILE = "metrics.jsonl"
EVAL_FILE = "eval.jsonl"
SAMPLES_FILE = "samples.jsonl"
TASKS_FILE = "tasks.jsonl"


def read_jsonl(path: str | os.PathLike) -> list[dict[str, Any]]:
    """Every complete JSON object in the file, in order; a missing file is empty, a torn line is skipped."""
    path = Path(path)
    if not path.exists():
        return []
    records = []
    for line in path.read_text().splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # a line a crash cut short
    return records


def to_json_line(record: dict[str, Any]) -> str:
    """Strict JSON (no NaN/Infinity), one line."""
    clean = {key: _jsonable(value) for key, value in record.items()}
    return json.dumps(clean, allow_nan=False, separators=(",", ":"))


class MetricsLogger:
    def __init__(
        self,
        run_dir: str | os.PathLike,
        tensorboard: bool = False,
        is_main: bool = True,
        resume_step: int | None = None,
    ) -> None:
        self.run_dir = Path(run_dir)
        self.is_main = is_main
        self._files: dict[str, IO[str]] = {}
        self._writer: Any = None
        if not is_main:
            return
        self.run_dir.mkdir(parents=True, exist_ok=True)
        for name in (METRICS_FILE, EVAL_FILE, SAMPLES_FILE, TASKS_FILE):
            _end_torn_line(self.run_dir / name)
            if resume_step is not None:
                _drop_after(self.run_dir / name, resume_step)
        if tensorboard:
            self._writer = _tensorboard_writer(self.run_dir / "tensorboard")

    def log(self, record: dict[str, Any]) -> None:
        """Append one training-step record to metrics.jsonl (and TensorBoard under train/)."""
        self._write(METRICS_FILE, "train", record)

    def log_eval(self, record: dict[str, Any]) -> None:
        """Append one evaluation record ({"step", "loss", "perplexity", ...}) to eval.jsonl (TensorBoard: eval/)."""
        self._write(EVAL_FILE, "eval", record)

    def log_tasks(self, record: dict[str, Any]) -> None:
        """Append one task evaluation ({"step", "task/metric": value, ...}) to tasks.jsonl (TensorBoard: tasks/)."""
        self._write(TASKS_FILE, "tasks", record)

    def log_sample(self, record: dict[str, Any]) -> None:
        """Append one generated text ({"step", "prompt", "text", ...}) to samples.jsonl."""
        if self.is_main:
            self._append(SAMPLES_FILE, record)

    def mark_abandoned(self, after_step: int) -> None:
        """Mark the metrics.jsonl records past `after_step` `"abandoned": true`: a spike rollback went back to that
        step, and the steps after it are trained again (their new records follow)."""
        if not self.is_main:
            return
        f = self._files.pop(METRICS_FILE, None)
        if f is not None:
            f.close()
        path = self.run_dir / METRICS_FILE
        records = read_jsonl(path)
        for record in records:
            if int(record.get("step", 0)) > after_step:
                record.setdefault("abandoned", True)
        if path.exists():
            atomic_write_text(path, "".join(to_json_line(r) + "\n" for r in records))

    def close(self) -> None:
        for f in self._files.values():
            f.close()
        self._files.clear()
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def __enter__(self) -> MetricsLogger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _write(self, name: str, tag: str, record: dict[str, Any]) -> None:
        if not self.is_main:
            return
        self._append(name, record)
        if self._writer is not None:
            step = int(record.get("step", 0))
            for key, value in record.items():
                if key != "step" and isinstance(value, (int, float)) and not isinstance(value, bool):
                    self._writer.add_scalar(f"{tag}/{key}", value, step)

    def _append(self, name: str, record: dict[str, Any]) -> None:
        if name not in self._files:
            self._files[name] = open(self.run_dir / name, "a", encoding="utf-8")  # noqa: SIM115 (kept open)
        f = self._files[name]
        f.write(to_json_line(record) + "\n")
        f.flush()


def _jsonable(value: Any) -> Any:
    if hasattr(value, "item"):  # 0-d tensors and numpy scalars
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _end_torn_line(path: Path) -> None:
    """A crash mid-write leaves a line without its newline; end it, so the next record starts a line of its own."""
    if not path.exists() or path.stat().st_size == 0:
        return
    with open(path, "rb+") as f:
        f.seek(-1, os.SEEK_END)
        if f.read(1) != b"\n":
            f.write(b"\n")


def _drop_after(path: Path, step: int) -> None:
    """Rewrite `path` without records past `step` (logged after the checkpoint a run resumes from)."""
    records = read_jsonl(path)
    kept = [r for r in records if int(r.get("step", 0)) <= step]
    if path.exists() and len(kept) != len(records):
        atomic_write_text(path, "".join(to_json_line(r) + "\n" for r in kept))


def _tensorboard_writer(log_dir: Path) -> Any:
    try:
        from torch.utils.tensorboard import SummaryWriter  # optional extra; imported only when asked for
    except ImportError:
        raise UserError(
            "log.tensorboard is true but the tensorboard package is missing: pip install 'dlx[tensorboard]'"
        ) from None
    return SummaryWriter(log_dir=str(log_dir))
