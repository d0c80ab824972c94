"""dlx.atomic: what is published carries the permissions open() and mkdir() give, whatever tempfile chose."""

from __future__ import annotations

import os
import stat

import pytest

from dlx.atomic import atomic_dir, atomic_write_text, process_umask


@pytest.fixture
def umask():
    """Set the process's umask for one test and restore it afterwards."""
    saved = os.umask(0o022)
    try:
        yield os.umask
    finally:
        os.umask(saved)


@pytest.mark.parametrize(("mask", "file_mode", "dir_mode"), [(0o022, 0o644, 0o755), (0o077, 0o600, 0o700)])
def test_published_files_and_folders_follow_the_umask(tmp_path, umask, mask, file_mode, dir_mode):
    umask(mask)
    assert process_umask() == mask
    atomic_write_text(tmp_path / "report.md", "text")
    with atomic_dir(tmp_path / "checkpoint") as folder:
        (folder / "model.safetensors").write_bytes(b"weights")
    assert stat.S_IMODE((tmp_path / "report.md").stat().st_mode) == file_mode
    assert stat.S_IMODE((tmp_path / "checkpoint").stat().st_mode) == dir_mode
    assert (tmp_path / "report.md").read_text() == "text"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint", "report.md"]  # no temporary name left
