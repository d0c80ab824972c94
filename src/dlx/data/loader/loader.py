"""`TokenLoader`: fixed-length token windows of a prepared dataset, batched per data-parallel rank.

Batches are built off the training thread by worker processes (`num_workers ≥ 1`) that hand them over through shared
memory, or in the calling thread (`num_workers=0`, for evaluation, tests and debugging). Both give the same batches in
the same order. See `windows` (packing), `order` (permutation, ranks, tail, resumable state) and `feed` (workers,
checks of what is read).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from dlx.data.loader.base import FeedLoader
from dlx.data.loader.cache import ShardCache, claim_cache_folder
from dlx.data.loader.feed import ReaderJob
from dlx.data.loader.order import Cursor, Order, advance, make_state, read_state, schedule, settle
from dlx.data.loader.plan import CachedPlan, SplitPlan
from dlx.data.loader.shard_blocks import block_size, shard_window_bounds
from dlx.data.loader.windows import SplitSpec, count_windows
from dlx.data.remote import remote_origin
from dlx.data.shards import SPLITS, Manifest, open_shard, read_manifest
from dlx.data.source import LoaderSettings
from dlx.errors import UserError
from dlx.faults import pause_point


class TokenLoader(FeedLoader):
    """Iterate `(inputs, targets)`: int64 tensors (micro_batch_size, seq_len) on the device, targets shifted by one.

    `loop=True` runs epoch after epoch forever, each in a new order drawn from (seed, epoch); `loop=False` runs to the
    end of the current epoch and stops (a later iteration runs the next epoch). Iterating resumes where the last batch
    left off: `next(loader)` and `for ... in loader` share one position. Not thread-safe; use it from one thread.

    Windows are packed across documents; no boundary tensor is returned because every document ends with eos_id:
    `document_positions(inputs, loader.eos_id)` derives per-document positions when a trainer wants them. The tail
    (the last n_windows mod (world_size × micro_batch_size) windows of each epoch's order) is skipped; see `order`.
    """

    def __init__(
        self, folder: str | Path, settings: LoaderSettings = LoaderSettings(), split: str = "train", loop: bool = True
    ):
        """`settings.verify`: check each shard's SHA-256 against the manifest the first time it is mapped (in the
        workers' background, or on first touch with num_workers=0); a mismatch raises UserError."""
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
        self.folder, self.split, self.loop = Path(folder), split, loop
        manifest, spec, url = open_any_split(folder, split, settings)
        s = settings  # short: the message below names five of its fields
        n_windows = count_windows(spec.n_tokens, s.seq_len)
        blocks, bounds = shard_order(spec, s, n_windows, s.cache_bytes) if url is not None else (0, ())
        self._order = Order(
            n_windows, int(s.micro_batch_size), int(s.world_size), int(s.rank), int(s.seed), s.shuffle, blocks, bounds
        )
        if self._order.batches_per_epoch == 0:
            raise UserError(
                f"dataset {folder} has {spec.n_tokens:,} {split!r} tokens, fewer than one batch needs "
                f"(world_size {s.world_size} × micro_batch_size {s.micro_batch_size} × seq_len {s.seq_len} + 1 = "
                f"{self._order.step_windows * s.seq_len + 1:,}); prepare more data or use smaller batches"
            )
        checksums = shard_checksums(manifest, spec, split) if s.verify and url is None else ()
        self.cache = None  # in object storage the cache verifies every shard it downloads, before any worker reads it
        if url is not None:
            self.cache, spec = split_cache(url, manifest, spec, split, s, s.cache_bytes)
        caches = (self.cache,) if self.cache is not None else ()
        plan = SplitPlan(spec, self._order, s.seq_len)
        plan = CachedPlan(plan, list(caches), pinned_batches(s)) if caches else plan
        super().__init__(manifest, ReaderJob(plan, manifest.vocab_size, checksums), s, caches)
        self._cursor = Cursor(0, 0)
        self._epoch = 0
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
    def order(self) -> str:
        """The window order as the loader state records it: shuffled, sequential or shard-blocks-K."""
        return self._order.name

    @property
    def batches_per_epoch(self) -> int:
        """Micro-batches per rank per epoch."""
        return self._order.batches_per_epoch

    def __next__(self) -> tuple[torch.Tensor, torch.Tensor]:
        pause_point(f"{self.split}_batch")  # test-only, off by default: see dlx.faults
        self.warm()
        cursor = next(self._schedule, None)
        if cursor is None:  # loop=False: this pass is over; the next iteration starts the next epoch
            self._stop()
            raise StopIteration
        batch = self._read()
        self._cursor = advance(self._order, cursor)
        self._epoch = cursor.epoch
        return batch

    def warm(self) -> None:
        """Start the feed at the current position (its workers fill batches ahead) without taking a batch."""
        if self._schedule is None:
            start = settle(self._order, self._cursor)
            self._schedule = schedule(self._order, start, self.loop)
            self._open(start, self.loop)

    def _stop(self, at_once: bool = False) -> None:
        self._schedule = None
        super()._stop(at_once)

    def state_dict(self) -> dict:
        """Where the next batch comes from; JSON-ready, identical on every rank."""
        return make_state(self._order, self._cursor, self.split, self.seq_len)

    def load_state_dict(self, state: dict, steps_done: int | None = None) -> None:
        """Continue from a saved state, also with another world size (ranks re-split what is left of the epoch)."""
        cursor = read_state(state, self._order, self.split, self.seq_len)
        self._stop()
        self._cursor = settle(self._order, cursor)
        self._epoch = self._cursor.epoch


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


def open_any_split(folder: str | Path, split: str, settings: LoaderSettings) -> tuple[Manifest, SplitSpec, str | None]:
    """`open_split` of a local dataset, or `open_remote_split` of a mirror (`dlx.data.remote`) with its URL (None for
    a local dataset)."""
    url = remote_origin(folder)
    if url is None:
        return (*open_split(folder, split), None)
    return (*open_remote_split(folder, split, settings), url)


def shard_order(spec: SplitSpec, settings: LoaderSettings, n_windows: int, cache_bytes: int) -> tuple[int, tuple]:
    """(block_shards, shard_bounds) of `dlx.data.loader.order.Order` for a split in object storage read through a
    cache of `cache_bytes`: shard blocks when it is shuffled and larger than the cache, else (0, ()) (windows)."""
    if not settings.shuffle or cache_bytes <= 0:
        return 0, ()
    blocks = block_size([t * spec_itemsize(spec) for _, t in spec.shards], cache_bytes)
    return blocks, shard_window_bounds([t for _, t in spec.shards], settings.seq_len, n_windows) if blocks else ()


def split_cache(
    url: str, manifest: Manifest, spec: SplitSpec, split: str, settings: LoaderSettings, cache_bytes: int
) -> tuple[ShardCache, SplitSpec]:
    """The cache that fetches the split's shards from `url`, holding at most `cache_bytes` (0: no bound), in a
    folder of its own next to `spec.folder` (`claim_cache_folder`), and the split's spec in that folder."""
    folder = claim_cache_folder(Path(spec.folder))
    cache = ShardCache(
        url,
        folder,
        manifest.split_shards(split),
        spec_itemsize(spec),
        cache_bytes or 1 << 62,
        settings.cache_policy,
        settings.cache_downloads,
    )
    return cache, replace(spec, folder=str(folder))


def pinned_batches(settings: LoaderSettings) -> int:
    """Batches in flight to the workers, whose shards a cache must keep."""
    return max(1, settings.num_workers * settings.prefetch)


def open_remote_split(folder: str | Path, split: str, settings: LoaderSettings) -> tuple[Manifest, SplitSpec]:
    """The manifest of a mirrored dataset (`dlx.data.remote`) and the split's shards, to be read from a cache folder
    of this rank's (`split_cache` claims it: this folder, or the next free one beside it)."""
    manifest = read_manifest(folder)
    shards = manifest.split_shards(split)
    if not shards or manifest.split_tokens(split) == 0:
        raise UserError(f"dataset {remote_origin(folder)} has no {split!r} tokens; run `dlx prepare` to fill it")
    base = Path(folder).resolve() / f"shards-{split}-rank{settings.rank}"
    return manifest, SplitSpec(str(base), manifest.dtype, tuple((s.name, s.tokens) for s in shards), volatile=True)


def spec_itemsize(spec: SplitSpec) -> int:
    return np.dtype(spec.dtype).itemsize


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
