"""Fixtures shared by the test files (datasets: `dataset_helpers.write_dataset`)."""

from __future__ import annotations

import pytest

from train_helpers import single_torch_thread, skip_plots


@pytest.fixture
def in_process_training(request, monkeypatch):
    """One torch thread (see `single_torch_thread`) and no report.md plots unless the test is marked `report`.
    A file asks for it with `pytestmark = pytest.mark.usefixtures("in_process_training")`."""
    skip_plots(request, monkeypatch)
    yield from single_torch_thread()
