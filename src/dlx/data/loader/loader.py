"""`TokenLoader`: fixed-length token windows of a prepared dataset, batched per data-parallel rank.

Batches are built off the training thread by worker processes (`num_workers ≥ 1`) that hand them over through shared
memory, or in-process (`num_workers=0`, for tests and debugging). Both give the same batches in the same order.
See `windows` (packing), `order` (permutation, ranks, tail), `plan` (what a feed builds: one split here, a
`data.mix` mixture in `dlx.data.mixture`), `channel` and `pool` (workers), `state` (resume).
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch

from dlx.data.loader.dataset import open_split
from dlx.data.loader.order import Cursor, EpochWindows, Order, advance, schedule, settle
from dlx.data.loader.plan import open_feed
from dlx.data.loader.pool import WorkerPool
from dlx.data.loader.state import make_state, read_state
from dlx.data.loader.sync import SyncFeed
from dlx.data.loader.transfer import make_transfer
from dlx.data.loader.windows import TokenWindows, count_windows
from dlx.errors import UserError
from dlx.faults import pause_point

SPLITS = ("train", "val")


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
        verify: bool = False,
    ):
        """`num_workers`: worker processes (0 = build batches in the calling thread). `prefetch`: batches each worker
        keeps ready in shared memory. `verify`: check every shard's SHA-256 first (reads the whole split once)."""
        _check_arguments(split, seq_len, micro_batch_size, seed, rank, world_size, num_workers, prefetch)
        self.folder, self.split, self.seq_len, self.loop = Path(folder), split, seq_len, loop
        self.num_workers, self.prefetch = num_workers, prefetch
        self._manifest, self._spec = open_split(folder, split, verify)
        n_windows = count_windows(self._spec.n_tokens, seq_len)
        self._order = Order(n_windows, int(micro_batch_size), int(world_size), int(rank), int(seed), bool(shuffle))
        if self._order.batches_per_epoch == 0:
            raise UserError(
                f"dataset {folder} has {self._spec.n_tokens:,} {split!r} tokens, fewer than one batch needs "
                f"(world_size {world_size} × micro_batch_size {micro_batch_size} × seq_len {seq_len} + 1 = "
                f"{self._order.step_windows * seq_len + 1:,}); prepare more data or use smaller batches"
            )
        self._device = torch.device(device)
        self._transfer = make_transfer(self._device, (2, micro_batch_size, seq_len))
        self._cursor = Cursor(0, 0)
        self._epoch = 0
        self._feed: WorkerPool | SyncFeed | None = None
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
        return self._feed.pids if isinstance(self._feed, WorkerPool) else []

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
            host = self._feed.next_batch()
            if int(host.max()) >= self._manifest.vocab_size:  # microseconds; a damaged shard must not reach the model
                raise UserError(self._describe_bad_token(cursor))
            inputs, targets = self._transfer(host)
        except BaseException:
            self._stop()  # the position is unchanged: the next call restarts cleanly from it
            raise
        self._cursor = advance(self._order, cursor)
        self._epoch = cursor.epoch
        return inputs, targets

    def _describe_bad_token(self, cursor: Cursor) -> str:
        """Which shard holds a token id outside the vocabulary, and where (the windows re-read in this process)."""
        windows = TokenWindows(self._spec, self.seq_len)
        for window_id in EpochWindows(self._order)(cursor).tolist():
            tokens = windows.window(window_id)
            bad = np.flatnonzero(tokens >= self._manifest.vocab_size)
            if len(bad):
                shard, offset = windows.locate(window_id * self.seq_len + int(bad[0]))
                return (
                    f"dataset {self.folder}: shard {shard} holds token id {int(tokens[bad[0]])} at token {offset:,}, "
                    f"outside the tokenizer's {self._manifest.vocab_size:,} ids: the shard is damaged or was written "
                    f"by another tokenizer; check with `dlx data verify {self.folder}` and run `dlx prepare` again"
                )
        return f"dataset {self.folder}: a batch holds a token id outside the vocabulary; run `dlx data verify`"

    def _start(self) -> None:
        start = settle(self._order, self._cursor)
        self._schedule = schedule(self._order, start, self.loop)
        spec = {
            "order": self._order.to_json(),
            "split": self._spec.to_json(),
            "seq_len": self.seq_len,
            "micro_batch_size": self._order.micro_batch_size,
            "start": asdict(start),
            "loop": self.loop,
        }
        self._feed = open_feed(spec, self.num_workers, self.prefetch)

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
