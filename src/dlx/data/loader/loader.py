"""`TokenLoader`: fixed-length token windows of a prepared dataset, batched per data-parallel rank.

Batches are built off the training thread by worker processes (`num_workers ≥ 1`) that hand them over through shared
memory, or in the calling thread (`num_workers=0`, for evaluation, tests and debugging). Both give the same batches in
the same order. See `windows` (packing), `order` (permutation, ranks, tail, resumable state) and `feed` (workers,
checks of what is read).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from dlx.data.loader.feed import InProcessFeed, ReaderJob, ReadShards, WorkerFeed, open_feed
from dlx.data.loader.order import Cursor, Order, advance, make_state, read_state, schedule, settle
from dlx.data.loader.plan import SplitPlan
from dlx.data.loader.windows import SplitSpec, count_windows
from dlx.data.shards import SPLITS, Manifest, open_shard, read_manifest
from dlx.device import HostToDevice
from dlx.errors import UserError
from dlx.faults import pause_point


class TokenLoader:
    """Iterate `(inputs, targets)`: int64 tensors (micro_batch_size, seq_len) on `device`, targets shifted by one.

    `loop=True` runs epoch after epoch forever, each in a new order drawn from (seed, epoch); `loop=False` runs to the
    end of the current epoch and stops (a later iteration runs the next epoch). Iterating resumes where the last batch
    left off: `next(loader)` and `for ... in loader` share one position. Not thread-safe; use it from one thread.

    Windows are packed across documents; no boundary tensor is returned because every document ends with eos_id:
    `document_positions(inputs, loader.eos_id)` derives per-document positions when a trainer wants them. The tail
    (the last n_windows mod (world_size × micro_batch_size) windows of each epoch's order) is skipped; see `order`.
    """

    def __init__(
        self,
        folder: str | Path,
        split: str = "train",
        seq_len: int = 256,
        micro_batch_size: int = 8,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
        num_workers: int = 1,
        prefetch: int = 4,
        shuffle: bool = True,
        loop: bool = True,
        device: str | torch.device = "cpu",
        verify: bool = True,
    ):
        """`num_workers`: worker processes (0 = build batches in the calling thread). `prefetch`: batches each worker
        keeps ready in shared memory. `verify`: check each shard's SHA-256 against the manifest the first time it
        is mapped (in the workers' background, or on first touch with num_workers=0); a mismatch raises UserError."""
        _check_arguments(split, seq_len, micro_batch_size, seed, rank, world_size, num_workers, prefetch)
        self.folder, self.split, self.seq_len, self.loop = Path(folder), split, seq_len, loop
        self.num_workers, self.prefetch = num_workers, prefetch
        self._manifest, spec = open_split(folder, split)
        n_windows = count_windows(spec.n_tokens, seq_len)
        self._order = Order(n_windows, int(micro_batch_size), int(world_size), int(rank), int(seed), bool(shuffle))
        if self._order.batches_per_epoch == 0:
            raise UserError(
                f"dataset {folder} has {spec.n_tokens:,} {split!r} tokens, fewer than one batch needs "
                f"(world_size {world_size} × micro_batch_size {micro_batch_size} × seq_len {seq_len} + 1 = "
                f"{self._order.step_windows * seq_len + 1:,}); prepare more data or use smaller batches"
            )
        checksums = shard_checksums(self._manifest, spec, split) if verify else ()
        self._job = ReaderJob(SplitPlan(spec, self._order, seq_len), self._manifest.vocab_size, checksums)
        self._transfer = HostToDevice(torch.device(device), (2, micro_batch_size, seq_len))
        self._cursor = Cursor(0, 0)
        self._epoch = 0
        self._feed: InProcessFeed | WorkerFeed | None = None
        self._read = ReadShards()  # what consumed batches read, until verified
        self._schedule = None

    @property
    def epoch(self) -> int:
        """Epoch of the batch most recently returned (before the first: the epoch the first batch comes from)."""
        return self._epoch

    @property
    def windows_per_epoch(self) -> int:
        """Windows of seq_len + 1 tokens read per epoch by all ranks together, after the tail is skipped."""
        return self._order.batches_per_epoch * self._order.step_windows

    @property
    def batches_per_epoch(self) -> int:
        """Micro-batches per rank per epoch."""
        return self._order.batches_per_epoch

    @property
    def vocab_size(self) -> int:
        return self._manifest.vocab_size

    @property
    def eos_id(self) -> int:
        return self._manifest.eos_id

    @property
    def bos_id(self) -> int | None:
        return self._manifest.bos_id

    @property
    def worker_pids(self) -> list[int]:
        """Process ids of the running workers (empty before the first batch, after close, or with num_workers=0)."""
        return self._feed.pids if self._feed is not None else []

    def __iter__(self) -> TokenLoader:
        return self

    def __next__(self) -> tuple[torch.Tensor, torch.Tensor]:
        pause_point(f"{self.split}_batch")  # test-only, off by default: see dlx.faults
        if self._schedule is None:
            self._start()
        cursor = next(self._schedule, None)
        if cursor is None:  # loop=False: this pass is over; the next iteration starts the next epoch
            self._stop()
            raise StopIteration
        try:
            batch = self._transfer(torch.from_numpy(self._feed.next_batch()))  # (2, B, seq_len)
        except BaseException:
            self._stop()  # the position is unchanged: the next call restarts cleanly from it
            raise
        self._cursor = advance(self._order, cursor)
        self._epoch = cursor.epoch
        return batch[0], batch[1]

    def _start(self) -> None:
        start = settle(self._order, self._cursor)
        self._schedule = schedule(self._order, start, self.loop)
        self._feed = open_feed(self._job, start, self.loop, self.num_workers, self.prefetch, self._read)

    def _stop(self) -> None:
        feed, self._feed, self._schedule = self._feed, None, None
        if feed is not None:
            feed.close()

    def state_dict(self) -> dict:
        """Where the next batch comes from; JSON-ready, identical on every rank."""
        return make_state(self._order, self._cursor, self.split, self.seq_len)

    def load_state_dict(self, state: dict) -> None:
        """Continue from a saved state, also with another world size (ranks re-split what is left of the epoch)."""
        cursor = read_state(state, self._order, self.split, self.seq_len)
        self._stop()
        self._cursor = settle(self._order, cursor)
        self._epoch = self._cursor.epoch

    def verify_read_shards(self) -> list[str]:
        """Block until every shard a consumed batch came from is verified against the manifest (UserError naming the
        first that is not); returns the shards that had to be hashed now (see `dlx.data.loader.feed.ReadShards`)."""
        return self._read.verify()

    def close(self) -> None:
        """Stop the workers (idempotent). Also runs when the loader is garbage collected and at interpreter exit."""
        self._stop()

    def __enter__(self) -> TokenLoader:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _check_arguments(
    split: str,
    seq_len: int,
    micro_batch_size: int,
    seed: int,
    rank: int,
    world_size: int,
    num_workers: int,
    prefetch: int,
) -> None:
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    for name, value, minimum in (
        ("seq_len", seq_len, 1),
        ("micro_batch_size", micro_batch_size, 1),
        ("seed", seed, 0),
        ("world_size", world_size, 1),
        ("num_workers", num_workers, 0),
        ("prefetch", prefetch, 1),
    ):
        if not isinstance(value, (int, np.integer)) or value < minimum:
            raise ValueError(f"{name} must be an integer ≥ {minimum}, got {value!r}")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, world_size={world_size}), got {rank!r}")


def open_split(folder: str | Path, split: str) -> tuple[Manifest, SplitSpec]:
    """The manifest and the split's shards; each shard must exist with the size the manifest gives (its checksum is
    the reader's to verify, off the training thread)."""
    manifest = read_manifest(folder)  # UserError when the folder or its manifest is missing or damaged
    shards = manifest.split_shards(split)
    if not shards or manifest.split_tokens(split) == 0:
        raise UserError(f"dataset {folder} has no {split!r} tokens; run `dlx prepare` to fill it")
    for shard in shards:
        open_shard(folder, shard, manifest.dtype)  # UserError on a missing or truncated file
    spec = SplitSpec(str(Path(folder).resolve()), manifest.dtype, tuple((s.name, s.tokens) for s in shards))
    return manifest, spec


def shard_checksums(manifest: Manifest, spec: SplitSpec, split: str) -> tuple[tuple[str, str], ...]:
    """(path, SHA-256 in the manifest) of each shard of the split, for the readers to verify."""
    return tuple((str(Path(spec.folder) / s.name), s.sha256) for s in manifest.split_shards(split))


def document_positions(inputs: torch.Tensor, eos_id: int) -> torch.Tensor:
    """Position of each token within its document, restarting at 0 after every eos_id; shape and device of `inputs`.

    A window starts mid-document in general; its first token gets position 0 all the same.
    """
    _, seq_len = inputs.shape  # (B, T)
    index = torch.arange(seq_len, device=inputs.device).expand_as(inputs)
    starts = torch.zeros_like(inputs, dtype=torch.bool)
    starts[:, 0] = True
    starts[:, 1:] = inputs[:, :-1] == eos_id
    last_start = torch.where(starts, index, torch.zeros_like(index)).cummax(dim=1).values
    return index - last_start


def document_ids(inputs: torch.Tensor, eos_id: int) -> torch.Tensor:
    """Which document of its window each token belongs to, (B, T) int64 from 0: a new one begins after every eos_id
    (the eos_id itself belongs to the document it ends). For `Transformer(..., document_ids=...)`."""
    starts = torch.zeros_like(inputs, dtype=torch.int64)
    starts[:, 1:] = inputs[:, :-1] == eos_id
    return starts.cumsum(dim=1)
