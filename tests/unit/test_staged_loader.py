"""The staged loader on real (tiny) datasets, in-process: a source that returns goes on with its pass, 1, 2 and 4 ranks
draw the same windows in every step across the boundaries, and a resume at any step on another world size goes on
with the windows an uninterrupted loader reads.

Each source's shards hold consecutive integers from its own offset, so a row's first token names its source and its
window at any seq_len."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from dlx.train.build.data import build_train_loader
from stage_helpers import counting_sources, loader_recipe, read_steps


@pytest.fixture
def folders(tmp_path: Path) -> dict[str, Path]:
    return counting_sources(tmp_path)


def recipe(folders: dict[str, Path], stages: list[dict], steps: int, micro: int = 2) -> object:
    return loader_recipe(folders, stages, steps, micro)


def steps_of(config, world_size: int, steps: int) -> list[list]:
    """Each optimizer step's rows over all ranks (sorted: the ranks and micro-steps split a step's windows)."""
    loaders = [build_train_loader(config, torch.device("cpu"), r, world_size) for r in range(world_size)]
    return [sorted(rows) for rows in read_steps(loaders, steps)]


def test_a_source_that_returns_goes_on_with_its_pass(folders):
    """big read in stages 0 and 2 reads, step for step, what a run of big alone reads: stage 1 (small) pauses it."""
    stages = [{"until": 4, "mix": {"big": 1.0}}, {"until": 7, "mix": {"small": 1.0}}, {"mix": {"big": 1.0}}]
    staged = steps_of(recipe(folders, stages, 15), 1, 15)
    alone = steps_of(recipe(folders, [{"mix": {"big": 1.0}}], 12), 1, 12)
    assert staged[:4] + staged[7:] == alone
    assert {name for step in staged[4:7] for name, _ in step} == {"small"}
    big = [window for step in alone for _, window in step]
    assert len(set(big)) == len(big) == 96  # one pass of its 100 windows: none twice


@pytest.mark.parametrize("world_size", [2, 4])
def test_every_world_size_draws_the_same_windows_in_every_step(folders, world_size):
    stages = [{"until": 3}, {"until": 6, "mix": {"big": 1.0, "small": 3.0}, "seq_len": 16}, {"seq_len": 4}]
    config = recipe(folders, stages, 10, micro=2 if world_size == 2 else 1)
    one = steps_of(recipe(folders, stages, 10), 1, 10)
    assert steps_of(config, world_size, 10) == one
    assert [len(step) for step in one] == [8, 8, 8, 4, 4, 4, 16, 16, 16, 16]  # 64 tokens a step in every stage


@pytest.mark.parametrize(("before", "after", "at"), [(1, 2, 3), (2, 1, 3), (2, 4, 4), (4, 1, 6), (1, 1, 9)])
def test_a_resume_at_any_step_on_any_world_size_goes_on_as_uninterrupted(folders, before, after, at):
    stages = [{"until": 3}, {"until": 6, "mix": {"big": 1.0, "small": 3.0}, "seq_len": 16}, {"seq_len": 4}]
    config = recipe(folders, stages, 12, micro=8 // before // 4 or 1)
    uninterrupted = steps_of(recipe(folders, stages, 12), 1, 12)
    loaders = [build_train_loader(config, torch.device("cpu"), r, before) for r in range(before)]
    read_steps(loaders, at)
    state = json.loads(json.dumps(loaders[0].state_dict()))
    assert all(loader.state_dict() == state for loader in loaders)
    resumed = [build_train_loader(recipe(folders, stages, 12), torch.device("cpu"), r, after) for r in range(after)]
    for loader in resumed:
        loader.load_state_dict(state, steps_done=at)
    assert [sorted(step) for step in read_steps(resumed, 12 - at)] == uninterrupted[at:]


def test_tokens_are_counted_per_stage_and_over_the_run(folders):
    stages = [{"until": 2, "mix": {"big": 1.0}}, {"mix": {"big": 1.0, "small": 1.0}}]
    loader = build_train_loader(recipe(folders, stages, 4), torch.device("cpu"))
    read_steps([loader], 3)
    assert loader.stage_source_tokens() == {"big": 32, "small": 32}
    assert loader.source_tokens() == {"big": 128 + 32, "small": 32}
    assert loader.state_dict()["stages"][1] == {
        "first_step": 3,
        "last_step": 4,
        "until": None,
        "seq_len": 8,
        "tokens_per_step": 64,
        "mix": [["big", 1.0], ["small", 1.0]],
        "rope_theta": 10000.0,
        "rope_scaling": None,
    }
