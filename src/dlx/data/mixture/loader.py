"""`MixtureLoader`: training batches drawn from several prepared datasets in proportion to their weights.

A `BatchSource` (`dlx.data.source`) with `TokenLoader`'s feeds, transfer and close (`FeedLoader`: in-process or
worker processes, which verify every shard's checksum). Which window of which source each row holds is
`dlx.data.mixture.order`, a pure function of (seed, position). Every source is read whole, window by window, before
any window of it repeats; a source read to its end starts its next epoch in a new order (`new_source_epochs` reports
it).

A source in object storage (its local mirror, `dlx.data.remote`) streams its shards through a `ShardCache` of its own,
prefetched in the order the mixture reads them (`CachedPlan`: each batch waits for its shards in every cache). The
caches share `settings.cache_bytes` (`dlx.data.loader.cache.share_cache`, or the shares a staged run gives); a source
larger than its share is permuted in shard blocks, which its loader state records.
"""

from __future__ import annotations

import torch

from dlx.data.loader.base import FeedLoader
from dlx.data.loader.cache import ShardCache
from dlx.data.loader.feed import ReaderJob
from dlx.data.loader.loader import open_any_split, pinned_batches, shard_checksums, shard_order, split_cache
from dlx.data.loader.order import ORDER_HINT
from dlx.data.loader.plan import CachedPlan
from dlx.data.loader.windows import SplitSpec, count_windows
from dlx.data.mixture.order import MixOrder, SourcePattern, source_epochs
from dlx.data.mixture.plan import MixturePlan
from dlx.data.mixture.sources import Source, cache_shares, open_sources
from dlx.data.shards import Manifest
from dlx.data.source import DamagedState, LoaderSettings
from dlx.errors import UserError
from dlx.faults import pause_point

STATE_FORMAT = "dlx-mixture-state"
STATE_VERSION = 1


