"""data.stages on paper: `until`'s grammar, the recipe's one-line refusals, the resolved plan (ends, equal tokens per
step, RoPE, each source's number and carried draws), and what a resume may change (`check_saved_stages`)."""

from __future__ import annotations

import numpy as np
import pytest

from dlx.data.mixture.order import MixOrder, MixWindows
from dlx.data.stages import StageSpan, Until, check_saved_stages, parse_until
from dlx.errors import UserError
from dlx.train.build.stages import resolve_stages
from dlx.train.config import build_config

BASE = {"model": {"preset": "debug"}, "data": {"seq_len": 64, "micro_batch_size": 4}, "train": {"max_steps": 100}}


def config(stages: list[dict], **sections) -> object:
    raw = {key: dict(value) for key, value in BASE.items()}
    for section, values in sections.items():
        raw[section] = {**raw.get(section, {}), **values}
    raw["data"] = {**raw["data"], "mix": {"/data/zh": 3.0, "/data/en": 1.0}, "stages": stages}
    return build_config(raw)


def refusal(stages: list[dict], **sections) -> str:
    with pytest.raises(UserError) as caught:
        config(stages, **sections)
    assert "\n" not in str(caught.value)
    return str(caught.value)


@pytest.mark.parametrize(
    ("written", "until"),
    [
        (12000, Until("step", 12000)),
        ("12000", Until("step", 12000)),
        ("40B", Until("tokens", 40e9)),
        ("1.5T", Until("tokens", 1.5e12)),
        ("500M", Until("tokens", 500e6)),
        ("12k", Until("tokens", 12e3)),
        ("80%", Until("share", 0.8)),
        ("decay", Until("decay")),
    ],
)
def test_until_takes_a_step_tokens_a_share_or_decay(written, until):
    assert parse_until(written) == until


@pytest.mark.parametrize("written", [0, -3, "0%", "100%", "12 apples", "40b", True, "decays"])
def test_an_until_that_is_none_of_them_is_refused_with_the_syntax(written):
    with pytest.raises(ValueError, match="until takes a step"):
        parse_until(written)


def test_a_token_count_ends_with_the_step_that_reaches_it():
    assert Until("tokens", 1000).last_step(100, 256, None) == 4  # 3 steps hold 768 tokens, 4 hold 1,024
    assert Until("share", 0.8).last_step(1001, 1, None) == 801
    assert Until("decay").last_step(100, 1, decay_begins=81) == 80
    with pytest.raises(ValueError, match=r"needs train\.schedule wsd"):
        Until("decay").last_step(100, 1, None)


@pytest.mark.parametrize(
    ("stages", "sections", "message"),
    [
        (
            [{"until": 10}, {"until": 20}],
            {},
            "data.stages[1].until: the last stage runs to train.max_steps; leave it out",
        ),
        ([{"until": 10}, {}, {}], {}, "data.stages[1].until is missing"),
        ([{"until": 10, "rope_theta": 1e6}, {}], {}, "data.stages[0]: the first stage's RoPE is the model's"),
        ([{"until": 10}, {}], {"train": {"max_steps": None}}, "data.stages needs train.max_steps"),
        ([{"until": 10}, {"seq_len": 4096}], {}, "data.stages[1].seq_len (4096) exceeds model.max_seq_len (128)"),
        ([{"until": "ten"}, {}], {}, "data.stages[0].until: 'ten': until takes a step"),
        ([{"until": 10}, {"lr": 1}], {}, "unknown key 'data.stages[1].lr'; a stage takes until, mix, seq_len"),
        ([{"until": 10}, {"rope_scaling": {"rope_type": "yarn"}}], {}, "data.stages[1].rope_scaling.factor"),
        ([{"until": 10}, {"mix": {"/data/x": 0}}], {}, "data.stages[1].mix: the weight of /data/x is 0"),
    ],
)
def test_a_bad_stage_is_one_line_naming_its_key(stages, sections, message):
    assert message in refusal(stages, **sections)


def test_context_parallel_is_checked_at_every_stage_length():
    parallel = {"strategy": "ddp", "cp": 2}
    message = refusal([{"until": 10}, {"seq_len": 90}], parallel=parallel, train={"attention": "default"})
    assert message.startswith("recipe: data.stages[1].seq_len: data.seq_len 90 does not split into 2 × parallel.cp")


def test_ends_resolve_from_steps_tokens_shares_and_the_wsd_decay():
    train = {"schedule": "wsd", "decay_ratio": 0.2, "warmup_ratio": 0.0}
    stages = [{"until": 10}, {"until": "10k"}, {"until": "60%"}, {"until": "decay"}, {}]
    plan = resolve_stages(config(stages, train=train), dp_size=1)
    assert plan.tokens_per_step == 4 * 64
    ends = [(s.first_step, s.last_step) for s in plan.stages]
    assert ends == [(1, 10), (11, 40), (41, 60), (61, 80), (81, 100)]  # 10,000 tokens: step 40; WSD decays from 81


def test_ends_that_do_not_rise_or_reach_the_end_are_refused():
    plan_error = "data.stages[1].until 5 ends the stage at step 5, but it must end after step 10"
    with pytest.raises(UserError, match=plan_error.replace("[", r"\[").replace("]", r"\]")):
        resolve_stages(config([{"until": 10}, {"until": 5}, {}]), dp_size=1)
    with pytest.raises(UserError, match=r"it must end before train\.max_steps 100"):
        resolve_stages(config([{"until": 100}, {}]), dp_size=1)
    with pytest.raises(UserError, match=r"needs train\.schedule wsd"):
        resolve_stages(config([{"until": "decay"}, {}]), dp_size=1)


