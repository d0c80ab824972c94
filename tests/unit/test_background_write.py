"""checkpoint.async's background write yields the CPU: the thread that writes lowers its own priority, and only its
own (the training step's threads keep theirs)."""

from __future__ import annotations

import os
import sys
import threading

import pytest

from dlx.parallel.dcp import _yielding_writer, lower_thread_priority


@pytest.mark.skipif(sys.platform != "linux", reason="per-thread priorities are Linux's")
def test_the_writing_thread_alone_drops_to_the_lowest_priority():
    seen: dict[str, int] = {}

    def write() -> None:
        lower_thread_priority()
        seen["writer"] = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

    before = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    thread = threading.Thread(target=write)
    thread.start()
    thread.join()
    assert seen["writer"] == 19
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == before  # this thread: unchanged


def test_the_async_save_writes_through_the_yielding_writer(tmp_path):
    from torch.distributed.checkpoint import FileSystemWriter

    writer = _yielding_writer(tmp_path)
    assert isinstance(writer, FileSystemWriter) and type(writer).write_data is not FileSystemWriter.write_data
