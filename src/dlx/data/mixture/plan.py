"""A mixture's batches for the loader's feeds (in-process or worker processes): the `plan` seam of `dlx.data.loader`.

Built from the JSON spec a feed receives: `{"mixture": {"order": MixOrder, "splits": [SplitSpec, ...]}, "seq_len",
"start": {"position": P}, ...}`. numpy only, like the rest of what the workers import. The rows are read through one
`TokenWindows` over the sources' splits laid end to end (`joined`), so a batch costs one vectorised read, as it does
from one dataset.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np

from dlx.data.loader.windows import SplitSpec, TokenWindows
from dlx.data.mixture.order import MixOrder, MixWindows


def joined(splits: list[SplitSpec]) -> SplitSpec:
    """The sources' splits end to end as one stream, each shard named by its absolute path (so the folder is "").
    A source's windows never run into the next source: each lies within its own tokens (`count_windows`)."""
    shards = tuple(
        (str(Path(split.folder).resolve() / name), tokens) for split in splits for name, tokens in split.shards
    )
    dtypes = {split.dtype for split in splits}
    if len(dtypes) != 1:  # one tokenizer, so one vocabulary size and one shard dtype; checked before this
        raise ValueError(f"mixture sources have different token dtypes {sorted(dtypes)}")
    return SplitSpec("", dtypes.pop(), shards)


class MixturePlan:
    """`schedule` yields the position of each micro-batch step; `fill` writes this rank's batch for one."""

    def __init__(self, spec: dict):
        mixture = spec["mixture"]
        self.order = MixOrder.from_json(mixture["order"])
        self.micro_batch_size = self.order.micro_batch_size
        self.seq_len = spec["seq_len"]
        splits = [SplitSpec.from_json(split) for split in mixture["splits"]]
        self._stream = TokenWindows(joined(splits), self.seq_len)
        self._base = np.cumsum([0] + [split.n_tokens for split in splits[:-1]], dtype=np.int64)
        """Where each source's tokens start in the joined stream."""
        self._rows = MixWindows(self.order)
        self._begins: dict[int, np.ndarray] = {}
        """Stream offset of each row's window, for the steps of the current block (see MixWindows.block)."""

    def schedule(self, start: dict, loop: bool = True) -> Iterator[int]:
        """Positions of the steps from `start` on, for ever: a mixture has no last batch (sources start new epochs)."""
        position = int(start["position"])
        while True:
            yield position
            position += self.order.step_windows

    def fill(self, position: int, out: np.ndarray) -> None:
        """Write this rank's micro-batch into `out` (2, B, seq_len) int64: out[0] inputs, out[1] targets."""
        if position not in self._begins:
            positions, sources, windows = self._rows.block(position)
            begins = self._base[sources] + windows * self.seq_len  # (BLOCK_STEPS, B), in a few vectorised calls
            self._begins = dict(zip(positions, begins, strict=True))
        self._stream.fill_at(self._begins[position], out)

    def locate(self, position: int) -> tuple[np.ndarray, np.ndarray]:
        """(source index, window id) of each row of this rank's micro-batch at `position`."""
        return self._rows(position)
