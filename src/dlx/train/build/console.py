"""What a run shows on the terminal: the header, one line per logged step, notes, and a rich progress bar.

The bar (smoothed loss, tokens/s, MFU, ETA) appears only on a terminal; piped output gets the plain lines alone. It
moves every step: the loss shown is an exponential moving average of every step's loss (weight LOSS_SMOOTHING,
debiased), while tokens/s and MFU come from the latest logged record. It refreshes twice a second from rich's thread,
which costs far below 1 % of a step.
"""

from __future__ import annotations

import sys
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from dlx.data.storage import shown
from dlx.metrics.meter import Ema

LOSS_SMOOTHING = 0.9
"""EMA weight of the bar's loss: each step's loss counts 10 %, so the figure follows about the last 10 steps."""


class RunConsole:
    def __init__(self, total_steps: int, start_step: int, progress: bool = True, is_main: bool = True):
        self.is_main = is_main
        self.console = Console(file=sys.stdout, highlight=False, soft_wrap=True)
        show_bar = progress and is_main and self.console.is_terminal
        self.progress = Progress(
            TextColumn("[bold]train"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            TextColumn("{task.fields[stats]}"),
            console=self.console,
            refresh_per_second=2,
            disable=not show_bar,
        )
        self.task = self.progress.add_task("train", total=total_steps, completed=start_step, stats="")
        self.loss = Ema(LOSS_SMOOTHING)
        self._throughput = ""
        """tokens/s and MFU of the latest logged record."""

    def print(self, text: str = "") -> None:
        """A line for the user (a bucket run's staging folder named by its URL: `storage.shown`)."""
        if self.is_main:
            self.console.print(shown(text), markup=False)

    def warn(self, text: str) -> None:
        """Something the user must act on or know about (a damaged checkpoint, a skipped batch): to stderr."""
        if self.is_main:
            print(shown(text), file=sys.stderr, flush=True)

    def start(self) -> None:
        self.progress.start()

    def advance(self, step: int, record: dict[str, Any] | None, loss: float | None = None) -> None:
        """Every step: the step's loss (or the logged record's, which holds it) into the average, and the bar on."""
        if record is not None:
            loss = record.get("loss")
            mfu = record.get("mfu")
            mfu_text = f"MFU {100 * mfu:.1f}%" if mfu is not None else "MFU n/a"
            self._throughput = f" · {record['tokens_per_s']:,.0f} tok/s · {mfu_text}"
        if loss is not None:
            self.loss.update(float(loss))
        self.progress.update(self.task, completed=step, stats=self.stats())

    def stats(self) -> str:
        """The bar's text: `loss ~2.3456 (smoothed) · 1,234 tok/s · MFU 12.3%`."""
        smoothed = self.loss.value
        loss_text = "loss n/a" if smoothed is None else f"loss ~{smoothed:.4f} (smoothed)"
        return loss_text + self._throughput

    def stop(self) -> None:
        self.progress.stop()
