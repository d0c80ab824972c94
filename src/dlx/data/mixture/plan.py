"""A mixture's batches for the loader's feeds (in-process or worker processes): the `plan` seam of `dlx.data.loader`.

Built from the JSON spec a feed receives: `{"mixture": {"order": MixOrder, "splits": [SplitSpec, ...]}, "seq_len",
"start": {"position": P}, ...}`. numpy only, like the rest of what the workers import.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from dlx.data.loader.windows import SplitSpec, TokenWindows
from dlx.data.mixture.order import MixOrder, MixWindows


class MixturePlan:
    """`schedule` yields the position of each micro-batch step; `fill` writes this rank's batch for one."""

    def __init__(self, spec: dict):
        mixture = spec["mixture"]
        self.order = MixOrder.from_json(mixture["order"])
        self.micro_batch_size = self.order.micro_batch_size
        self.seq_len = spec["seq_len"]
        splits = [SplitSpec.from_json(split) for split in mixture["splits"]]
        self.windows = [TokenWindows(split, self.seq_len) for split in splits]
        self._rows = MixWindows(self.order)
        dtypes = {split.dtype for split in splits}
        if len(dtypes) != 1:  # one tokenizer, so one vocabulary size and one shard dtype; checked before this
            raise ValueError(f"mixture sources have different token dtypes {sorted(dtypes)}")
        # Gather in the shards' dtype, then widen to int64 in two bulk copies (as TokenWindows.fill does).
        dtype = np.dtype(dtypes.pop()).newbyteorder("<")
        self._scratch = np.empty((self.micro_batch_size, self.seq_len + 1), dtype=dtype)

    def schedule(self, start: dict, loop: bool = True) -> Iterator[int]:
        """Positions of the steps from `start` on, for ever: a mixture has no last batch (sources start new epochs)."""
        position = int(start["position"])
        while True:
            yield position
            position += self.order.step_windows

    def fill(self, position: int, out: np.ndarray) -> None:
        """Write this rank's micro-batch into `out` (2, B, seq_len) int64: out[0] inputs, out[1] targets."""
        sources, windows = self.locate(position)
        for row, (source, window) in enumerate(zip(sources.tolist(), windows.tolist(), strict=True)):
            self._scratch[row] = self.windows[source].window(window)
        out[0] = self._scratch[:, :-1]
        out[1] = self._scratch[:, 1:]

    def locate(self, position: int) -> tuple[np.ndarray, np.ndarray]:
        """(source index, window id) of each row of this rank's micro-batch at `position`."""
        return self._rows(position)
