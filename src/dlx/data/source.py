"""What every batch source has (`BatchSource`), the settings every one is built from (`LoaderSettings`), and a named
prepared dataset it reads (`Source`).

Three kinds implement it: one prepared dataset (`dlx.data.loader.TokenLoader`), several by weight
(`dlx.data.mixture.MixtureLoader`, data.mix) and generated tokens (`dlx.data.synthetic.SyntheticLoader`); a staged
run's `dlx.data.stages.StagedLoader` reads one of them per stage. The trainer
reads batches, sizes, special ids, position and per-source figures through this protocol only.

A single dataset is not read as a mixture of one: the mixture's window order (its own permutation seeds, no epoch
tail) and its checkpoint state differ from the single dataset's, and runs resume from checkpoints of both kinds.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np

from dlx.errors import UserError

if TYPE_CHECKING:
    import torch


class DamagedState(UserError):
    """A saved loader position that no loader writes (missing or out-of-range fields): the checkpoint holding it is
    damaged, and a resume falls back to the previous one. (A position saved for other data is a plain UserError.)"""


@dataclass(frozen=True)
class Source:
    """A prepared dataset the run reads: `data.path` (weight 1), or one of `data.mix`."""

    name: str
    """How metrics, eval records and the report call it: the folder name (a URL's last part), or the path as written
    when two names collide."""
    path: Path
    """The folder read: as written in the recipe, or for a dataset in object storage its local mirror
    (`dlx.data.remote`: manifest and tokenizer, the shards fetched by the loader's cache)."""
    weight: float
    url: str | None = None
    """The dataset's URL in object storage (s3://, gs://, hf://); None for a local folder."""

    @property
    def key(self) -> str:
        """What identifies the dataset: its URL, or its resolved folder."""
        return self.url if self.url is not None else str(Path(self.path).resolve())


@dataclass(frozen=True)
class LoaderSettings:
    """How batches are cut and read; validated on construction (ValueError naming the field)."""

    seq_len: int = 256
    """Tokens per sequence; a window is seq_len + 1 tokens (targets shifted by one)."""
    micro_batch_size: int = 8
    """Sequences per batch of one rank."""
    seed: int = 0
    """Seeds the window order (and synthetic tokens)."""
    rank: int = 0
    """This data-parallel rank, 0 ≤ rank < world_size."""
    world_size: int = 1
    """Data-parallel ranks reading together; each step, rank r takes the r-th block of micro_batch_size windows."""
    num_workers: int = 1
    """Worker processes building batches (0: in the calling thread)."""
    prefetch: int = 4
    """Batches each worker keeps ready in shared memory."""
    shuffle: bool = True
    """Visit the windows in a seeded random order (False: in file order, as evaluation does)."""
    device: Any = "cpu"
    """Where the batches are delivered (str or torch.device)."""
    verify: bool = True
    """Check each shard's SHA-256 against its manifest the first time it is read."""
    cache_bytes: int = 0
    """Bytes of shards a dataset in object storage may keep in its local cache, per split and rank (0: no bound)."""
    cache_policy: str = "belady"
    """Which cached shard makes room: `belady` (needed furthest ahead) or `lru` (benchmarks compare them)."""
    cache_downloads: int = 4
    """Shards of a dataset in object storage downloaded at once ahead of the reads (their round trips overlap)."""

    def __post_init__(self) -> None:
        for name, minimum in (
            ("seq_len", 1),
            ("micro_batch_size", 1),
            ("seed", 0),
            ("world_size", 1),
            ("num_workers", 0),
            ("prefetch", 1),
            ("cache_downloads", 1),
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
                raise ValueError(f"{name} must be an integer ≥ {minimum}, got {value!r}")
        if not isinstance(self.rank, (int, np.integer)) or not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank must be in [0, world_size={self.world_size}), got {self.rank!r}")

    @property
    def batch_shape(self) -> tuple[int, int, int]:
        """(2, micro_batch_size, seq_len): inputs and targets of one batch."""
        return 2, int(self.micro_batch_size), int(self.seq_len)


@runtime_checkable
class BatchSource(Protocol):
    """Iterate `(inputs, targets)`, int64 (micro_batch_size, seq_len) on the device, targets shifted by one."""

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]: ...

    def __next__(self) -> tuple[torch.Tensor, torch.Tensor]: ...

    @property
    def epoch(self) -> int:
        """The epoch the latest batch came from (what `train.epochs` counts)."""
        ...

    @property
    def batches_per_epoch(self) -> int | None:
        """Micro-batches per rank per epoch; None when unbounded (synthetic)."""
        ...

    @property
    def windows_per_epoch(self) -> int | None:
        """Windows read per epoch by all ranks together; None when unbounded (synthetic)."""
        ...

    @property
    def vocab_size(self) -> int: ...

    @property
    def eos_id(self) -> int: ...

    @property
    def bos_id(self) -> int | None: ...

    @property
    def worker_pids(self) -> list[int]:
        """Process ids of the running workers (empty when there are none)."""
        ...

    def warm(self) -> None:
        """Start reading ahead from the current position (worker processes) without taking a batch."""
        ...

    def source_tokens(self) -> dict[str, int]:
        """Training tokens each named source has supplied, all ranks together; empty unless there are several
        sources to tell apart (data.mix)."""
        ...

    def new_source_epochs(self) -> list[tuple[str, int]]:
        """(name, epoch) of each named source that started a new epoch since the previous call."""
        ...

    def state_dict(self) -> dict:
        """Where the next batch comes from: JSON-ready, identical on every rank."""
        ...

    def load_state_dict(self, state: dict, steps_done: int | None = None) -> None:
        """Continue from `state_dict()`'s position; UserError when it belongs to other data. `steps_done`: the
        optimizer steps the state was saved after (a staged source, `dlx.data.stages`, switches stages by step)."""
        ...

    def verify_read_shards(self) -> list[str]:
        """Block until every shard a consumed batch was read from is verified against its manifest (UserError naming
        the first that is not); returns the shards hashed now."""
        ...

    def close(self, at_once: bool = False) -> None:
        """Stop any workers (idempotent); `at_once`: kill them, their batches are not wanted (a finished stage)."""
        ...
