"""Turn SIGTERM and a first Ctrl-C into an orderly stop: finish the step, save a checkpoint, close the loader.

A scheduler (SLURM, Kubernetes) sends SIGTERM before it kills a job; dying mid-step would lose every step since the last
checkpoint. A second Ctrl-C raises KeyboardInterrupt at once, for a user who does not want to wait.

A process started with SIGINT ignored (a shell script's `dlx pretrain &`, `nohup`) keeps ignoring it, as every Unix
program does: the shell promised that Ctrl-C in the terminal does not reach it. SIGTERM still stops it in order.

Before `GracefulStop` is entered (imports, the recipe, the process group) nothing of the run is written yet:
`stop_outside_training` makes SIGTERM end the process there at once, with one line and exit status 143.
"""

from __future__ import annotations

import signal
import sys
import threading
from types import FrameType


class GracefulStop:
    """Context manager: while active, SIGTERM/SIGINT set `signal_name` instead of killing the process."""

    def __init__(self) -> None:
        self.signal_name: str | None = None
        self._previous: dict[int, object] = {}

    @property
    def requested(self) -> bool:
        return self.signal_name is not None

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if self.requested and signum == signal.SIGINT:
            raise KeyboardInterrupt
        if not self.requested:
            print(f"\n{name} received: stopping after this step and saving a checkpoint", file=sys.stderr, flush=True)
        self.signal_name = name

    def __enter__(self) -> GracefulStop:
        if threading.current_thread() is threading.main_thread():  # signal handlers can only be set there
            for signum in (signal.SIGTERM, signal.SIGINT):
                if signum == signal.SIGINT and signal.getsignal(signum) is signal.SIG_IGN:
                    continue  # started with Ctrl-C ignored: it stays so
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()


def stop_outside_training() -> None:
    """SIGTERM, until a `GracefulStop` takes over (and once it has ended): one line, then exit 128 + 15 = 143."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _exit_outside_training)


def _exit_outside_training(signum: int, frame: FrameType | None) -> None:
    name = signal.Signals(signum).name
    print(
        f"\n{name} received outside the training loop (start-up or the end): stopped; exit {128 + signum}",
        file=sys.stderr,
        flush=True,
    )
    raise SystemExit(128 + signum)
