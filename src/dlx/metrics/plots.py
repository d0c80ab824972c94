"""The report's PNGs: loss, throughput and MFU, phase times, downstream tasks. Matplotlib's Agg canvas, no pyplot.

`Figure` + `FigureCanvasAgg` keep no global state (no backend switch, no figure registry), so plotting is safe
inside a trainer or a test process; each PNG is rendered to memory and written atomically.
"""

from __future__ import annotations

import io
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dlx.atomic import atomic_write_bytes
from dlx.metrics.meter import Ema
from dlx.metrics.records import phase_seconds

PHASE_COLOURS = {
    "data_wait": "tab:red",
    "forward": "tab:blue",
    "backward": "tab:cyan",
    "optimizer": "tab:orange",
    "communication": "tab:purple",
    "other": "tab:gray",
}


PLOT_SMOOTHING = 0.6
"""EMA weight of the loss plot's line over the logged points (TensorBoard's default smoothing)."""


def smoothed(values: Sequence[float], weight: float = PLOT_SMOOTHING) -> list[float]:
    """The debiased EMA after each value (see `dlx.metrics.meter.Ema`)."""
    ema = Ema(weight)
    return [ema.update(v) for v in values]  # type: ignore[misc]  # values are finite: never None


def plot_loss(path: Path, records: Sequence[dict[str, Any]], eval_records: Sequence[dict[str, Any]]) -> Path:
    """Each logged step's train loss as a point, their EMA as a line, and the validation loss."""
    fig, ax = _figure()
    steps, losses = _series(records, "loss")
    ax.plot(steps, losses, "o", markersize=3, alpha=0.35, color="tab:blue", label="train loss (logged steps)")
    ax.plot(steps, smoothed(losses), color="tab:blue", linewidth=1.5, label=f"train loss, EMA {PLOT_SMOOTHING}")
    if eval_records:
        ax.plot(*_series(eval_records, "loss"), "s-", color="tab:orange", label="validation loss", markersize=4)
    ax.set(xlabel="optimizer step", ylabel="cross-entropy (nats/token)", title="Loss")
    ax.legend()
    return _save(fig, path)


def plot_throughput(path: Path, records: Sequence[dict[str, Any]]) -> Path:
    """tokens/s above, MFU in both conventions below (separate axes: with one peak they are the same curve scaled)."""
    fig, (top, bottom) = _figure(rows=2)
    top.plot(*_series(records, "tokens_per_s"), color="tab:blue", linewidth=1)
    top.set(ylabel="tokens/s (all devices)", title="Throughput and MFU")
    top.set_ylim(bottom=0)
    for key, label in (("mfu", "6·N + 12·L·H·Q·T"), ("mfu_dense", "6·N")):
        steps, values = _series(records, key)
        if steps:
            bottom.plot(steps, [100 * v for v in values], linewidth=1, label=label)
    if bottom.lines:
        bottom.set(ylabel="MFU %")
        bottom.set_ylim(bottom=0)
        bottom.legend(fontsize="small")
    else:
        bottom.set(ylabel="MFU", title="MFU omitted: no peak known for this device")
    bottom.set_xlabel("optimizer step")
    return _save(fig, path)


def plot_phases(path: Path, records: Sequence[dict[str, Any]]) -> Path:
    """Stacked areas of each phase's milliseconds per step; the top edge is the step time."""
    fig, ax = _figure()
    steps = [rec["step"] for rec in records]
    layers: dict[str, list[float]] = {}
    for i, rec in enumerate(records):
        phases = {**phase_seconds(rec), "other": float(rec.get("other_s") or 0.0)}
        for name, seconds in phases.items():
            layers.setdefault(name, [0.0] * len(records))[i] = 1e3 * seconds
    layers = {name: ms for name, ms in layers.items() if any(ms)}
    colours = [PHASE_COLOURS.get(name, "tab:olive") for name in layers]
    ax.stackplot(steps, *layers.values(), labels=list(layers), colors=colours, alpha=0.85)
    ax.set(xlabel="optimizer step", ylabel="ms per step", title="Where each step's time goes")
    ax.legend(loc="upper right", fontsize="small")
    return _save(fig, path)


def plot_tasks(path: Path, records: Sequence[dict[str, Any]]) -> Path:
    """Each task metric of tasks.jsonl (`task/metric`) over the steps, ± its standard error as error bars."""
    fig, ax = _figure()
    for key in task_metric_keys(records):
        steps, values = _series(records, key)
        errors = [float(rec.get(f"{key}_stderr") or 0.0) for rec in records if _finite(rec.get(key))]
        ax.errorbar(steps, values, yerr=errors, marker="o", markersize=4, capsize=3, label=key)
    ax.set(xlabel="optimizer step", ylabel="metric (lm-evaluation-harness)", title="Downstream tasks")
    ax.legend(fontsize="small")
    return _save(fig, path)


def task_metric_keys(records: Sequence[dict[str, Any]]) -> list[str]:
    """The `task/metric` keys of task records, standard errors left out, in first-seen order."""
    keys = [key for rec in records for key in rec if "/" in key and "_stderr" not in key]
    return list(dict.fromkeys(keys))


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def _figure(rows: int = 1) -> tuple[Any, Any]:
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # imported here: matplotlib is slow to import
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8, 4.5 if rows == 1 else 6), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(rows, 1, sharex=True, squeeze=False)[:, 0]
    for ax in axes:
        ax.grid(alpha=0.3)
    return fig, axes[0] if rows == 1 else tuple(axes)


def _series(records: Sequence[dict[str, Any]], key: str) -> tuple[list[float], list[float]]:
    """Steps and values where the value is a finite number (a null loss or MFU is left out, not plotted as 0)."""
    pairs = [(rec["step"], rec.get(key)) for rec in records]
    kept = [(s, float(v)) for s, v in pairs if isinstance(v, (int, float)) and math.isfinite(v)]
    return [s for s, _ in kept], [v for _, v in kept]


def _save(fig: Any, path: Path) -> Path:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    atomic_write_bytes(path, buffer.getvalue())
    return path
