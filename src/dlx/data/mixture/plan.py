"""A mixture's batches for the loader's feeds (in-process or worker processes): the plan seam of `dlx.data.loader.plan`.

The rows are read through one `TokenWindows` over the sources' splits laid end to end (`joined`), so a batch costs one
vectorised read, as it does from one dataset. A cursor is a position: the slots all ranks have consumed. numpy only,
like everything a worker imports.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np

from dlx.data.loader.windows import SplitSpec, TokenWindows
from dlx.data.mixture.order import MixOrder, MixWindows


def joined(splits: list[SplitSpec]) -> SplitSpec:
    """The sources' splits end to end as one stream, each shard named by its absolute path (so the folder is "").
    A source's windows never run into the next source: each lies within its own tokens (`count_windows`). Volatile
    (each shard mapped for one batch) when a source's shards are in a cache (object storage)."""
    shards = tuple(
        (str(Path(split.folder).resolve() / name), tokens) for split in splits for name, tokens in split.shards
    )
    dtypes = {split.dtype for split in splits}
    if len(dtypes) != 1:  # one tokenizer, so one vocabulary size and one shard dtype; checked before this
        raise ValueError(f"mixture sources have different token dtypes {sorted(dtypes)}")
    return SplitSpec("", dtypes.pop(), shards, volatile=any(split.volatile for split in splits))


class MixturePlan:
    """`schedule` yields the position of each micro-batch step; `fill` writes this rank's batch for one."""

    def __init__(self, order: MixOrder, splits: list[SplitSpec], seq_len: int):
        self.order, self.splits, self.seq_len = order, splits, seq_len
        self.micro_batch_size = order.micro_batch_size
        self._base = np.cumsum([0] + [split.n_tokens for split in splits[:-1]], dtype=np.int64)
        """Where each source's tokens start in the joined stream."""
        self._rows = MixWindows(order)
        self._stream: TokenWindows | None = None
        self._begins: dict[int, np.ndarray] = {}
        """Stream offset of each row's window, for the steps of the current block (see MixWindows.block)."""

    def __getstate__(self) -> dict:
        return {"order": self.order, "splits": self.splits, "seq_len": self.seq_len}

    def __setstate__(self, state: dict) -> None:
        self.__init__(**state)

    @property
    def stream(self) -> TokenWindows:
        if self._stream is None:
            self._stream = TokenWindows(joined(self.splits), self.seq_len)
        return self._stream

    def schedule(self, start: int, loop: bool = True) -> Iterator[int]:
        """Positions of the steps from `start` on, for ever: a mixture has no last batch (sources start new epochs)."""
        position = int(start)
        while True:
            yield position
            position += self.order.step_windows

    def fill(self, position: int, out: np.ndarray) -> None:
        """Write this rank's micro-batch into `out` (2, B, seq_len) int64: out[0] inputs, out[1] targets."""
        self.stream.fill_at(self._row_begins(position), out)

    def shards_of(self, position: int) -> set[str]:
        return self.stream.shards_at(self._row_begins(position))

    def _row_begins(self, position: int) -> np.ndarray:
        if position not in self._begins:
            positions, sources, windows = self._rows.block(position)
            begins = self._base[sources] + windows * self.seq_len  # (BLOCK_STEPS, B), in a few vectorised calls
            self._begins = dict(zip(positions, begins, strict=True))
        return self._begins[position]

    def locate(self, position: int) -> tuple[np.ndarray, np.ndarray]:
        """(source index, window id) of each row of this rank's micro-batch at `position`."""
        return self._rows(position)

    def describe_bad_token(self, position: int, vocab_size: int) -> str:
        sources, windows = self.locate(position)
        for source, window in zip(sources.tolist(), windows.tolist(), strict=True):
            reader = TokenWindows(self.splits[source], self.seq_len)
            tokens = reader.window(window)
            bad = np.flatnonzero(tokens >= vocab_size)
            if len(bad):
                path = self.splits[source].folder
                shard, offset = reader.locate(window * self.seq_len + int(bad[0]))
                return (
                    f"data.mix source {path}: shard {shard} holds token id {int(tokens[bad[0]])} at token "
                    f"{offset:,}, outside the tokenizer's {vocab_size:,} ids; check it with "
                    f"`dlx data verify {path}` and run `dlx prepare` again"
                )
        return "data.mix: a batch holds a token id outside the vocabulary; run `dlx data verify` on each source"
