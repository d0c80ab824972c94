"""A run's metrics.jsonl as columns: one list per drawn key, one entry per kept record, grown as lines arrive.

Kept records are those a rollback did not abandon (`"abandoned": true`, dlx.metrics.logger). Besides the drawn keys the
columns hold, per record: the step, the tokens trained up to it (Σ `tokens` per step × the steps since the previous
record, so a change of tokens per step is followed), the wall-clock `time` when the record carries it, and the
optimizer steps its window averages (`window_steps`). What goodput needs of the abandoned and skipped steps is summed
as they pass; the mixture per stage keeps each stage's last `source_tokens`.
"""

from __future__ import annotations

import math
from typing import Any

DRAWN = (
    "loss",
    "lr",
    "grad_norm",
    "tokens_per_s",
    "mfu",
    "step_s",
    "data_wait_s",
    "forward_s",
    "backward_s",
    "optimizer_s",
    "communication_s",
    "other_s",
    "z_loss",
    "peak_mem_gb",
)
"""metrics.jsonl keys the page draws against step, tokens and wall-clock."""
FLAGS = ("first_of_process", "profiled_steps")
"""Record flags the verdict reads (the first record of a process, a profiled window); kept as 1.0 or 0.0."""
VERDICT_KEYS = ("mfu_dense", *FLAGS)
"""Further keys the live bottleneck verdict reads."""


def number(value: Any) -> float:
    """A record's value as a float; NaN for null, text and booleans."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return math.nan
    return float(value)


class StepColumns:
    """The kept records of one metrics.jsonl, as columns."""

    def __init__(self) -> None:
        self.clear()

    def clear(self) -> None:
        self.step: list[int] = []
        self.tokens: list[float] = []
        self.time: list[float] = []
        self.window: list[int] = []
        self.values: dict[str, list[float]] = {key: [] for key in (*DRAWN, *VERDICT_KEYS)}
        self.stage: list[int] = []
        self.stage_source_tokens: dict[int, dict[str, float]] = {}
        """Each stage's last `source_tokens` (data.mix): tokens each source supplied since step 0."""
        self.abandoned_steps = 0
        self.abandoned_s = 0.0
        self.skipped_steps = 0
        self.skipped_s = 0.0
        self._total_tokens = 0.0

    def __len__(self) -> int:
        return len(self.step)

    def add(self, records: list[dict[str, Any]]) -> None:
        for record in records:
            if "step" not in record:
                continue
            steps = int(record.get("window_steps") or 1)
            step_s = number(record.get("step_s"))
            if record.get("abandoned"):
                self.abandoned_steps += steps
                self.abandoned_s += 0.0 if math.isnan(step_s) else step_s * steps
                continue
            self._keep(record, steps, step_s)

    def _keep(self, record: dict[str, Any], steps: int, step_s: float) -> None:
        step = int(record["step"])
        previous = self.step[-1] if self.step else 0
        self._total_tokens += number(record.get("tokens")) * max(step - previous, 0) if record.get("tokens") else 0
        self.step.append(step)
        self.tokens.append(self._total_tokens)
        self.time.append(number(record.get("time")))
        self.window.append(steps)
        for key, column in self.values.items():
            column.append(float(bool(record.get(key))) if key in FLAGS else number(record.get(key)))
        stage = int(record.get("stage") or 0)
        self.stage.append(stage)
        if isinstance(record.get("source_tokens"), dict):
            self.stage_source_tokens[stage] = dict(record["source_tokens"])
        skipped = record.get("skipped_updates")
        if isinstance(skipped, list) and not math.isnan(step_s):
            self.skipped_steps += len(skipped)
            self.skipped_s += len(skipped) * step_s

    def trained_s(self) -> float:
        """Seconds of the kept records' steps (Σ step_s × window_steps), skipped updates included."""
        return math.fsum(s * w for s, w in zip(self.values["step_s"], self.window, strict=True) if not math.isnan(s))

    def verdict_records(self) -> list[dict[str, Any]]:
        """The kept records with the keys `dlx.metrics.verdict` reads, for a run that has no report.md yet."""
        keys = [k for k in self.values if k.endswith("_s") or k in ("tokens_per_s", "mfu", *VERDICT_KEYS)]
        records = []
        for i, steps in enumerate(self.window):
            record: dict[str, Any] = {"window_steps": steps}
            for key in keys:
                value = self.values[key][i]
                if not math.isnan(value):
                    record[key] = bool(value) if key in FLAGS else value
            if "step_s" in record and "tokens_per_s" in record:
                records.append(record)
        return records
