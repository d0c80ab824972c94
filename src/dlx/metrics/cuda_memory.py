"""CUDA allocator history over the profiled steps (imported only on CUDA: these calls need the CUDA allocator).

`torch.cuda.memory._record_memory_history` keeps every allocation and free with its Python stack; at the end of the
profile three files are written from one snapshot:

    <prefix>.pickle          the snapshot itself: drag it onto pytorch.org/memory_viz
    <prefix>.html            the active-memory timeline (torch's trace_plot; the page loads its viewer script)
    <prefix>.folded          memory in use by stack, as folded stacks: `flamegraph.pl --countname bytes < it > it.svg`
                             or speedscope.app draw the flame graph
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import torch
from torch.cuda import _memory_viz

from dlx.atomic import atomic_write_bytes, atomic_write_text

MAX_ENTRIES = 100_000
"""Allocation events kept (the oldest are dropped): enough for a few steps of a large model."""


def start_recording() -> None:
    torch.cuda.memory._record_memory_history(max_entries=MAX_ENTRIES)


def write_snapshot(folder: Path, prefix: str) -> list[Path]:
    """Snapshot the allocator, stop recording, and write the three files; returns their paths."""
    snapshot = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    return write_snapshot_files(snapshot, folder, prefix)


def write_snapshot_files(snapshot: dict[str, Any], folder: Path, prefix: str) -> list[Path]:
    """The snapshot as pickle, timeline HTML and folded stacks (each written atomically)."""
    paths = [folder / f"{prefix}.pickle", folder / f"{prefix}.html", folder / f"{prefix}.folded"]
    atomic_write_bytes(paths[0], pickle.dumps(snapshot))
    atomic_write_text(paths[1], _memory_viz.trace_plot(snapshot))
    atomic_write_text(paths[2], _memory_viz.memory(snapshot, format_flamegraph=lambda folded: folded))
    return paths
