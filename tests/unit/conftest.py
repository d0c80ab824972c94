"""The unit tier: no test here starts a process or runs a training step, so the tier is the quick loop
(`make unit`). The guard below fails a test that does either, naming the tier it belongs to instead."""

from __future__ import annotations

import multiprocessing.process
import os
import subprocess

import pytest

MOVE = "unit tests start no process and run no training step: this test belongs in tests/integration/"


def _refuse(*_args, **_kwargs):
    raise AssertionError(MOVE)


@pytest.fixture(autouse=True)
def no_process_no_training(monkeypatch):
    """Process starts (subprocess, multiprocessing, fork, posix_spawn) and the micro-steps of a training step
    (`accumulate_gradients`, which `dlx pretrain`, `dlx bench` and `dlx tune` all run) raise."""
    monkeypatch.setattr(subprocess.Popen, "__init__", _refuse)
    monkeypatch.setattr(multiprocessing.process.BaseProcess, "start", _refuse)
    monkeypatch.setattr(os, "fork", _refuse)
    monkeypatch.setattr(os, "posix_spawn", _refuse)
    import dlx.bench.measure
    import dlx.train.loop.accumulate
    import dlx.train.loop.trainer

    for module in (dlx.train.loop.accumulate, dlx.train.loop.trainer, dlx.bench.measure):
        monkeypatch.setattr(module, "accumulate_gradients", _refuse)
