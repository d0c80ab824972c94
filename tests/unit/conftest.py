"""The unit tier: no test here starts a process or runs a training step, so the tier is the quick loop
(`make unit`). The guard below fails a test that does either, in its fixtures too (a module-scoped fixture is set up
inside its first test's protocol), naming the tier the test belongs to instead."""

from __future__ import annotations

import multiprocessing.process
import os
import subprocess
from pathlib import Path

import pytest

UNIT = Path(__file__).parent
MOVE = "unit tests start no process and run no training step: this test belongs in tests/integration/"


def _refuse(*_args, **_kwargs):
    raise AssertionError(MOVE)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Process starts (subprocess, multiprocessing, fork, posix_spawn) and the micro-steps of a training step
    (`accumulate_gradients`, which `dlx pretrain`, `dlx bench` and `dlx tune` all run) raise, from the test's first
    fixture to its last teardown. (pytest calls this hook for every item of the session: the guard keeps to this
    folder's.)"""
    if not Path(item.path).is_relative_to(UNIT):
        yield
        return
    import dlx.bench.measure
    import dlx.train.loop.accumulate
    import dlx.train.loop.trainer

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(subprocess.Popen, "__init__", _refuse)
        patch.setattr(multiprocessing.process.BaseProcess, "start", _refuse)
        patch.setattr(os, "fork", _refuse)
        patch.setattr(os, "posix_spawn", _refuse)
        for module in (dlx.train.loop.accumulate, dlx.train.loop.trainer, dlx.bench.measure):
            patch.setattr(module, "accumulate_gradients", _refuse)
        yield
