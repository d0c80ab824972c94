"""One split's token stream → fixed-size shard files, each finished one fsynced and renamed into place.

The shard being filled is `<name>.partial`, hashed as it is written. Its committed length lives in the manifest's
resume state, written after the partial is fsynced; a resumed run truncates the partial back to that length (hashing
what stays) and appends the same tokens again, which is why an interrupted run ends byte-identical to an uninterrupted
one.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np

from dlx.atomic import fsync_dir
from dlx.data.shards import PARTIAL_SUFFIX, ShardInfo, Split, shard_name
from dlx.errors import UserError


class ShardWriter:
    def __init__(
        self,
        folder: Path,
        split: Split,
        dtype: str,
        shard_tokens: int,
        eos_id: int,
        index: int = 0,
        tokens: int = 0,
        documents: int = 0,
    ) -> None:
        self.folder, self.split, self.shard_tokens, self.eos_id = folder, split, shard_tokens, eos_id
        self.dtype = np.dtype(dtype).newbyteorder("<")
        self.index, self.tokens, self.documents = index, tokens, documents
        self._sha = hashlib.sha256()
        self._file = open(self._partial, "r+b") if tokens else None  # noqa: SIM115 - closed in sync/close
        if self._file is not None:
            left = tokens * self.dtype.itemsize
            while left and (block := self._file.read(min(left, 1 << 22))):
                self._sha.update(block)
                left -= len(block)

    @property
    def _partial(self) -> Path:
        return self.folder / (shard_name(self.split, self.index) + PARTIAL_SUFFIX)

    def state(self) -> dict:
        """The committed position of this split, for the manifest's resume state (call after sync)."""
        return {"index": self.index, "tokens": self.tokens, "documents": self.documents}

    def write(self, tokens: np.ndarray) -> list[ShardInfo]:
        """Append tokens; return the shards this filled (already fsynced and renamed to their final names)."""
        finished = []
        while len(tokens):
            if self._file is None:
                self._file = open(self._partial, "wb")  # noqa: SIM115 - closed when the shard is finished
            piece, tokens = tokens[: self.shard_tokens - self.tokens], tokens[self.shard_tokens - self.tokens :]
            data = piece.astype(self.dtype, copy=False).tobytes()
            self._file.write(data)
            self._sha.update(data)
            self.tokens += len(piece)
            self.documents += int(np.count_nonzero(piece == self.eos_id))
            if self.tokens == self.shard_tokens:
                finished.append(self._finish())
        return finished

    def sync(self) -> None:
        """Make the partial's bytes durable before the manifest says how many there are."""
        if self._file is not None:
            self._file.flush()
            os.fsync(self._file.fileno())

    def close(self) -> list[ShardInfo]:
        """At the end of the corpus: the partial, if it holds anything, becomes the split's last shard."""
        return [self._finish()] if self.tokens else []

    def _finish(self) -> ShardInfo:
        assert self._file is not None
        self.sync()
        self._file.close()
        self._file = None
        name = shard_name(self.split, self.index)
        info = ShardInfo(
            name=name, split=self.split, tokens=self.tokens, documents=self.documents, sha256=self._sha.hexdigest()
        )
        os.replace(self._partial, self.folder / name)
        fsync_dir(self.folder)
        self.index, self.tokens, self.documents = self.index + 1, 0, 0
        self._sha = hashlib.sha256()
        return info


def restore_partial(folder: Path, split: Split, state: dict, itemsize: int) -> None:
    """Put a split's partial shard back to its committed length before resuming.

    Past the last commit the run may have filled the partial and renamed it to its final name (not yet in the
    manifest), or written more: both are cut back. Later shard files of the split are removed by the caller.
    """
    name = shard_name(split, state["index"])
    partial, final = folder / (name + PARTIAL_SUFFIX), folder / name
    if not partial.exists() and final.exists():
        os.replace(final, partial)
    size = state["tokens"] * itemsize
    if not size:
        partial.unlink(missing_ok=True)
        return
    if not partial.is_file() or partial.stat().st_size < size:
        raise UserError(
            f"{folder}: {partial.name} is missing or shorter than the manifest says; the folder was "
            f"changed by hand, delete it and run `dlx prepare` again"
        )
    with open(partial, "r+b") as f:
        f.truncate(size)
        f.flush()
        os.fsync(f.fileno())
