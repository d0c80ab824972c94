"""Packing: one split's shards read as a single token stream cut into fixed windows of `seq_len + 1` tokens.

Window `i` is tokens `[i * seq_len, i * seq_len + seq_len + 1)` of the stream: consecutive windows share one token, so
every token after the first is a prediction target exactly once per epoch. Windows cross document boundaries (documents
are separated by eos_id in the stream) and shard boundaries alike; the last `(n_tokens - 1) % seq_len` tokens of the
split start no window.

This module needs numpy only: the worker processes import it without torch or pydantic, so they start fast.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dlx.errors import UserError


@dataclass(frozen=True)
class SplitSpec:
    """Which files make up a split, as the main process validated them; sent to each worker."""

    folder: str
    dtype: str
    """Token dtype of the shards, `uint16` or `uint32` (little-endian)."""
    shards: tuple[tuple[str, int], ...]
    """(file name, number of tokens) of each shard, in stream order."""
    volatile: bool = False
    """The shards come and go in a local cache (`cache.ShardCache`): map each for one batch only."""

    @property
    def n_tokens(self) -> int:
        return sum(tokens for _, tokens in self.shards)


def count_windows(n_tokens: int, seq_len: int) -> int:
    """Windows of `seq_len + 1` tokens that fit in a stream of `n_tokens`, with one token shared between neighbours."""
    return max(0, (n_tokens - 1) // seq_len)


class TokenWindows:
    """Random access to the windows of one split, through read-only memory maps of its shards."""

    def __init__(self, spec: SplitSpec, seq_len: int):
        self.seq_len = seq_len
        dtype = np.dtype(spec.dtype).newbyteorder("<")
        # Pages load lazily on first touch, so mapping every shard up front costs only address space. Plain ndarray
        # views of the maps: slicing an np.memmap costs several times more (its subclass hooks run on every slice).
        self._dtype, self._volatile = dtype, spec.volatile
        self._paths = [Path(spec.folder) / name for name, tokens in spec.shards if tokens > 0]
        self._names = [name for name, tokens in spec.shards if tokens > 0]
        sizes = [tokens for _, tokens in spec.shards if tokens > 0]
        self._sizes = sizes
        self._maps: dict[int, np.ndarray] = {}
        if not self._volatile:  # pages load lazily on first touch: mapping every shard costs only address space
            for i in range(len(sizes)):
                self._shard(i)
        self._starts = np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)])
        self.n_windows = count_windows(int(self._starts[-1]), seq_len)
        self._scratch = np.empty((0, seq_len + 1), dtype=dtype)

    def _shard(self, i: int) -> np.ndarray:
        tokens = self._maps.get(i)
        if tokens is None:
            tokens = self._maps[i] = _map(self._paths[i], self._dtype, self._sizes[i])
        return tokens

    def window(self, index: int) -> np.ndarray:
        """Tokens of window `index`, shape (seq_len + 1,), in the shards' dtype (a view when inside one shard)."""
        begin = int(index) * self.seq_len
        return self._read(begin, int(np.searchsorted(self._starts, begin, side="right")) - 1)

    def _read(self, begin: int, shard: int) -> np.ndarray:
        offset = begin - int(self._starts[shard])
        length = self.seq_len + 1
        tokens = self._shard(shard)[offset : offset + length]
        if len(tokens) == length:
            return tokens
        pieces = [tokens]  # the window runs on into the next shard(s)
        while (length := length - len(pieces[-1])) > 0:
            shard += 1
            pieces.append(self._shard(shard)[:length])
        return np.concatenate(pieces)

    def locate(self, token: int) -> tuple[str, int]:
        """(shard file name, offset in it) of token number `token` of the stream."""
        shard = int(np.searchsorted(self._starts, token, side="right")) - 1
        return self._names[shard], token - int(self._starts[shard])

    def shards_of(self, window_ids: np.ndarray) -> set[str]:
        """File names of the shards the windows read from (a window may run on into the next shards)."""
        return self.shards_at(np.asarray(window_ids, dtype=np.int64) * self.seq_len)

    def shards_at(self, begins: np.ndarray) -> set[str]:
        """`shards_of` for the windows starting at token positions `begins` (int64) of the stream."""
        first = np.searchsorted(self._starts, begins, side="right") - 1
        last = np.searchsorted(self._starts, begins + self.seq_len, side="right") - 1
        return {self._names[i] for a, b in zip(first.tolist(), last.tolist(), strict=True) for i in range(a, b + 1)}

    def fill(self, window_ids: np.ndarray, out: np.ndarray) -> None:
        """Write a micro-batch into `out` (2, B, seq_len) int64: out[0] inputs, out[1] targets (shifted by one)."""
        self.fill_at(np.asarray(window_ids, dtype=np.int64) * self.seq_len, out)

    def fill_at(self, begins: np.ndarray, out: np.ndarray) -> None:
        """`fill` for the seq_len + 1 tokens from each token position in `begins` (int64) of the stream."""
        shards = np.searchsorted(self._starts, begins, side="right") - 1
        if self._scratch.shape[0] != len(begins):
            self._scratch = np.empty((len(begins), self.seq_len + 1), dtype=self._scratch.dtype)
        # Gather in the shards' dtype, then widen to int64 in two bulk copies: a third faster than per-row widening.
        for row, (begin, shard) in enumerate(zip(begins.tolist(), shards.tolist(), strict=True)):
            self._scratch[row] = self._read(begin, shard)
        out[0] = self._scratch[:, :-1]
        out[1] = self._scratch[:, 1:]
        if self._volatile:  # the cache may evict these shards once this batch is read
            self._maps.clear()


def _map(path: Path, dtype: np.dtype, tokens: int) -> np.ndarray:
    """A read-only view of a shard's tokens; UserError naming the shard when it cannot be opened."""
    try:
        return np.memmap(path, dtype=dtype, mode="r", shape=(tokens,)).view(np.ndarray)
    except (OSError, ValueError) as e:  # missing, unreadable, or shorter than the manifest says
        reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        raise UserError(
            f"dataset {path.parent}: cannot read shard {path.name} ({reason}); run `dlx data verify {path.parent}` "
            "and `dlx prepare` again if it is missing"
        ) from None
