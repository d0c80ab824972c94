"""Every recipe in recipes/ loads against the code; the demo recipe file is the embedded demo."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dlx.train.build.stages import resolve_stages
from dlx.train.demo import DEMO_RECIPE, demo_recipe
from dlx.train.recipe import load_recipe, read_recipe_file
from hf_helpers import LLAMA32_1B_CONFIG

RECIPES = sorted((Path(__file__).parents[2] / "recipes").glob("*.yaml"))


def test_there_are_recipes():
    assert {"demo.yaml", "debug.yaml", "llama3.2-1b.yaml"} <= {p.name for p in RECIPES}


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.name)
def test_recipe_loads(path, tmp_path):
    overrides = []
    if (read_recipe_file(path).get("model") or {}).get("init_from"):  # the shape comes from the weights' config.json
        (tmp_path / "config.json").write_text(json.dumps(LLAMA32_1B_CONFIG))
        overrides = ["--model.init_from", str(tmp_path)]
    config = load_recipe(path, overrides)
    assert config.data.seq_len <= config.model.args.max_seq_len
    plan = resolve_stages(config, dp_size=2)  # data.stages: every end, batch shape and RoPE resolve
    if plan is not None:
        assert all(stage.seq_len <= config.model.args.max_seq_len for stage in plan.stages)
        assert {s.micro_batch_size * s.grad_accum * s.seq_len * 2 for s in plan.stages} == {plan.tokens_per_step}


def test_the_stage_recipes_resolve_as_their_comments_say(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(LLAMA32_1B_CONFIG))
    folder = Path(__file__).parents[2] / "recipes"
    anneal = resolve_stages(
        load_recipe(folder / "llama3.2-1b-continue-zh-anneal.yaml", ["--model.init_from", str(tmp_path)]), 1
    )
    assert [(s.first_step, s.last_step) for s in anneal.stages] == [(1, 16000), (16001, 20000)]
    assert anneal.stages[1].weights == {"code": 0.2, "general": 0.075, "zh": 0.225, "zh-hq": 0.5}
    long = resolve_stages(load_recipe(folder / "llama3.2-1b-long-zh.yaml", ["--model.init_from", str(tmp_path)]), 2)
    shapes = [(s.seq_len, s.micro_batch_size, s.grad_accum, s.rope["rope_theta"]) for s in long.stages]
    assert shapes == [(4096, 8, 4, 500000.0), (16384, 2, 4, 2e6), (32768, 1, 4, 2e6)]
    assert long.tokens_per_step == 262_144


def test_demo_recipe_file_is_the_embedded_demo():
    path = next(p for p in RECIPES if p.name == "demo.yaml")
    assert read_recipe_file(path) == DEMO_RECIPE
    assert load_recipe(path, []).resolved() == load_recipe(None, [], base=demo_recipe(8192)).resolved()


def test_stdlib_corpora_splits_a_module_into_code_and_prose(tmp_path):
    import importlib.util

    spec = importlib.util.spec_from_file_location("stdlib_corpora", RECIPES[0].parent / "stdlib_corpora.py")
    corpora = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(corpora)
    source = (
        '"""Module doc."""\nimport os  # kept\n\n\nclass A:\n    """Class\n    doc."""\n\n    def f(self):\n'
        '        """Method doc."""\n        return os.sep\n'
    )
    code, prose = corpora.split_module(source)
    assert code == "import os  # kept\n\n\nclass A:\n\n    def f(self):\n        return os.sep\n"
    assert prose == "Module doc.\n\nClass\ndoc.\n\nMethod doc."
    assert "mixture.yaml" in {p.name for p in RECIPES}