def test_a_longer_stage_keeps_the_tokens_of_a_micro_batch_or_of_the_step():
    train, model = {"grad_accum": 2}, {"max_seq_len": 512}
    stages = [{"until": 10}, {"seq_len": 128, "until": 20}, {"seq_len": 512}]
    plan = resolve_stages(config(stages, train=train, model=model), 2)
    shapes = [(s.seq_len, s.micro_batch_size, s.grad_accum) for s in plan.stages]
    assert shapes == [(64, 4, 2), (128, 2, 2), (512, 1, 1)]  # 256 tokens a micro-batch, then 512 a step per rank
    assert {s.micro_batch_size * s.grad_accum * s.seq_len * 2 for s in plan.stages} == {plan.tokens_per_step}
    shorter = resolve_stages(config([{"until": 10}, {"seq_len": 16}]), 1).stages[1]
    assert (shorter.micro_batch_size, shorter.grad_accum) == (16, 1)


def test_a_seq_len_that_does_not_divide_a_rank_s_tokens_is_refused():
    with pytest.raises(UserError, match=r"data.stages\[1\].seq_len 96: a rank's 256 tokens per step"):
        resolve_stages(config([{"until": 10}, {"seq_len": 96}]), 1)
    deepspeed = {"strategy": "deepspeed"}
    with pytest.raises(UserError, match=r"parallel\.strategy deepspeed keeps train\.grad_accum"):
        long = config(
            [{"until": 10}, {"seq_len": 512}], parallel=deepspeed, model={"max_seq_len": 512}, train={"grad_accum": 4}
        )
        resolve_stages(long, 1)


def test_sources_keep_their_numbers_and_carry_their_draws():
    stages = [{"until": 10}, {"until": 20, "mix": {"/data/code": 1.0}}, {"mix": {"/data/zh": 1.0, "/data/code": 1.0}}]
    plan = resolve_stages(config(stages), 1)
    first, second, third = plan.stages
    assert [s.name for s in first.sources] == ["en", "zh"] and first.source_ids == (0, 1)  # data.mix's order
    assert second.source_ids == (2,) and third.source_ids == (2, 1)  # code, zh: sorted by path, numbered at first sight
    assert plan.first_draws(2) == (
        10 * 4,
        plan.stage_tokens(0)["zh"] // 64,
    )  # code: all of stage 1; zh: its stage-0 draws
    assert plan.stage_tokens(0) == {"en": 640, "zh": 1920}  # 3 : 1 of 40 windows of 64 tokens
    header = "\n".join(plan.header_lines())
    assert (
        "stage 1: steps 11-20 (2,560 tokens, until 20); seq_len 64, micro-batch 4 × 1 accumulated; code 100%" in header
    )


def test_another_window_length_is_read_in_passes_of_its_own():
    plan = resolve_stages(config([{"until": 10}, {"seq_len": 32}], model={"max_seq_len": 64}), 1)
    assert plan.stages[1].source_ids == (2, 3) and plan.first_draws(1) == (0, 0)


def test_draws_carried_into_a_stage_continue_the_source_s_pass():
    """A source read for 7 draws in one stage and 13 in the next reads what one order reads in 20 draws."""
    whole = MixOrder((9,), (1.0,), 1, 1, 0, seed=3, shuffle=True)
    later = MixOrder((9,), (1.0,), 1, 1, 0, seed=3, shuffle=True, source_ids=(0,), first_draws=(7,))
    one = [int(MixWindows(whole)(p)[1][0]) for p in range(20)]
    split = one[:7] + [int(MixWindows(later)(p)[1][0]) for p in range(13)]
    assert split == one and sorted(one[:9]) == list(range(9))
    renumbered = MixOrder((9,), (1.0,), 1, 1, 0, seed=3, shuffle=True, source_ids=(5,))
    assert not np.array_equal(renumbered.permutation(0, 0), whole.permutation(0, 0))


def spans(*ends: int, content: str = "a") -> list[StageSpan]:
    firsts = [1, *(end + 1 for end in ends[:-1])]
    return [StageSpan(f, e, 1, {"until": str(e), "mix": content}) for f, e in zip(firsts, ends, strict=True)]


def described(*ends: int, content: str = "a") -> list[dict]:
    return [span.describe() for span in spans(*ends, content=content)]


def test_a_resume_may_append_stages_and_move_the_end_of_the_current_one():
    check_saved_stages(described(10, 20), spans(10, 20, 30), step=20)  # appended after a finished run
    check_saved_stages(described(10, 20), spans(10, 25, 30), step=15)  # the stage in progress ends later
    check_saved_stages(described(10, 20), spans(10, 15, 30), step=15)  # ... or where the run stands
    check_saved_stages(None, spans(10, 30), step=8)  # a run without stages: its one stage goes on
    check_saved_stages(described(10, 20), spans(12, 20, content="b"), step=0)  # nothing begun: anything


@pytest.mark.parametrize(
    ("now", "step", "message"),
    [
        (spans(10, 20, content="b"), 15, "data.stages[0] differs from the stage the run trained with from step 1"),
        (spans(12, 20), 15, "data.stages[0] ended at step 10 in the run, but until '12' now ends it at step 12"),
        (spans(10, 12, 30), 15, "data.stages[1] (until '12') now ends at step 12, before step 15"),
        (spans(10), 15, "the run trained data.stages[1] from step 11 but the recipe has 1 stage(s)"),
        (spans(5, 30), 8, "data.stages[0] (until '5') now ends at step 5, before step 8"),
    ],
)
def test_a_resume_that_changes_a_stage_that_has_begun_is_refused(now, step, message):
    saved = described(10, 20) if message != "data.stages[0] (until '5') now ends at step 5, before step 8" else None
    with pytest.raises(UserError) as caught:
        check_saved_stages(saved, now, step)
    assert message in str(caught.value)
