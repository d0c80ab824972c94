"""A test-only fault point, off unless `DLX_FAULT_PAUSE` is set: the fault-matrix tests (tests/test_faults*.py) use it
to send a signal at an exact moment instead of guessing with sleeps.

    DLX_FAULT_PAUSE=POINT[@N]   the N-th time (default: the first) the process reaches POINT, it writes the marker
                                file $DLX_FAULT_DIR/POINT (holding its pid) and waits while that file exists (≤ 120 s)
    POINT                       checkpoint_save (weights written, trainer_state.json not yet), train_batch and
                                val_batch (the trainer asks the loader for a training / evaluation batch)

The test sees the marker, sends its signal, then deletes the marker to let the process go on (or die).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

PAUSE_ENV = "DLX_FAULT_PAUSE"
DIR_ENV = "DLX_FAULT_DIR"
POINTS = ("checkpoint_save", "train_batch", "val_batch")
MAX_PAUSE_S = 120.0
_arrivals: dict[str, int] = {}


def pause_point(point: str) -> None:
    """Wait here if `DLX_FAULT_PAUSE` names this point and arrival; otherwise return at once (one dict lookup)."""
    spec = os.environ.get(PAUSE_ENV)
    if not spec:
        return
    name, _, nth = spec.partition("@")
    if name != point:
        return
    _arrivals[point] = _arrivals.get(point, 0) + 1
    if _arrivals[point] != int(nth or 1):
        return
    marker = Path(os.environ.get(DIR_ENV, ".")) / point
    marker.write_text(str(os.getpid()))
    deadline = time.monotonic() + MAX_PAUSE_S
    while marker.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
