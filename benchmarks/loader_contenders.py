"""The loader contest's contenders: dlx's `TokenLoader` against torch's `DataLoader` and torchdata's
`StatefulDataLoader`, both fed dlx's own order and windows so that every contender reads the same batches.

- the sampler (`CursorSampler`) yields the `Cursor` of each batch this rank reads (`dlx.data.loader.order.schedule`);
  its state is the next cursor, so StatefulDataLoader's `state_dict` holds dlx's world-size-free position;
- the dataset (`WindowBatches`) maps a cursor to its (2, B, seq_len) int64 batch (`TokenWindows.fill`), allocated in
  shared memory inside a worker so that the library sends it without another copy (what `default_collate` does);
- `batch_size=None` (the dataset returns whole batches), `prefetch_factor` = dlx's `prefetch`, `pin_memory` on CUDA,
  and a `worker_init_fn` that ignores SIGINT as dlx's workers do (Ctrl-C is the trainer's to handle).

`LibraryLoader` gives both libraries TokenLoader's face, the `dlx.data.source.BatchSource` protocol (iteration,
`state_dict`, `load_state_dict`, `close`, `worker_pids`, ...), so the same driver, trainer and checks run every
contender.
"""

from __future__ import annotations

import signal
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Sampler, get_worker_info

from dlx.data.loader.loader import TokenLoader, open_split
from dlx.data.loader.order import Cursor, EpochWindows, Order, advance, make_state, read_state, schedule, settle
from dlx.data.loader.windows import SplitSpec, TokenWindows, count_windows
from dlx.data.source import LoaderSettings

CONTENDERS = ("dlx TokenLoader", "torch DataLoader", "torchdata StatefulDataLoader")


class CursorSampler(Sampler):
    """dlx's order as a sampler: the cursor of every batch this rank reads from `start` (forever if `loop`)."""

    def __init__(self, order: Order, start: Cursor, loop: bool):
        self.order, self.start, self.loop = order, start, loop

    def __iter__(self):
        for cursor in schedule(self.order, self.start, self.loop):
            self.start = advance(self.order, cursor)  # the state: where the next batch would come from
            yield cursor

    def state_dict(self) -> dict:
        return {"epoch": self.start.epoch, "consumed": self.start.consumed}

    def load_state_dict(self, state: dict) -> None:
        self.start = settle(self.order, Cursor(int(state["epoch"]), int(state["consumed"])))


class WindowBatches(Dataset):
    """Cursor → this rank's batch (2, B, seq_len) int64: inputs and targets shifted by one."""

    def __init__(self, spec: SplitSpec, order: Order, seq_len: int):
        self.spec, self.order, self.seq_len = spec, order, seq_len
        self._windows: TokenWindows | None = None  # opened in the process that reads (a worker)
        self._window_ids = EpochWindows(order)

    def __getitem__(self, cursor: Cursor) -> torch.Tensor:
        if self._windows is None:
            self._windows = TokenWindows(self.spec, self.seq_len)
        batch = torch.empty((2, self.order.micro_batch_size, self.seq_len), dtype=torch.int64)
        if get_worker_info() is not None:
            batch.share_memory_()  # sent to the trainer by file descriptor, no copy on the way
        self._windows.fill(self._window_ids(cursor), batch.numpy())
        return batch

    def __len__(self) -> int:
        return self.order.batches_per_epoch


def _ignore_sigint(worker_id: int) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


