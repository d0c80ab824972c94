"""DCP shards written around the page cache (`dlx.parallel.direct_write`): the bytes and offsets are a buffered
file's, whatever the sizes written; where the filesystem refuses O_DIRECT the file is an ordinary one; a DCP
checkpoint written this way loads as written."""

from __future__ import annotations

import errno
import os
import random
from pathlib import Path

import pytest
import torch

from dlx.parallel.direct_write import BUFFER_BYTES, DirectStream, direct_writer, open_direct

pytestmark = pytest.mark.skipif(not hasattr(os, "O_DIRECT"), reason="no O_DIRECT on this platform")


def direct_works(folder: Path) -> bool:
    return isinstance(open_direct(folder / "probe"), DirectStream)


def test_any_sizes_write_the_same_bytes_and_offsets_as_a_buffered_file(tmp_path):
    if not direct_works(tmp_path):
        pytest.skip(f"{tmp_path}'s filesystem refuses O_DIRECT")
    rng = random.Random(0)
    pieces = [rng.randbytes(n) for n in (1, 4095, 4097, BUFFER_BYTES - 3, 10, BUFFER_BYTES * 2 + 7, 0, 333)]
    stream = open_direct(tmp_path / "shard")
    offsets = []
    for piece in pieces:
        offsets.append(stream.tell())
        assert stream.write(memoryview(piece)) == len(piece)
        stream.flush()  # DCP flushes after every item: nothing may be written unaligned
    stream.close()
    stream.close()  # twice: DCP closes, then its context does
    assert (tmp_path / "shard").read_bytes() == b"".join(pieces)
    assert offsets == [sum(map(len, pieces[:i])) for i in range(len(pieces))]


def test_a_filesystem_without_o_direct_gets_a_buffered_file(tmp_path, monkeypatch):
    real_open = os.open

    def refusing(path, flags, *args):  # what Linux says where a filesystem takes no O_DIRECT
        if flags & os.O_DIRECT:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_open(path, flags, *args)

    monkeypatch.setattr(os, "open", refusing)
    stream = open_direct(tmp_path / "shard")
    assert not isinstance(stream, DirectStream)
    stream.write(b"abc")
    stream.close()
    assert (tmp_path / "shard").read_bytes() == b"abc"


def test_a_dcp_checkpoint_written_around_the_cache_loads_as_written(tmp_path):
    import torch.distributed.checkpoint as dcp

    torch.manual_seed(0)
    state = {"w": torch.randn(300, 257), "b": torch.randn(7, dtype=torch.bfloat16), "meta": {"step": 3}}
    dcp.save(state, storage_writer=direct_writer(tmp_path / "ckpt"), no_dist=True)
    back = {"w": torch.zeros(300, 257), "b": torch.zeros(7, dtype=torch.bfloat16), "meta": {"step": 0}}
    dcp.load(back, checkpoint_id=tmp_path / "ckpt", no_dist=True)
    assert torch.equal(back["w"], state["w"]) and torch.equal(back["b"], state["b"]) and back["meta"]["step"] == 3
