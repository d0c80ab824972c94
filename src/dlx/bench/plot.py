"""`dlx bench`'s PNG: tokens/s (above) and peak memory (below) against seq len, one line per micro-batch (and per
precision, accumulation and compile setting when the sweep has more than one). Measured points only; OOM points have
no line. Drawn on the same Agg figure helpers as the training report (no pyplot, written atomically)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dlx.metrics.plots import _figure, _save  # the report's figure and atomic-save helpers, shared on purpose

VARYING = ("precision", "grad_accum", "compile", "model", "device")
"""Columns that, when they differ between rows, split a micro-batch's line into several."""


def plot_sweep(path: Path, rows: list[dict[str, Any]]) -> Path | None:
    """Write the PNG; None (no file) when no point was measured."""
    measured = [row for row in rows if row["status"] == "ok"]
    if not measured:
        return None
    fig, (top, bottom) = _figure(rows=2)
    for label, line in _lines(measured).items():
        line.sort(key=lambda row: row["seq_len"])
        seq_lens = [row["seq_len"] for row in line]
        top.plot(seq_lens, [row["tokens_per_s"] for row in line], "o-", label=label, markersize=4)
        bottom.plot(seq_lens, [row["peak_mem_gb"] for row in line], "o-", label=label, markersize=4)
    top.set(ylabel="tokens/s", title="Throughput and peak memory against sequence length")
    bottom.set(xlabel="sequence length (tokens)", ylabel="peak memory (GB)")
    for ax in (top, bottom):
        ax.set_xscale("log", base=2)
        ax.set_ylim(bottom=0)
    top.legend(fontsize="small")
    return _save(fig, path)


def _lines(rows: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    varying = [name for name in VARYING if len({str(row[name]) for row in rows}) > 1]
    lines: dict[str, list[dict[str, Any]]] = {}
    for row in sorted(rows, key=lambda r: r["micro_batch"]):
        parts = [f"micro-batch {row['micro_batch']}", *(f"{name} {row[name]}" for name in varying)]
        lines.setdefault(", ".join(parts), []).append(row)
    return lines