class MixtureLoader(FeedLoader):
    """Iterate `(inputs, targets)`: int64 (micro_batch_size, seq_len) on the device; rows from `sources` by weight.

    One mixture epoch (`windows_per_epoch`, what `train.epochs` counts) is as many windows as the sources hold together,
    rounded down to whole steps; `epoch` is the mixture epoch of the next batch. `source_epochs` counts each source's
    own passes, which differ from it when the weights differ from the sources' sizes."""

    def __init__(
        self,
        sources: list[Source],
        settings: LoaderSettings = LoaderSettings(),
        source_ids: tuple[int, ...] = (),
        first_draws: tuple[int, ...] = (),
        cache_bytes: tuple[int, ...] = (),
    ):
        """`settings.verify`: check each shard's SHA-256 against its manifest the first time it is read.
        `source_ids`, `first_draws`: a stage of a staged run (`dlx.data.mixture.order.MixOrder`); empty: a whole run.
        `cache_bytes`: each source's share of the cache bound (0 for a local one; empty: `cache_shares` of these
        sources)."""
        manifests = open_sources(sources)
        self.sources, seq_len = sources, settings.seq_len
        opened = [open_any_split(s.path, "train", settings) for s in sources]
        self._splits = [spec for _, spec, _ in opened]
        n_windows = tuple(count_windows(split.n_tokens, seq_len) for split in self._splits)
        for source, n in zip(sources, n_windows, strict=True):
            if n == 0:
                raise UserError(f"data.mix source {source.path} holds fewer than seq_len + 1 = {seq_len + 1} tokens")
        shares = list(cache_bytes) or cache_shares(sources, "train", settings.cache_bytes)
        blocks = [
            shard_order(spec, settings, n, share) if url else (0, ())
            for (_, spec, url), n, share in zip(opened, n_windows, shares, strict=True)
        ]
        self._order = self._mix_order(settings, n_windows, source_ids, first_draws, blocks)
        self._pattern = SourcePattern(self._order.weights)
        caches = self._open_caches(opened, shares, settings)
        local = [(m, split) for m, split, (_, _, url) in zip(manifests, self._splits, opened, strict=True) if not url]
        checksums = sum((shard_checksums(m, split, "train") for m, split in local), ()) if settings.verify else ()
        plan = MixturePlan(self._order, self._splits, seq_len)
        plan = CachedPlan(plan, list(caches), pinned_batches(settings)) if caches else plan
        super().__init__(manifests[0], ReaderJob(plan, manifests[0].vocab_size, checksums), settings, caches)
        self._position = 0
        """Slots (windows) consumed by all ranks together."""
        self._reported_epochs = self.source_epochs()

    def _mix_order(
        self,
        settings: LoaderSettings,
        n_windows: tuple[int, ...],
        source_ids: tuple[int, ...],
        first_draws: tuple[int, ...],
        blocks: list[tuple[int, tuple]],
    ) -> MixOrder:
        weights = tuple(source.weight for source in self.sources)
        if source_ids == tuple(range(len(self.sources))) and not any(first_draws):  # a first stage reads as data.mix
            source_ids, first_draws = (), ()
        block_shards = tuple(k for k, _ in blocks) if any(k for k, _ in blocks) else ()
        bounds = tuple(b for _, b in blocks) if block_shards else ()
        o = settings
        return MixOrder(
            n_windows, weights, o.micro_batch_size, o.world_size, o.rank, o.seed, o.shuffle, source_ids, first_draws,
            block_shards, bounds,
        )  # fmt: skip

    def _open_caches(
        self, opened: list[tuple[Manifest, SplitSpec, str | None]], shares: list[int], settings: LoaderSettings
    ) -> tuple[ShardCache, ...]:
        """A cache for each source in object storage (its split read from the cache's folder from now on)."""
        caches = []
        for index, ((manifest, spec, url), share) in enumerate(zip(opened, shares, strict=True)):
            if url is not None:
                cache, self._splits[index] = split_cache(url, manifest, spec, "train", settings, share)
                caches.append(cache)
        return tuple(caches)

    @property
    def names(self) -> list[str]:
        return [s.name for s in self.sources]

    @property
    def orders(self) -> dict[str, str]:
        """Each source's window order: `shuffled`, `sequential`, or `shard-blocks-K` (larger than its cache)."""
        return {name: self._order.source_order(i) for i, name in enumerate(self.names)}

    @property
    def batches_per_epoch(self) -> int:
        """Micro-batches per rank per mixture epoch."""
        return sum(self._order.n_windows) // self._order.step_windows

    @property
    def windows_per_epoch(self) -> int:
        return self.batches_per_epoch * self._order.step_windows

    @property
    def epoch(self) -> int:
        return self._position // max(1, self.windows_per_epoch)

    def source_tokens(self) -> dict[str, int]:
        """Training tokens (input positions) each source has supplied so far, all ranks together."""
        draws = self._pattern.draws_before(self._position)
        return {name: int(d) * self.seq_len for name, d in zip(self.names, draws.tolist(), strict=True)}

    def source_epochs(self) -> dict[str, int]:
        """The epoch of each source the next draw from it comes from (0 during its first pass)."""
        epochs = source_epochs(self._pattern, self._order, self._position)
        return dict(zip(self.names, epochs, strict=True))

    def new_source_epochs(self) -> list[tuple[str, int]]:
        """(name, epoch) of each source that has started a new epoch since the previous call."""
        now = self.source_epochs()
        started = [(name, epoch) for name, epoch in now.items() if epoch > self._reported_epochs[name]]
        self._reported_epochs = now
        return started

    def warm(self) -> None:
        """Start the feed at the current position (its workers fill batches ahead) without taking a batch."""
        if self._feed is None:
            self._open(self._position, True)

    def __next__(self) -> tuple[torch.Tensor, torch.Tensor]:
        pause_point("train_batch")  # test-only, off by default: see dlx.faults
        self.warm()
        batch = self._read()
        self._position += self._order.step_windows
        return batch

    def state_dict(self) -> dict:
        """Where the next batch comes from (JSON-ready, the same on every rank) and what it refers to."""
        order = self._order
        state = {
            "format": STATE_FORMAT,
            "version": STATE_VERSION,
            "position": self._position,
            "seed": order.seed,
            "seq_len": self.seq_len,
            "shuffle": order.shuffle,
            "sources": [[s.name, n, s.weight] for s, n in zip(self.sources, order.n_windows, strict=True)],
            # For the record only: a resume may use another world size or micro-batch size.
            "world_size": order.world_size,
            "micro_batch_size": order.micro_batch_size,
        }
        if order.source_ids or order.first_draws:  # a stage of a staged run
            state.update(source_ids=list(order.source_ids), first_draws=list(order.first_draws))
        if order.block_shards:  # a source in object storage larger than its cache
            state.update(orders=[[name, o] for name, o in self.orders.items()])
        return state

    def load_state_dict(self, state: dict, steps_done: int | None = None) -> None:
        """Continue from a saved position, also with another world size; refused for another mixture."""
        if state.get("format") != STATE_FORMAT or state.get("version") != STATE_VERSION:
            raise UserError(
                f"the checkpoint's loader state is {state.get('format')!r} v{state.get('version')}, not a data.mix "
                "state: resume with the data the run was started with"
            )
        expected = self.state_dict()
        for key in ("seed", "seq_len", "shuffle", "sources", "source_ids", "first_draws", "orders"):
            if state.get(key) != expected.get(key):
                raise UserError(
                    f"cannot resume the data.mix loader: it was saved with {key}={state.get(key)!r}, this run has "
                    f"{key}={expected.get(key)!r} (same datasets, sizes, weights, seq_len, seed and shuffle are needed"
                    f"{ORDER_HINT if key == 'orders' else ''})"
                )
        position = state.get("position")
        if type(position) is not int or position < 0:
            raise DamagedState(f"the data.mix loader state is damaged: position={position!r}")
        self._stop()
        self._position = position
        self._reported_epochs = self.source_epochs()
