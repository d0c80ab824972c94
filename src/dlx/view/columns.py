"""A run's metrics.jsonl as columns: one array of doubles per drawn key (8 bytes a value: ten runs of 100,000 records
fit in about 150 MB), one entry per kept record, grown as lines arrive.

Kept records are those a rollback did not abandon (`"abandoned": true`, dlx.metrics.logger). Besides the drawn keys the
columns hold, per record: the step, the tokens trained up to it (Σ `tokens` per step × the steps since the previous
record, so a change of tokens per step is followed), the wall-clock `time` when the record carries it, and the
optimizer steps its window averages (`window_steps`). What goodput needs of the abandoned and skipped steps is summed
as they pass; the mixture per stage keeps each stage's last `source_tokens`.
"""

from __future__ import annotations

import math
from array import array
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
        self.step = array("q")
        self.tokens = array("d")
        self.time = array("d")
        self.window = array("q")
        self.values: dict[str, array] = {key: array("d") for key in (*DRAWN, *VERDICT_KEYS)}
        self.stage = array("q")
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
        """Append records in file order: the abandoned counted, the kept as columns (one pass per key)."""
        kept = []
        for record in records:
            if "step" not in record:
                continue
            if record.get("abandoned"):
                steps, step_s = int(record.get("window_steps") or 1), number(record.get("step_s"))
                self.abandoned_steps += steps
                self.abandoned_s += 0.0 if math.isnan(step_s) else step_s * steps
            else:
                kept.append(record)
        if not kept:
            return
        for key, column in self.values.items():
            if key in FLAGS:
                column.extend([1.0 if r.get(key) else 0.0 for r in kept])
            else:
                column.extend([v if type(v) is float else number(v) for r in kept for v in (r.get(key),)])
        self.time.extend([number(r.get("time")) for r in kept])
        self.window.extend([int(r.get("window_steps") or 1) for r in kept])
        self._add_steps(kept)

    def _add_steps(self, kept: list[dict[str, Any]]) -> None:
        """Steps, tokens trained up to each, stages, and the skipped updates."""
        for record in kept:
            step = int(record["step"])
            previous = self.step[-1] if self.step else 0
            if record.get("tokens"):
                self._total_tokens += number(record["tokens"]) * max(step - previous, 0)
            self.step.append(step)
            self.tokens.append(self._total_tokens)
            stage = int(record.get("stage") or 0)
            self.stage.append(stage)
            if isinstance(record.get("source_tokens"), dict):
                self.stage_source_tokens[stage] = dict(record["source_tokens"])
            skipped, step_s = record.get("skipped_updates"), number(record.get("step_s"))
            if isinstance(skipped, list) and not math.isnan(step_s):
                self.skipped_steps += len(skipped)
                self.skipped_s += len(skipped) * step_s

    def trained_s(self) -> float:
        """Seconds of the kept records' steps (Σ step_s × window_steps), skipped updates included."""
        return math.fsum(s * w for s, w in zip(self.values["step_s"], self.window, strict=True) if not math.isnan(s))

    def verdict_records(self, most: int) -> list[dict[str, Any]]:
        """The kept records with the keys `dlx.metrics.verdict` reads: every one, or every k-th when there are more
        than `most` (an even sample of the run; each process's first record always kept, as the verdict leaves it
        out)."""
        keys = [k for k in self.values if k.endswith("_s") or k in ("tokens_per_s", "mfu", *VERDICT_KEYS)]
        stride = max(1, -(-len(self.window) // most))
        chosen = sorted(set(range(0, len(self.window), stride)) | {i for i, f in enumerate(self.values[FLAGS[0]]) if f})
        records = []
        for i in chosen:
            record: dict[str, Any] = {"window_steps": self.window[i]}
            for key in keys:
                value = self.values[key][i]
                if not math.isnan(value):
                    record[key] = bool(value) if key in FLAGS else value
            if "step_s" in record and "tokens_per_s" in record:
                records.append(record)
        return records
