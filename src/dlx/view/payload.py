"""The one JSON object the page draws: every run's series (cut to the screen), evaluations, tasks, events, goodput,
mixture per stage and verdict; `dlx tune` outputs; the config differences; the problems met while reading.

Each run's x axes are `step`, `tokens` (trained up to the step) and `time` (seconds since the run's first start, or,
for records without wall-clock time, the seconds of its steps alone: `time_kind` says which). Evaluations, tasks and
events take their tokens and, without a time of their own, their time from the step records around them.
"""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np

from dlx.view.columns import DRAWN, StepColumns
from dlx.view.envelope import bucket_starts, envelope, first_of_bucket, rounded
from dlx.view.files import read_text
from dlx.view.reader import RunReader
from dlx.view.sources import Place, Problems, resolve
from dlx.view.summary import config_differences, goodput, stage_mixtures, start_time, verdict

EVENT_DETAILS_SKIPPED = ("event", "step", "time")


class Viewer:
    """The runs and tune outputs named by `arguments`, read again by each `refresh`; `payload` for the page."""

    def __init__(self, arguments: list[str], points: int = 1000, refresh_s: float | None = None) -> None:
        self.arguments, self.points, self.refresh_s = arguments, points, refresh_s
        self.problems = Problems()
        self.places: list[Place] = []
        self.readers: dict[str, RunReader] = {}
        self.tunes: dict[str, dict[str, Any]] = {}
        self._built: dict[str, tuple[int, dict[str, Any]]] = {}

    def refresh(self) -> None:
        self.places = resolve(self.arguments, self.problems)
        for place in self.places:
            if place.kind == "tune":
                self.tunes[place.where] = tune_payload(place, self.problems)
                continue
            reader = self.readers.setdefault(place.where, RunReader(place))
            reader.refresh(self.problems)

    def run_places(self) -> list[Place]:
        return [p for p in self.places if p.kind == "run"]

    def payload(self) -> dict[str, Any]:
        runs = []
        for place in self.run_places():
            reader = self.readers[place.where]
            cached = self._built.get(place.where)
            if cached is None or cached[0] != reader.generation:
                cached = (reader.generation, run_payload(reader, self.points))
                self._built[place.where] = cached
            runs.append({**cached[1], "name": place.name})
        configs = [self.readers[p.where].config for p in self.run_places()]
        return {
            "runs": runs,
            "tunes": [self.tunes[p.where] for p in self.places if p.kind == "tune" and self.tunes.get(p.where)],
            "config_diff": config_differences(configs) if len(configs) > 1 else [],
            "problems": list(self.problems.lines),
            "refresh_s": self.refresh_s,
        }


def run_payload(reader: RunReader, points: int) -> dict[str, Any]:
    columns = reader.columns
    events = reader.records["events.jsonl"]
    evals, tasks = reader.records["eval.jsonl"], reader.records["tasks.jsonl"]
    axes = Axes(columns, events)
    starts = bucket_starts(len(columns), points)
    return {
        "where": reader.place.where,
        "time_kind": axes.time_kind,
        "x": {name: first_of_bucket(values, starts) for name, values in axes.step_axes().items()},
        "series": {key: envelope(columns.values[key], starts) for key in DRAWN if _any_finite(columns.values[key])},
        "breaks": process_starts(columns, starts),
        "evals": point_series(evals, axes, points, ("eval_s", "batches", "perplexity")),
        "tasks": point_series(tasks, axes, points, ("tasks_s",), skip_suffix="_stderr"),
        "events": [event_payload(e, axes) for e in events],
        "checkpoints": sorted(reader.checkpoints.values(), key=lambda c: c["name"]),
        "goodput": goodput(columns, events, evals, tasks),
        "mixture": stage_mixtures(reader.config, columns),
        "verdict": verdict(columns, reader.verdict_text),
        "status": status(reader),
    }


