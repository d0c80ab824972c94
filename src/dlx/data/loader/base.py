"""`FeedLoader`: what the loaders of prepared data share: a feed of a plan's batches (in this thread or in worker
processes, `feed`), their transfer to the device, the manifest's ids, the shard caches of data in object storage
(verified and closed with the loader), and closing."""

from __future__ import annotations

from typing import Any

import torch

from dlx.data.loader.cache import ShardCache
from dlx.data.loader.feed import InProcessFeed, ReaderJob, ReadShards, WorkerFeed, open_feed
from dlx.data.shards import Manifest
from dlx.data.source import LoaderSettings
from dlx.device import HostToDevice


class FeedLoader:
    """The feed, transfer and close of a `BatchSource` over prepared shards; a subclass decides where each pass starts
    (`_open`) and how the position moves."""

    def __init__(
        self, manifest: Manifest, job: ReaderJob, settings: LoaderSettings, caches: tuple[ShardCache, ...] = ()
    ):
        """`caches`: those the job's plan waits on (`dlx.data.loader.plan.CachedPlan`), one per split in object
        storage."""
        self.settings, self.seq_len = settings, settings.seq_len
        self.caches = caches
        self.num_workers, self.prefetch = settings.num_workers, settings.prefetch
        self._manifest, self._job = manifest, job
        self._transfer = HostToDevice(torch.device(settings.device), settings.batch_shape)
        self._feed: InProcessFeed | WorkerFeed | None = None
        self._read_shards = ReadShards()  # what consumed batches read, until verified; kept across feeds

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

    def source_tokens(self) -> dict[str, int]:
        return {}

    def new_source_epochs(self) -> list[tuple[str, int]]:
        return []

    def _open(self, start: Any, loop: bool) -> None:
        self._feed = open_feed(self._job, start, loop, self.num_workers, self.prefetch, self._read_shards)

    def _read(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The feed's next batch on the device; on any failure the feed is stopped and the position left unchanged,
        so the next call restarts cleanly from it."""
        try:
            batch = self._transfer(torch.from_numpy(self._feed.next_batch()))  # (2, B, seq_len)
        except BaseException:
            self._stop()
            raise
        return batch[0], batch[1]

    def _stop(self, at_once: bool = False) -> None:
        feed, self._feed = self._feed, None
        if feed is not None:
            feed.close(at_once)

    def verify_read_shards(self) -> list[str]:
        """Block until every shard a consumed batch came from is verified against the manifest (UserError naming the
        first that is not); returns the shards that had to be hashed now (see `dlx.data.loader.feed.ReadShards`),
        then the cached shards of data in object storage that were checked (`ShardCache.verify_read`)."""
        return self._read_shards.verify() + [name for cache in self.caches for name in cache.verify_read()]

    def close(self, at_once: bool = False) -> None:
        """Stop the workers (idempotent); `at_once`: kill them, their batches are not wanted. The caches stop for good
        (their folders released once what their batches read is verified). Also runs when the loader is garbage
        collected and at interpreter exit."""
        self._stop(at_once)
        for cache in self.caches:
            cache.close()

    def __iter__(self) -> FeedLoader:
        return self

    def __enter__(self) -> FeedLoader:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
