"""What the user sees every step: the bar's smoothed loss moves every step; the loss plot has points and a line."""

from __future__ import annotations

import math

import pytest

from dlx.metrics import plots
from dlx.metrics.meter import Ema
from dlx.train.build.console import LOSS_SMOOTHING, RunConsole


def test_the_bar_moves_and_its_loss_follows_every_step() -> None:
    console = RunConsole(total_steps=4, start_step=0, progress=False)
    console.advance(1, {"loss": 4.0, "tokens_per_s": 1000.0, "mfu": 0.25})
    assert console.stats() == "loss ~4.0000 (smoothed) · 1,000 tok/s · MFU 25.0%"
    console.advance(2, None, 2.0)  # a step between two log records
    # Debiased EMA of (4, 2) with weight 0.9: (0.9·0.1·4 + 0.1·2) / (1 − 0.81) = 0.56 / 0.19
    assert console.stats().startswith(f"loss ~{0.56 / 0.19:.4f} (smoothed) · 1,000 tok/s")
    console.advance(3, None, math.nan)  # a skipped NaN step leaves the average as it was
    assert console.stats().startswith(f"loss ~{0.56 / 0.19:.4f}")
    assert console.progress.tasks[0].completed == 3 and LOSS_SMOOTHING == 0.9


def test_ema_is_debiased_and_rejects_bad_weights() -> None:
    ema = Ema(0.6)
    assert ema.value is None and ema.update(3.0) == pytest.approx(3.0, rel=1e-15)
    assert ema.update(1.0) == pytest.approx((0.6 * 0.4 * 3.0 + 0.4 * 1.0) / (1 - 0.36))
    with pytest.raises(ValueError, match="weight"):
        Ema(1.0)


def test_the_loss_plot_draws_raw_points_and_a_smoothed_line(tmp_path, monkeypatch) -> None:
    figures = []
    monkeypatch.setattr(plots, "_save", lambda fig, path: figures.append(fig) or path)
    records = [{"step": s, "loss": 5.0 / s} for s in range(1, 6)] + [{"step": 6, "loss": None}]
    plots.plot_loss(tmp_path / "loss.png", records, [{"step": 5, "loss": 1.5}])
    lines = {line.get_label(): line for line in figures[0].axes[0].lines}
    raw, line = lines["train loss (logged steps)"], lines["train loss, EMA 0.6"]
    assert (
        raw.get_linestyle() == "None"
        and raw.get_marker() == "o"
        and list(raw.get_ydata()) == [5.0 / s for s in range(1, 6)]
    )
    assert list(line.get_ydata()) == plots.smoothed([5.0 / s for s in range(1, 6)]) and line.get_linestyle() == "-"
    assert list(lines["validation loss"].get_xdata()) == [5]
