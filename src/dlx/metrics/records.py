"""What a logged step record says of its time, read without torch (`dlx view`'s live verdict, the plots, the
report): the phases a record's `<name>_s` keys hold, and which records a profiled step made slower."""

from __future__ import annotations

from typing import Any

STANDARD_PHASES = ("data_wait", "forward", "backward", "optimizer", "communication")
"""Always present in `PhaseTimer.end_step`'s result (0.0 when not entered); other names are allowed and added as they
occur."""
NON_PHASE_SECONDS = frozenset({"step_s", "other_s", "tokens_per_s"})
"""Record keys ending in `_s` that are not phase times; any other `<name>_s` key is read as a phase. Keys added to
a record later must not end in `_s` unless they are phases."""
PROFILED_KEY = "profiled_steps"
"""Record key: the profiled optimizer steps inside the record's window (absent when there were none)."""


def phase_seconds(record: dict[str, Any]) -> dict[str, float]:
    """The phases of a logged record ({"data_wait": s, "forward": s, ...}), standard ones first, `other` excluded."""
    names = [*STANDARD_PHASES]
    names += [k[:-2] for k in record if k.endswith("_s") and k not in NON_PHASE_SECONDS and k[:-2] not in names]
    return {name: float(record.get(f"{name}_s") or 0.0) for name in names}


def unprofiled(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The records whose window held no profiled step (throughput summaries use these); all of them when every
    record was profiled, so that a summary still has something to say."""
    kept = [r for r in records if not r.get(PROFILED_KEY)]
    return kept or records
