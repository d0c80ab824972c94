"""What a run shows on the terminal: the header, one line per logged step, notes, and a rich progress bar.

The bar (loss, tokens/s, MFU, ETA) appears only on a terminal; piped output gets the plain lines alone. It refreshes
twice a second from rich's thread, which costs far below 1 % of a step.
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

    def print(self, text: str = "") -> None:
        if self.is_main:
            self.console.print(text, markup=False)

    def warn(self, text: str) -> None:
        """Something the user must act on or know about (a damaged checkpoint, a skipped batch): to stderr."""
        if self.is_main:
            print(text, file=sys.stderr, flush=True)

    def start(self) -> None:
        self.progress.start()

    def advance(self, step: int, record: dict[str, Any] | None) -> None:
        fields = {}
        if record is not None:
            mfu = record.get("mfu")
            mfu_text = f"MFU {100 * mfu:.1f}%" if mfu is not None else "MFU n/a"
            loss = record.get("loss")
            loss_text = f"{loss:.4f}" if loss is not None else "n/a"
            fields["stats"] = f"loss {loss_text} · {record['tokens_per_s']:,.0f} tok/s · {mfu_text}"
        self.progress.update(self.task, completed=step, **fields)

    def stop(self) -> None:
        self.progress.stop()
