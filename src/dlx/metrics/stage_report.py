"""report.md's "Stages" section for a run with `data.stages`: each stage's steps, its requested and realised mixture,
and each source's validation loss and bits per byte at the stage's last evaluation. Read from what the run wrote
(events.jsonl's `stage` and `stage_end` lines, eval.jsonl, metrics.jsonl's `stage_tokens` for a stage cut short), so
the numbers are the ones any reader of the run folder (`dlx view`) finds there."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def stages_section(
    events: Sequence[dict[str, Any]], records: Sequence[dict[str, Any]], eval_records: Sequence[dict[str, Any]]
) -> list[str]:
    """The section's lines; none for a run without stages."""
    begun = {e["stage"]: e for e in events if e.get("event") == "stage"}  # a resumed run may repeat one: the last
    if not begun:
        return []
    ended = {e["stage"]: e for e in events if e.get("event") == "stage_end"}
    lines = [
        "## Stages",
        "",
        "Each stage's steps and sequence length; per source, its requested share of the stage's windows, the share of",
        "the stage's training tokens it supplied, and its validation loss and bits per byte at the stage's last",
        "evaluation.",
        "",
        "| stage | steps | seq_len | source | requested | realised | tokens | val loss | val bpb |",
        "|---:|---|---:|---|---:|---:|---:|---:|---:|",
    ]
    for index in sorted(begun):
        start = begun[index]
        last_step = ended[index]["step"] if index in ended else _last_logged(records, index, start["last_step"])
        tokens = ended[index]["source_tokens"] if index in ended else _logged_tokens(records, index)
        evaluated = _last_eval(eval_records, start["step"], last_step)
        total = sum(tokens.values()) or 1
        names = list(start.get("mix") or {}) or list(tokens)
        for name in names or ["(synthetic)"]:
            loss = (evaluated.get("source_loss") or {}).get(name, evaluated.get("loss") if len(names) < 2 else None)
            bpb = (evaluated.get("source_bpb") or {}).get(name, evaluated.get("bpb") if len(names) < 2 else None)
            requested = (start.get("mix") or {}).get(name)
            lines.append(
                f"| {index} | {start['step']:,}-{last_step:,} | {start['seq_len']:,} | {name} | {_pct(requested)} | "
                f"{_pct(tokens.get(name, 0) / total if tokens else None)} | {tokens.get(name, 0):,} | "
                f"{_num(loss)} | {_num(bpb)} |"
            )
    return lines


def _last_logged(records: Sequence[dict[str, Any]], stage: int, planned_last: int) -> int:
    steps = [r["step"] for r in records if r.get("stage") == stage and not r.get("abandoned")]
    return max(steps) if steps else planned_last


def _logged_tokens(records: Sequence[dict[str, Any]], stage: int) -> dict[str, int]:
    """A stage not run to its end: its tokens at its last logged record."""
    logged = [r for r in records if r.get("stage") == stage and r.get("stage_tokens") is not None]
    return dict(logged[-1]["stage_tokens"]) if logged else {}


def _last_eval(eval_records: Sequence[dict[str, Any]], first: int, last: int) -> dict[str, Any]:
    within = [r for r in eval_records if first <= r["step"] <= last]
    return within[-1] if within else {}


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2%}"


def _num(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.4f}"
