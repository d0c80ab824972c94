"""The unit tier's guard holds: a process start or a training step fails the test that tries it."""

from __future__ import annotations

import subprocess
import sys

import pytest

from dlx.train.loop import trainer


def test_a_unit_test_cannot_start_a_process():
    with pytest.raises(AssertionError, match="tests/integration"):
        subprocess.run([sys.executable, "-c", "pass"], check=False)


def test_a_unit_test_cannot_run_a_training_step():
    with pytest.raises(AssertionError, match="tests/integration"):
        trainer.accumulate_gradients()
