"""`MixtureLoader`: training batches drawn from several prepared datasets in proportion to their weights.

The same face as `TokenLoader` (iterate `(inputs, targets)`, `epoch`, `windows_per_epoch`, `state_dict`, ...) and the
same feeds (in-process or worker processes, `dlx.data.loader.feed`, which verify every shard's checksum). Which window
of which source each row holds is `dlx.data.mixture.order`, a pure function of (seed, position). Every source is read
whole, window by window, before any window of it repeats; a source read to its end starts its next epoch in a new order
(`new_source_epochs` reports it).
"""

from __future__ import annotations

import torch

from dlx.data.loader.feed import ReaderJob, ReadShards, open_feed
from dlx.data.loader.loader import open_split, shard_checksums
from dlx.data.loader.windows import count_windows
from dlx.data.mixture.order import MixOrder, SourcePattern, source_epochs
from dlx.data.mixture.plan import MixturePlan
from dlx.data.mixture.sources import Source, open_sources
from dlx.device import HostToDevice
from dlx.errors import UserError

STATE_FORMAT = "dlx-mixture-state"
STATE_VERSION = 1


class MixtureLoader:
    """Iterate `(inputs, targets)`: int64 (micro_batch_size, seq_len) on `device`, rows drawn from `sources` by weight.

    One mixture epoch (`windows_per_epoch`, what `train.epochs` counts) is as many windows as the sources hold together,
    rounded down to whole steps; `epoch` is the mixture epoch of the next batch. `source_epochs` counts each source's
    own passes, which differ from it when the weights differ from the sources' sizes."""

    def __init__(
        self,
        sources: list[Source],
        seq_len: int = 256,
        micro_batch_size: int = 8,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
        num_workers: int = 1,
        prefetch: int = 4,
        shuffle: bool = True,
        device: str | torch.device = "cpu",
        verify: bool = True,
    ):
        """`verify`: check each shard's SHA-256 against its manifest the first time it is read (as `TokenLoader`)."""
        manifests = open_sources(sources)
        self.sources, self.seq_len = sources, seq_len
        self.num_workers, self.prefetch = num_workers, prefetch
        self._manifest = manifests[0]
        self._splits = [open_split(s.path, "train")[1] for s in sources]
        n_windows = tuple(count_windows(split.n_tokens, seq_len) for split in self._splits)
        for source, n in zip(sources, n_windows, strict=True):
            if n == 0:
                raise UserError(f"data.mix source {source.path} holds fewer than seq_len + 1 = {seq_len + 1} tokens")
        weights = tuple(s.weight for s in sources)
        self._order = MixOrder(n_windows, weights, micro_batch_size, world_size, rank, seed, shuffle)
        self._pattern = SourcePattern(weights)
        checksums = [shard_checksums(m, split, "train") for m, split in zip(manifests, self._splits, strict=True)]
        plan = MixturePlan(self._order, self._splits, seq_len)
        self._job = ReaderJob(plan, self._manifest.vocab_size, sum(checksums, ()) if verify else ())
        self._transfer = HostToDevice(torch.device(device), (2, micro_batch_size, seq_len))
        self._position = 0
        """Slots (windows) consumed by all ranks together."""
        self._reported_epochs = self.source_epochs()
        self._feed = None
        self._read = ReadShards()  # what consumed batches read, until verified

    @property
    def names(self) -> list[str]:
        return [s.name for s in self.sources]

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
        return getattr(self._feed, "pids", [])

    def source_tokens(self) -> dict[str, int]:
        """Training tokens (input positions) each source has supplied so far, all ranks together."""
        draws = self._pattern.draws_before(self._position)
        return {name: int(d) * self.seq_len for name, d in zip(self.names, draws.tolist(), strict=True)}

    def source_epochs(self) -> dict[str, int]:
        """The epoch of each source the next draw from it comes from (0 during its first pass)."""
        epochs = source_epochs(self._pattern, self._order.n_windows, self._position)
        return dict(zip(self.names, epochs, strict=True))

    def new_source_epochs(self) -> list[tuple[str, int]]:
        """(name, epoch) of each source that has started a new epoch since the previous call."""
        now = self.source_epochs()
        started = [(name, epoch) for name, epoch in now.items() if epoch > self._reported_epochs[name]]
        self._reported_epochs = now
        return started

    def __iter__(self) -> MixtureLoader:
        return self

    def __next__(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self._feed is None:
            self._start()
        try:
            batch = self._transfer(torch.from_numpy(self._feed.next_batch()))  # (2, B, seq_len)
        except BaseException:
            self._stop()  # the position is unchanged: the next call restarts cleanly from it
            raise
        self._position += self._order.step_windows
        return batch[0], batch[1]

    def _start(self) -> None:
        self._feed = open_feed(self._job, self._position, True, self.num_workers, self.prefetch, self._read)

    def _stop(self) -> None:
        feed, self._feed = self._feed, None
        if feed is not None:
            feed.close()

    def state_dict(self) -> dict:
        """Where the next batch comes from (JSON-ready, the same on every rank) and what it refers to."""
        return {
            "format": STATE_FORMAT,
            "version": STATE_VERSION,
            "position": self._position,
            "seed": self._order.seed,
            "seq_len": self.seq_len,
            "shuffle": self._order.shuffle,
            "sources": [[s.name, n, s.weight] for s, n in zip(self.sources, self._order.n_windows, strict=True)],
            # For the record only: a resume may use another world size or micro-batch size.
            "world_size": self._order.world_size,
            "micro_batch_size": self._order.micro_batch_size,
        }

    def load_state_dict(self, state: dict) -> None:
        """Continue from a saved position, also with another world size; refused for another mixture."""
        if state.get("format") != STATE_FORMAT or state.get("version") != STATE_VERSION:
            raise UserError(
                f"the checkpoint's loader state is {state.get('format')!r} v{state.get('version')}, not a data.mix "
                "state: resume with the data the run was started with"
            )
        expected = self.state_dict()
        for key in ("seed", "seq_len", "shuffle", "sources"):
            if state.get(key) != expected[key]:
                raise UserError(
                    f"cannot resume the data.mix loader: it was saved with {key}={state.get(key)!r}, this run has "
                    f"{key}={expected[key]!r} (same datasets, sizes, weights, seq_len, seed and shuffle are needed)"
                )
        position = state.get("position")
        if not isinstance(position, int) or position < 0:
            raise UserError(f"the data.mix loader state is damaged: position={position!r}")
        self._stop()
        self._position = position
        self._reported_epochs = self.source_epochs()

    def verify_read_shards(self) -> list[str]:
        """Block until every shard a consumed batch came from is verified against the manifest (UserError naming the
        first that is not); returns the shards that had to be hashed now (see `dlx.data.loader.feed.ReadShards`)."""
        return self._read.verify()

    def close(self) -> None:
        """Stop the workers (idempotent)."""
        self._stop()

    def __enter__(self) -> MixtureLoader:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
