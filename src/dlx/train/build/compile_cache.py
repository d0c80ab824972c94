"""A compile cache per model and shape under the user's cache folder, so that a second run of the same recipe starts
warm: torch.compile's inductor and AOTAutograd caches (`TORCHINDUCTOR_CACHE_DIR`) live in
`$XDG_CACHE_HOME/dlx/compile/<key>` (`~/.cache/dlx/compile/<key>`), the key a hash of what the compiled graphs depend
on: torch's version, the model's arguments, the micro-batch shape, precision, activation checkpointing, attention,
document masking, float8, the parallel layout and the device type. A key's folder holding `dlx-compile.json` (written
by rank 0 once a run's first step has compiled) is warm: inductor's generated code and AOTAutograd's graphs are read
back instead of generated and compiled again; dynamo still traces the blocks. A `TORCHINDUCTOR_CACHE_DIR` the user
set is kept (and called the user's).

Entries are keyed inside by torch's own hashes of each graph, so a stale or foreign entry is a miss, never a wrong
kernel: the folder's key only decides what the header calls warm.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from dlx.atomic import atomic_write_bytes
from dlx.train.config import RunConfig

MARKER = "dlx-compile.json"
INDUCTOR_DIR = "TORCHINDUCTOR_CACHE_DIR"


def compile_cache_root() -> Path:
    """`$XDG_CACHE_HOME/dlx/compile`, else `~/.cache/dlx/compile`."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "dlx" / "compile"


def compile_key(config: RunConfig, micro_batch_size: int, precision: str, device: torch.device) -> dict[str, Any]:
    """What the compiled graphs depend on, as the cache's key is made from it."""
    train, parallel = config.train, config.parallel
    return {
        "torch": torch.__version__,
        "model": config.model.args.model_dump(mode="json"),
        "batch": [micro_batch_size, config.data.seq_len],
        "precision": precision,
        "activation_checkpointing": parallel.activation_checkpointing,
        "attention": train.attention,
        "document_mask": config.data.document_mask,
        "float8": train.float8_recipe if train.float8 else None,
        "parallel": [parallel.strategy, parallel.tp, parallel.cp],
        "device": device.type,
    }


@dataclass(frozen=True)
class CompileCache:
    folder: Path
    """Where inductor and AOTAutograd keep their caches for this run."""
    warm: bool
    """A run with the same key compiled its first step here before."""
    chosen_by_user: bool
    """TORCHINDUCTOR_CACHE_DIR was set before dlx started: that folder is used as it is."""
    written: dict[str, Any] | None
    """The marker of the run that made the folder warm."""

    def header(self, resumed_at: int) -> str:
        """The header line: cold or warm, where, and whether the run resumed (a resume compiles as a start does)."""
        resumed = f", resumed at step {resumed_at:,}" if resumed_at else ""
        if self.chosen_by_user:
            return f"compile: {INDUCTOR_DIR}={self.folder} (yours; dlx does not judge it warm or cold){resumed}"
        if self.warm and self.written is not None:
            when = self.written.get("written", "?")
            seconds = self.written.get("first_step_compile_s")
            took = f"; its first step compiled in {seconds:.1f} s" if isinstance(seconds, (int, float)) else ""
            return (
                f"compile: warm{resumed}, cache {self.folder} from a run of {when} (model, shapes and torch "
                f"{torch.__version__} match{took})"
            )
        return (
            f"compile: cold{resumed}, no cache yet for this model, shape and torch {torch.__version__}; "
            f"kept in {self.folder} for the next run that matches"
        )

    def mark_warm(self, first_step_compile_s: float) -> None:
        """Rank 0, after the first step compiled: later runs with this key start warm."""
        if self.chosen_by_user or self.warm:
            return
        marker = {
            "written": time.strftime("%Y-%m-%d %H:%M"),
            "torch": torch.__version__,
            "first_step_compile_s": round(first_step_compile_s, 3),
        }
        atomic_write_bytes(self.folder / MARKER, json.dumps(marker).encode())


def open_compile_cache(key: dict[str, Any]) -> CompileCache:
    """The key's folder, made and set as inductor's cache folder for this process (before anything compiles)."""
    user = users_folder()
    if user is not None:
        return CompileCache(user, False, True, None)
    digest = hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:16]
    folder = compile_cache_root() / digest
    folder.mkdir(parents=True, exist_ok=True)
    os.environ[INDUCTOR_DIR] = str(folder)
    written = read_marker(folder)
    return CompileCache(folder, written is not None, False, written)


def users_folder() -> Path | None:
    """TORCHINDUCTOR_CACHE_DIR when the user set it: not one of dlx's folders, nor the default inductor writes into
    the variable at its first compile."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    value = os.environ.get(INDUCTOR_DIR)
    if not value:
        return None
    path = Path(value).absolute()
    if path.is_relative_to(compile_cache_root().absolute()) or path == Path(default_cache_dir()).absolute():
        return None
    return path


def read_marker(folder: Path) -> dict[str, Any] | None:
    try:
        data = json.loads((folder / MARKER).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
