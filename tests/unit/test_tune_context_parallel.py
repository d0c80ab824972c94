"""`dlx tune` searches parallel.cp: the layouts it enumerates, the recipe keys they set, and how the time model and the
memory estimate price a rank holding seq_len / cp tokens of every sequence."""

from __future__ import annotations

from dataclasses import replace

import pytest

from dlx.bench.tune.space import (
    Layout,
    SearchSpace,
    context_parallel_sizes,
    enumerate_layouts,
    global_batch_of,
    keep_values,
    layout_recipe,
    tensor_parallel_sizes,
)
from dlx.bench.tune.time_model import Rates, comm_bytes, layout_cost, training_shape
from dlx.metrics.communication import cp_communication_bytes
from dlx.metrics.estimate import plan_memory
from dlx.model.args import ModelArgs
from dlx.train.config import build_config

ARGS = ModelArgs(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=256)
SEQ = 64


def test_the_cp_sizes_divide_the_world_and_split_the_sequence_into_two_cp_chunks():
    assert context_parallel_sizes(1, SEQ) == (1,)
    assert context_parallel_sizes(4, SEQ) == (1, 2, 4)
    assert context_parallel_sizes(4, 12) == (1, 2)  # 12 tokens do not split into 8 chunks
    assert context_parallel_sizes(6, 12) == (1, 2, 3, 6)


def test_cp_layouts_keep_the_global_batch_over_the_replicas_and_need_a_data_parallel_strategy():
    space = SearchSpace(world_size=4, global_batch=8, tps=(1, 2), cps=(1, 2, 4), compile=(False,))
    layouts = enumerate_layouts(space)
    assert len(layouts) == len(set(layouts))
    for layout in layouts:
        dp = 4 // layout.tp
        assert dp % layout.cp == 0
        assert layout.micro_batch * layout.grad_accum * (dp // layout.cp) == 8
        assert layout.strategy != "none" or dp == 1  # cp ranks average gradients: none only at one rank of dp
    cps = {(layout.tp, layout.cp) for layout in layouts}
    assert cps == {(1, 1), (1, 2), (1, 4), (2, 1), (2, 2)}  # tp 2 leaves 2 data-parallel ranks: cp 4 does not fit
    whole_sequence = [x for x in layouts if (x.tp, x.cp) == (1, 4)]
    assert {x.micro_batch for x in whole_sequence} == {1, 2, 4, 8}  # one replica reads all 8 sequences


def test_a_cp_layout_sets_parallel_cp_and_says_so():
    layout = Layout("fsdp", 1, "none", 2, 2, False, False, "default", cp=2)
    assert layout.recipe_keys()["parallel"]["cp"] == 2
    assert layout.as_dict()["cp"] == 2
    assert ", cp 2," in layout.label()
    assert "cp" not in replace(layout, cp=1).label()
    assert layout.tokens_per_micro(SEQ) == 2 * SEQ // 2


def test_the_recipes_global_batch_counts_replicas_not_cp_ranks():
    raw = {"data": {"micro_batch_size": 4}, "train": {"grad_accum": 2}, "parallel": {"cp": 2}}
    assert global_batch_of(raw, 4) == 4 * 2 * 2
    assert keep_values(raw, ["parallel.cp"]) == {"parallel.cp": 2}
    assert keep_values({}, ["parallel.cp"]) == {"parallel.cp": 1}


def test_a_cp_layout_is_a_valid_recipe_at_its_world_size():
    raw = {"model": {"preset": "debug"}, "data": {"path": "synthetic", "seq_len": SEQ}, "train": {"max_steps": 2}}
    layout = Layout("ddp", 1, "none", 2, 2, False, False, "default", cp=2)
    config = build_config(layout_recipe(raw, layout))
    assert (config.parallel.cp, config.parallel.strategy, config.data.micro_batch_size) == (2, "ddp", 2)


def test_the_time_model_prices_a_cp_rank_at_its_share_of_each_sequence():
    rates = Rates(
        {("fp32", tokens): 1e-3 for tokens in (SEQ, 2 * SEQ)},
        memory_gbps=10.0,
        link_gbps=1.0,
        link_measured=False,
        attention_s={("default", 2): 0.02},
    )
    whole = Layout("ddp", 1, "none", 2, 2, False, False, "default")
    halved = replace(whole, cp=2)
    one, two = (layout_cost(ARGS, x, SEQ, "fp32", 4, rates) for x in (whole, halved))
    # the same matmul rate for both token counts here: half the tokens, half the seconds
    assert two.compute_s == pytest.approx(one.compute_s / 2, rel=1e-12)
    assert two.attention_s == pytest.approx(one.attention_s / 2, rel=1e-12)
    assert two.micro_s == one.micro_s  # as many micro-steps, as many kernels
    gathered = cp_communication_bytes(ARGS, training_shape(halved, SEQ, "fp32", 4, "cpu"))
    assert gathered > 0
    assert comm_bytes(ARGS, halved, SEQ, "fp32", 4) == pytest.approx(
        comm_bytes(ARGS, whole, SEQ, "fp32", 4) + gathered, rel=1e-12
    )


def test_the_memory_estimate_of_a_cp_layout_is_one_ranks():
    whole = Layout("ddp", 1, "none", 4, 1, False, False, "default")
    shape = training_shape(replace(whole, cp=2), SEQ, "fp32", 4, "cpu")
    assert shape.cp == 2
    assert plan_memory(ARGS, shape).total_gb < plan_memory(ARGS, training_shape(whole, SEQ, "fp32", 4, "cpu")).total_gb


def test_a_global_batch_only_cp_can_split_still_has_a_layout():
    """One sequence per step on 2 ranks: no data-parallel split divides it, cp 2 (one replica) does."""
    assert tensor_parallel_sizes(ARGS, 2, 1, cps=(1, 2)) == (1, 2)
    assert tensor_parallel_sizes(ARGS, 2, 1) == (2,)  # without cp only tp 2's single replica
