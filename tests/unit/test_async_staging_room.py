"""checkpoint.async's writer process reads the staged state from /dev/shm: where /dev/shm cannot hold twice that state
(a full tmpfs ends a process with SIGBUS) the save keeps DCP's writer thread and says so once, naming the fix."""

from __future__ import annotations

import os
from types import SimpleNamespace

import torch

from dlx.parallel import dcp


def state(numel: int) -> dict:
    return {"model": {"w": torch.zeros(numel)}, "optim": {"state": {"w": {"exp_avg": torch.zeros(numel)}}}}


def fake_statvfs(free_bytes: int):
    return lambda path: SimpleNamespace(f_bavail=free_bytes // 4096, f_frsize=4096)


def test_staging_fits_where_shm_holds_twice_the_state(monkeypatch, capsys) -> None:
    monkeypatch.setattr(dcp, "_background", {})
    monkeypatch.setattr(os, "statvfs", fake_statvfs(1 << 30))
    assert dcp._staging_fits(state(1 << 20))  # 8 MiB staged, 1 GiB free
    assert capsys.readouterr().err == ""


def test_too_small_shm_keeps_the_thread_and_says_why_once(monkeypatch, capsys) -> None:
    monkeypatch.setattr(dcp, "_background", {})
    monkeypatch.setattr(os, "statvfs", fake_statvfs(12 << 20))
    assert not dcp._staging_fits(state(1 << 20))  # 8 MiB staged needs 16 MiB; 12 MiB free
    assert not dcp._staging_fits(state(1 << 20))
    lines = capsys.readouterr().err.splitlines()
    assert lines == [
        "checkpoint.async: /dev/shm has 0.01 GB free for 0.01 GB of staged state; the write runs in a thread of this "
        "process (slower steps after a save); give the container a larger --shm-size for a separate writer process"
    ]


def test_the_writer_start_stages_nothing_and_decides_nothing(monkeypatch, capsys) -> None:
    monkeypatch.setattr(dcp, "_background", {})
    monkeypatch.setattr(os, "statvfs", fake_statvfs(12 << 20))
    assert dcp._staging_fits({})  # the empty save that starts the writer process
    assert not dcp._staging_fits(state(1 << 20))  # the first real save still finds /dev/shm too small
    assert "checkpoint.async: /dev/shm has" in capsys.readouterr().err
