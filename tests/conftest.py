"""Fixtures shared by the test files (datasets: `dataset_helpers.write_dataset`)."""

from __future__ import annotations

import signal

import pytest

from train_helpers import single_torch_thread, skip_plots

if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    # A suite started in the background of a non-interactive shell (as CI may start it) inherits SIGINT ignored, and
    # so would every command a test starts: a test that sends Ctrl-C would see nothing happen. The tests start their
    # commands as from an interactive shell; what dlx does when started with SIGINT ignored has a test of its own.
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture
def in_process_training(request, monkeypatch):
    """One torch thread (see `single_torch_thread`) and no report.md plots unless the test is marked `report`.
    A file asks for it with `pytestmark = pytest.mark.usefixtures("in_process_training")`."""
    skip_plots(request, monkeypatch)
    yield from single_torch_thread()
