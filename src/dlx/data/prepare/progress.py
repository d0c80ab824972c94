"""The progress bar on stderr: files, MB/s of input, tokens/s and ETA; plus one-line notes above it."""

from __future__ import annotations

from rich.console import Console
from rich.progress import (
    BarColumn,
    Progress,
    ProgressColumn,
    Task,
    TaskProgressColumn,
    TextColumn,
    TimeRemainingColumn,
)
from rich.text import Text

from dlx.data.storage import shown


class _Rate(ProgressColumn):
    """MB/s of input (rich's recent-window speed) or tokens/s (since the start) for one task."""

    def __init__(self, what: str):
        super().__init__()
        self.what = what

    def render(self, task: Task) -> Text:
        if self.what == "mb":
            return Text(f"{(task.speed or 0) / 1e6:.1f} MB/s")
        elapsed = task.elapsed or 0
        rate = task.fields.get("tokens", 0) / elapsed if elapsed > 0 else 0
        return Text(f"{rate / 1e3:,.0f}k tok/s" if task.fields.get("show_tokens") else "")


class PrepareProgress:
    """One bar per phase (scan, encode); `enabled=False` keeps the notes but draws no bar."""

    def __init__(self, enabled: bool):
        self.console = Console(stderr=True, highlight=False)
        self.enabled = enabled
        self._progress: Progress | None = None
        self._task = None

    def start(
        self, label: str, total_bytes: int, total_files: int, show_tokens: bool, count_label: str = "files"
    ) -> None:
        self.stop()
        if not self.enabled:
            return
        self._progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(bar_width=20),
            TaskProgressColumn(),
            TextColumn("{task.fields[files]:,}/{task.fields[total_files]:,} " + count_label),
            _Rate("mb"),
            _Rate("tokens"),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            console=self.console,
            transient=True,  # the summary line stays; an error stays one line
        )
        self._progress.start()
        self._task = self._progress.add_task(
            label, total=max(total_bytes, 1), files=0, total_files=total_files, tokens=0, show_tokens=show_tokens
        )

    def advance(self, nbytes: int, files: int, tokens: int = 0) -> None:
        if self._progress is not None:
            task = self._progress.tasks[0]
            self._progress.update(
                self._task, advance=nbytes, files=task.fields["files"] + files, tokens=task.fields["tokens"] + tokens
            )

    def note(self, message: str) -> None:
        self.console.print(shown(message), soft_wrap=True, markup=False)

    def stop(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