class LibraryLoader:
    """dlx's order and windows through `torch.utils.data.DataLoader` or torchdata's `StatefulDataLoader`."""

    def __init__(
        self,
        folder: str | Path,
        library: str,
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
    ):
        if library not in CONTENDERS[1:]:
            raise ValueError(f"library must be one of {CONTENDERS[1:]}, got {library!r}")
        self.library, self.split, self.seq_len, self.loop = library, split, seq_len, loop
        self.num_workers, self.prefetch = num_workers, prefetch
        self._manifest, self._spec = open_split(folder, split)
        n_windows = count_windows(self._spec.n_tokens, seq_len)
        self._order = Order(n_windows, micro_batch_size, world_size, rank, seed, shuffle)
        self._device = torch.device(device)
        self._cursor = Cursor(0, 0)
        self._sampler = CursorSampler(self._order, self._cursor, loop)
        self._loader = self._build()
        self._iterator = None
        self._pending_state: dict | None = None

    def _build(self) -> DataLoader:
        options = {
            "batch_size": None,
            "num_workers": self.num_workers,
            "pin_memory": self._device.type == "cuda",
        }
        if self.num_workers > 0:
            options.update(prefetch_factor=self.prefetch, worker_init_fn=_ignore_sigint)
        dataset = WindowBatches(self._spec, self._order, self.seq_len)
        if self.library == "torch DataLoader":
            return DataLoader(dataset, sampler=self._sampler, **options)
        from torchdata.stateful_dataloader import StatefulDataLoader

        return StatefulDataLoader(dataset, sampler=self._sampler, **options)

    @property
    def batches_per_epoch(self) -> int:
        return self._order.batches_per_epoch

    @property
    def windows_per_epoch(self) -> int:
        return self._order.batches_per_epoch * self._order.step_windows

    @property
    def epoch(self) -> int:
        return self._cursor.epoch

    @property
    def vocab_size(self) -> int:
        return self._manifest.vocab_size

    @property
    def eos_id(self) -> int:
        return self._manifest.eos_id

    @property
    def bos_id(self) -> int | None:
        return self._manifest.bos_id

    def source_tokens(self) -> dict[str, int]:
        return {}

    def new_source_epochs(self) -> list[tuple[str, int]]:
        return []

    @property
    def worker_pids(self) -> list[int]:
        workers = getattr(self._iterator, "_workers", [])
        return [w.pid for w in workers if w.is_alive()]

    def __iter__(self) -> LibraryLoader:
        return self

    def __next__(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self._iterator is None:
            if self._pending_state is not None:
                self._loader.load_state_dict(self._pending_state)
                self._pending_state = None
            self._iterator = iter(self._loader)
        batch = next(self._iterator)  # (2, B, seq_len), the trainer's own tensor (shared or pinned memory)
        if int(batch.max()) >= self._manifest.vocab_size:  # the same check TokenLoader makes
            raise ValueError("a batch holds a token id outside the vocabulary")
        self._cursor = advance(self._order, settle(self._order, self._cursor))
        batch = batch.to(self._device, non_blocking=True)
        return batch[0], batch[1]

    def state_dict(self) -> dict:
        state = make_state(self._order, settle(self._order, self._cursor), self.split, self.seq_len)
        if self.library != "torch DataLoader":
            state["library"] = self._loader.state_dict()
        return state

    def load_state_dict(self, state: dict) -> None:
        """DataLoader: a new sampler from dlx's cursor. StatefulDataLoader: its own state_dict (which holds the
        sampler's), loaded before the next iteration starts."""
        self.close()
        self._cursor = settle(self._order, read_state(state, self._order, self.split, self.seq_len))
        if self.library == "torch DataLoader":
            self._sampler = CursorSampler(self._order, self._cursor, self.loop)
            self._loader = self._build()
        else:
            self._pending_state = state["library"]

    def close(self) -> None:
        iterator, self._iterator = self._iterator, None
        if iterator is not None and hasattr(iterator, "_shutdown_workers"):
            iterator._shutdown_workers()

    def __enter__(self) -> LibraryLoader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def make_loader(
    contender: str, folder: str | Path, split: str = "train", loop: bool = True, **options
) -> TokenLoader | LibraryLoader:
    """The contender named `contender` (one of CONTENDERS); `options` are `LoaderSettings` fields."""
    if contender == CONTENDERS[0]:
        return TokenLoader(folder, LoaderSettings(**options), split, loop)
    return LibraryLoader(folder, contender, split=split, loop=loop, **options)


def window_ids(inputs: torch.Tensor, seq_len: int) -> np.ndarray:
    """On shards of consecutive integers, the window each row starts (its first token // seq_len)."""
    return (inputs[:, 0] // seq_len).numpy()
