"""One run folder as `dlx view` holds it: what dlx wrote there, read again on every refresh (only what grew).

metrics.jsonl → `StepColumns`; eval.jsonl, tasks.jsonl and events.jsonl as their records; samples.jsonl counted;
config.yaml parsed; report.md's bottleneck verdict (written at the end of a run); `checkpoints/step-*` with each
one's trainer_state.json (read once per checkpoint).
"""

from __future__ import annotations

import json
import re
from typing import Any

import yaml

from dlx.view.columns import StepColumns
from dlx.view.files import LineFile, list_names, read_text
from dlx.view.sources import Place, Problems

LINE_FILES = ("metrics.jsonl", "eval.jsonl", "tasks.jsonl", "events.jsonl", "samples.jsonl")
CHECKPOINT_NAME = re.compile(r"^step-(\d+)$")


class RunReader:
    """The records of one run folder, kept up to date by `refresh`."""

    def __init__(self, place: Place) -> None:
        self.place = place
        self.files = {name: LineFile(place.file(name), f"{place.where}/{name}") for name in LINE_FILES}
        self.columns = StepColumns()
        self.records: dict[str, list[dict[str, Any]]] = {name: [] for name in LINE_FILES if name != "metrics.jsonl"}
        self.config: dict[str, Any] = {}
        self.verdict_text: list[str] = []
        self.checkpoints: dict[str, dict[str, Any]] = {}
        self.generation = 0
        """Counts the refreshes that found something new."""

    def refresh(self, problems: Problems) -> None:
        changed = False
        for name, line_file in self.files.items():
            records, reset = line_file.read_new(problems)
            changed |= bool(records) or reset
            if name == "metrics.jsonl":
                if reset:
                    self.columns.clear()
                self.columns.add(records)
            else:
                self.records[name] = ([] if reset else self.records[name]) + records
        no_metrics = (
            f"{self.place.where}: no metrics.jsonl (no step logged yet, or not a run folder); its other files are shown"
        )
        if self.files["metrics.jsonl"].seen:
            problems.discard(no_metrics)
        else:
            problems.add(no_metrics)
        changed |= self._read_small_files(problems)
        self.generation += changed

    def _read_small_files(self, problems: Problems) -> bool:
        before = (self.config, self.verdict_text, len(self.checkpoints))
        if not self.config:
            self.config = _config(read_text(self.place.file("config.yaml")), self.place, problems)
        if not self.verdict_text:
            self.verdict_text = report_verdict(read_text(self.place.file("report.md")) or "")
        self._read_checkpoints()
        return before != (self.config, self.verdict_text, len(self.checkpoints))

    def _read_checkpoints(self) -> None:
        folder = self.place.file("checkpoints")
        names = {n for n in list_names(folder) if CHECKPOINT_NAME.match(n)}
        for name in sorted(names - set(self.checkpoints)):
            text = read_text(f"{folder}/{name}/trainer_state.json")
            if text is None:
                continue  # still being written: trainer_state.json is its last file
            try:
                state = json.loads(text)
            except ValueError:
                continue
            files = state.get("files") or {}
            self.checkpoints[name] = {
                "name": name,
                "step": state.get("step"),
                "tokens_seen": state.get("tokens_seen"),
                "bytes": sum(int(f.get("size") or 0) for f in files.values() if isinstance(f, dict)),
            }
        for name in set(self.checkpoints) - names:
            del self.checkpoints[name]  # pruned (checkpoint.keep_last)


def _config(text: str | None, place: Place, problems: Problems) -> dict[str, Any]:
    if text is None:
        return {}
    try:
        config = yaml.safe_load(text)
    except yaml.YAMLError:
        problems.add(f"{place.where}/config.yaml is not YAML; the run's config is not compared")
        return {}
    return config if isinstance(config, dict) else {}


def report_verdict(report: str) -> list[str]:
    """The lines of report.md's "Bottleneck verdict" section (empty before the run ends) but its fixed rules, markdown
    emphasis removed."""
    lines, inside = [], False
    for line in report.splitlines():
        if line.startswith("## "):
            inside = line.strip() == "## Bottleneck verdict"
            continue
        if inside and line.strip() and not line.startswith("- Rules:"):
            lines.append(line.replace("**", "").removeprefix("- "))
    return lines
