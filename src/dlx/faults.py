"""A test-only fault point, off unless `DLX_FAULT_PAUSE` is set: the fault-matrix tests (tests/test_faults*.py) use it
to send a signal at an exact moment instead of guessing with sleeps.

    DLX_FAULT_PAUSE=POINT[@N]   the N-th time (default: the first) the process reaches POINT, it writes the marker
                                file $DLX_FAULT_DIR/POINT (holding its pid) and waits while that file exists (≤ 120 s);
                                under torchrun with more than one rank, every rank pauses, each on its own marker
                                POINT.rankR, so that a test can hold all ranks at the same moment and signal one
    POINT                       checkpoint_save (weights written, trainer_state.json not yet), train_batch and
                                val_batch (the trainer asks the loader for a training / evaluation batch),
                                shard_verify (a loader worker's background thread, before it hashes its first shard),
                                prepare_final (`dlx prepare` has encoded every unit, before its last commit)

The test sees the marker, sends its signal, then deletes the marker to let the process go on (or die).

    DLX_FAULT_SPIKE=STEP[,STEP...][xFACTOR[*]]   the loss the trainer judges at these optimizer steps is multiplied
                                by FACTOR (default 10), the first time the process reaches each (a rolled-back run
                                trains the step again, cleanly), or with `*` every time (a run that keeps spiking): a
                                planted loss spike for train.spike_policy's tests

    DLX_FAULT_RAISE=POINT       the process raises a RuntimeError (not a UserError: an unexpected failure, as a CUDA
                                error would be) each time it reaches POINT
    POINT                       attention_choice (train.attention's choice, on rank 0 under torchrun, before it
                                measures anything)
"""

from __future__ import annotations

import os
import time
from pathlib import Path

PAUSE_ENV = "DLX_FAULT_PAUSE"
SPIKE_ENV = "DLX_FAULT_SPIKE"
RAISE_ENV = "DLX_FAULT_RAISE"
DIR_ENV = "DLX_FAULT_DIR"
MAX_PAUSE_S = 120.0
_arrivals: dict[str, int] = {}


def marker_name(point: str) -> str:
    """POINT in one process, POINT.rankR for rank R of a torchrun group of several."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        return f"{point}.rank{os.environ.get('RANK', '0')}"
    return point


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
    marker = Path(os.environ.get(DIR_ENV, ".")) / marker_name(point)
    marker.write_text(str(os.getpid()))
    deadline = time.monotonic() + MAX_PAUSE_S
    while marker.exists() and time.monotonic() < deadline:
        time.sleep(0.01)


def planted_spike(step: int) -> float:
    """The factor `DLX_FAULT_SPIKE` plants on optimizer step `step`'s loss: 1.0 unless it names that step."""
    spec = os.environ.get(SPIKE_ENV)
    if not spec:
        return 1.0
    steps, _, factor = spec.partition("x")
    point, every_time = f"spike{step}", factor.endswith("*")  # `*`: at every arrival, not only the first
    if str(step) not in steps.split(",") or (point in _arrivals and not every_time):
        return 1.0
    factor = factor.removesuffix("*")
    _arrivals[point] = 1
    return float(factor or 10)


def raise_point(point: str) -> None:
    """Raise here if `DLX_FAULT_RAISE` names this point; otherwise return at once."""
    if os.environ.get(RAISE_ENV) == point:
        raise RuntimeError(f"injected failure at {point}")
