"""The staged loader with worker processes: the same batches as in-process across every boundary (the next stage's
workers started ahead of it, the previous stage's closed in the background), and no worker left once it is closed."""

from __future__ import annotations

import psutil
import torch

from dlx.train.build.data import build_train_loader
from stage_helpers import counting_sources, loader_recipe, read_steps

STAGES = [{"until": 3}, {"until": 6, "mix": {"big": 1.0, "small": 3.0}, "seq_len": 16}, {"seq_len": 4}]


def test_workers_read_the_in_process_batches_and_exit(tmp_path):
    folders = counting_sources(tmp_path)
    in_process = build_train_loader(loader_recipe(folders, STAGES, 10), torch.device("cpu"))
    workers = build_train_loader(loader_recipe(folders, STAGES, 10, workers=1), torch.device("cpu"))
    seen = set()
    expected = read_steps([in_process], 10)
    for step in range(10):
        assert read_steps([workers], 1) == [expected[step]]
        seen |= set(workers.worker_pids)
    assert len(seen) >= 3  # each stage its own worker
    workers.close()
    assert not [pid for pid in seen if psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie"]
    hashed = workers.verify_read_shards()  # what the workers' background had not confirmed yet: hashed here
    assert {str(folders[name] / "train-00000.bin") for name in ("big", "small")} >= set(hashed)
