"""HSDP (`parallel.strategy hsdp`, `parallel.dp_replicate`) on 4 gloo CPU ranks: FSDP2 on a 2 × 2 mesh (replicated
across 2 groups, sharded within each) trains like one process, and its DCP checkpoint resumes in one FSDP process."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_parallel import (
    LOSS_TOLERANCE,
    RUN,
    final_weights,
    max_difference,
    resumable_copy,
    torchrun,
)

from dlx.train.launch import launch
from train_helpers import losses, train_quietly

HSDP_TOLERANCE = 1e-4
pytestmark = [pytest.mark.distributed, pytest.mark.slow]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("hsdp")
    reference = train_quietly(RUN, root / "reference")
    layout = ["--parallel.strategy", "hsdp", "--parallel.dp_replicate", "2"]
    result, _ = torchrun(["pretrain", *RUN, *layout, "--run-dir", str(root / "hsdp")], root, nproc=4)
    assert result.returncode == 0, result.stderr[-6000:]
    assert "world size = 4" in result.stdout
    return {"reference": reference, "hsdp": root / "hsdp"}


def test_hsdp_2x2_trains_like_one_process(runs):
    expected, got = losses(runs["reference"]), losses(runs["hsdp"])
    assert sorted(got) == [1, 2, 3]
    assert max(abs(got[step] - expected[step]) for step in expected) <= HSDP_TOLERANCE, (got, expected)
    assert max_difference(final_weights(runs["hsdp"]), final_weights(runs["reference"])) <= HSDP_TOLERANCE


@pytest.mark.usefixtures("in_process_training")
def test_hsdp_checkpoint_resumes_in_one_fsdp_process(runs, tmp_path):
    run_dir = resumable_copy(runs["hsdp"], tmp_path)
    assert launch(None, ["--parallel.strategy", "fsdp", "--parallel.dp_replicate", "1"], run_dir, resume=True) == 0
    assert abs(losses(run_dir)[3] - losses(runs["reference"])[3]) <= LOSS_TOLERANCE
    assert max_difference(final_weights(run_dir), final_weights(runs["reference"])) <= HSDP_TOLERANCE