class Axes:
    """A run's step → tokens and step → seconds maps, for records that carry only a step."""

    def __init__(self, columns: StepColumns, events: list[dict[str, Any]]) -> None:
        self.steps = np.asarray(columns.step, dtype=np.float64)
        self.tokens = np.asarray(columns.tokens, dtype=np.float64)
        self.t0 = start_time(columns, events)
        times = np.asarray(columns.time, dtype=np.float64)
        if len(times) and not math.isnan(self.t0) and np.isfinite(times).all():
            self.time_kind, self.seconds = "wall", times - self.t0
        else:
            step_s = np.nan_to_num(np.asarray(columns.values["step_s"], dtype=np.float64))
            self.time_kind, self.seconds = "trained", np.cumsum(step_s * np.asarray(columns.window))
            self.t0 = math.nan

    def step_axes(self) -> dict[str, Any]:
        return {"step": self.steps, "tokens": self.tokens, "time": self.seconds}

    def at(self, steps: list[float], times: list[float] | None = None) -> dict[str, list]:
        """Tokens and seconds at these steps (interpolated between records); a wall-clock time given wins."""
        if not len(self.steps):
            return {"step": rounded(steps), "tokens": [None] * len(steps), "time": [None] * len(steps)}
        tokens = np.interp(steps, self.steps, self.tokens)
        seconds = np.interp(steps, self.steps, self.seconds)
        if times is not None and self.time_kind == "wall":
            given = np.asarray(times, dtype=np.float64) - self.t0
            seconds = np.where(np.isfinite(given), given, seconds)
        return {"step": rounded(steps), "tokens": rounded(tokens), "time": rounded(seconds)}


def process_starts(columns: StepColumns, starts: np.ndarray) -> list[int]:
    """The buckets where a later process's records begin (a restart): the page breaks its lines there."""
    if not len(starts):
        return []
    flags = np.asarray(columns.values["first_of_process"], dtype=np.float64)
    return [int(b) for b in np.flatnonzero(np.add.reduceat(flags, starts) > 0) if b > 0]


def point_series(
    records: list[dict[str, Any]], axes: Axes, points: int, skipped: tuple[str, ...], skip_suffix: str = "\0"
) -> dict[str, Any]:
    """eval.jsonl or tasks.jsonl as {"x": axes, "series": {key: envelope}}; a mapping of numbers (`source_loss`) as
    one series per name (`source_loss/NAME`)."""
    columns: dict[str, list[float]] = {}
    for i, record in enumerate(records):
        for key, value in _numbers(record):
            if key in skipped or key == "step" or key.endswith(skip_suffix):
                continue
            columns.setdefault(key, [math.nan] * len(records))[i] = value
    steps = [float(r.get("step") or 0) for r in records]
    starts = bucket_starts(len(records), points)
    x = axes.at([steps[i] for i in starts])
    return {"x": x, "series": {key: envelope(values, starts) for key, values in sorted(columns.items())}}


def _numbers(record: dict[str, Any]):
    for key, value in record.items():
        if isinstance(value, dict):
            for name, inner in value.items():
                if _is_number(inner):
                    yield f"{key}/{name}", float(inner)
        elif _is_number(value):
            yield key, float(value)


def event_payload(event: dict[str, Any], axes: Axes) -> dict[str, Any]:
    step = float(event.get("step") or 0)
    time = event.get("time") if _is_number(event.get("time")) else math.nan
    x = {axis: values[0] for axis, values in axes.at([step], [time]).items()}
    details = ", ".join(
        f"{k} {v}" for k, v in event.items() if k not in EVENT_DETAILS_SKIPPED and not isinstance(v, dict)
    )
    return {"event": str(event.get("event", "")), "step": event.get("step"), "x": x, "details": details}


def status(reader: RunReader) -> dict[str, Any]:
    columns = reader.columns
    last = len(columns) - 1
    return {
        "records": len(columns),
        "last_step": columns.step[last] if columns.step else None,
        "last_loss": rounded([columns.values["loss"][last]])[0] if columns.step else None,
        "finished": bool(reader.verdict_text),
        "has_metrics": reader.files["metrics.jsonl"].seen,
    }


def tune_payload(place: Place, problems: Problems) -> dict[str, Any]:
    """A `dlx tune` JSON's candidates, predicted against measured."""
    text = read_text(place.where)
    try:
        data = json.loads(text or "")
    except ValueError:
        problems.add(f"{place.where}: not a whole JSON file (a tune still writing it?); it is left out")
        return {}
    keys = (
        "label", "predicted_step_s", "predicted_before_measured_s", "measured_step_s", "predicted_tokens_per_s",
        "tokens_per_s", "predicted_mfu", "mfu", "estimate_gb", "peak_mem_gb", "winner", "drop",
    )  # fmt: skip
    return {
        "name": place.name,
        "where": place.where,
        "about": {k: data.get(k) for k in ("world_size", "global_batch", "seq_len", "precision", "device", "measured")},
        "candidates": [{k: c.get(k) for k in keys} for c in data.get("candidates") or []],
    }


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _any_finite(values: list[float]) -> bool:
    return any(not math.isnan(v) for v in values)
