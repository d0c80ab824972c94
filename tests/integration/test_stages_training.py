"""data.stages in training (one process, CPU fp32): a resume at any step across the boundaries, a RoPE change and a
seq_len change included, equals the uninterrupted run bit for bit; a stage appended to a finished run (staged, or
plain data.path or data.mix) continues as the run with the long list would; a changed stage that has begun is one
line and leaves the run folder as it was; what the run records of its stages (records, events, report.md)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dlx.errors import UserError
from dlx.train.launch import launch
from stage_helpers import cut_at, two_sources
from train_helpers import TINY, losses, run_cli

pytestmark = pytest.mark.usefixtures("in_process_training")

LONG = [
    {"until": 3},
    {"until": 5, "mix": {"code": 0.3, "prose": 0.7}, "seq_len": 32},
    {"seq_len": 8, "rope_theta": 2e4},
]
"""Stage 0: data.mix (code alone), 16 tokens; stage 1: both, 32 tokens; stage 2: 8 tokens and another RoPE base."""
SHORT = [LONG[0], {key: value for key, value in LONG[1].items() if key != "until"}]
"""LONG's first two stages, as a run that ends with the second writes them: the last stage runs to the end."""
CONSTANT_LR = ["--train.schedule", "wsd", "--train.decay_ratio", "0", "--train.warmup_ratio", "0"]
"""A schedule that does not depend on train.max_steps: an appended run's losses equal the long run's."""


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> dict[str, Path]:
    return two_sources(tmp_path_factory.mktemp("sources"))


def args(sources: dict[str, Path], stages: list[dict] | None, steps: int, *extra: str) -> list[str]:
    argv = [*TINY, "--train.max_steps", str(steps), "--data.num_workers", "0", "--checkpoint.every", "1"]
    argv += ["--checkpoint.keep_last", "20", "--data.mix", f"{sources['code']}=1", *extra]
    if stages is not None:
        named = [dict(s, mix={str(sources[k]): w for k, w in s["mix"].items()}) if "mix" in s else s for s in stages]
        argv += ["--data.stages", json.dumps(named)]
    return argv


def train(run_dir: Path, argv: list[str], resume: bool = False) -> Path:
    assert launch(None, argv, run_dir, resume) == 0
    return run_dir


@pytest.fixture(scope="module")
def whole(sources, tmp_path_factory) -> Path:
    """The uninterrupted 8-step run with the long list, report.md included."""
    from train_helpers import train_quietly

    return train_quietly(
        args(sources, LONG, 8, "--eval.every", "4", "--eval.batches", "2"), tmp_path_factory.mktemp("w") / "run"
    )


@pytest.mark.parametrize("step", [3, 4, 5, 6])
def test_a_resume_at_any_step_across_the_boundaries_is_bit_identical(sources, whole, tmp_path, step):
    resumed = train(
        cut_at(whole, step, tmp_path / "run"), args(sources, LONG, 8, "--eval.every", "4", "--eval.batches", "2"), True
    )
    assert losses(resumed) == losses(whole)
    assert evaluations(resumed) == evaluations(whole)  # at each stage's seq_len, weighted by its mixture


def evaluations(run_dir: Path) -> list[dict]:
    records = [json.loads(line) for line in (run_dir / "eval.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k != "eval_s"} for r in records]


def test_the_run_records_its_stages(whole):
    records = [json.loads(line) for line in (whole / "metrics.jsonl").read_text().splitlines()]
    assert [r["stage"] for r in records] == [0, 0, 0, 1, 1, 2, 2, 2]
    assert set(records[3]["stage_tokens"]) == {"code", "prose"} and sum(records[3]["stage_tokens"].values()) == 32
    stage_ends = (records[2], records[4], records[7])
    expected = {name: sum(r["stage_tokens"].get(name, 0) for r in stage_ends) for name in ("code", "prose")}
    assert records[-1]["source_tokens"] == expected and sum(expected.values()) == 8 * 32
    events = [json.loads(line) for line in (whole / "events.jsonl").read_text().splitlines()]
    starts = [e for e in events if e["event"] == "stage"]
    assert [(e["step"], e["stage"], e["seq_len"], e["micro_batch_size"]) for e in starts] == [
        (1, 0, 16, 2),
        (4, 1, 32, 1),
        (6, 2, 8, 4),
    ]
    assert starts[1]["mix"] == {"code": 0.3, "prose": 0.7} and starts[2]["rope_theta"] == 2e4
    ends = [e for e in events if e["event"] == "stage_end"]
    assert [(e["step"], sum(e["source_tokens"].values())) for e in ends] == [(3, 96), (5, 64), (8, 96)]
    weights = json.loads((whole / "checkpoints" / "step-00000008" / "model_args.json").read_text())
    assert weights["rope_theta"] == 2e4  # the RoPE in force, for export-hf and generate


def test_a_stage_appended_to_a_finished_run_continues_as_the_long_run(sources, tmp_path):
    long = train(tmp_path / "long", args(sources, LONG, 8, *CONSTANT_LR))
    short = train(tmp_path / "short", args(sources, SHORT, 5, *CONSTANT_LR))  # its last stage runs to step 5
    train(short, args(sources, LONG, 8, *CONSTANT_LR), resume=True)
    assert losses(short) == losses(long)


def test_a_plain_run_is_a_one_stage_run_that_stages_append_to(sources, tmp_path):
    staged = [{"until": 3}, *LONG[1:]]
    long = train(tmp_path / "long", args(sources, staged, 8, *CONSTANT_LR))
    plain = train(tmp_path / "plain", args(sources, None, 3, *CONSTANT_LR))  # data.mix, no stages
    train(plain, args(sources, staged, 8, *CONSTANT_LR), resume=True)
    assert losses(plain) == losses(long)


def test_a_plain_data_path_run_continues_in_stages(sources, tmp_path):
    """Its first stage reads data.path in the single dataset's own order, as the plain run did."""
    base = [
        *TINY,
        "--data.num_workers",
        "0",
        "--checkpoint.every",
        "1",
        *CONSTANT_LR,
        "--data.path",
        str(sources["code"]),
    ]
    stages = json.dumps([{"until": 3}, {"mix": {str(sources["code"]): 0.5, str(sources["prose"]): 0.5}}])
    longer = ["--train.max_steps", "6", "--data.stages", stages]
    long = train(tmp_path / "long", [*base, *longer])
    plain = train(tmp_path / "plain", [*base, "--train.max_steps", "3"])
    train(plain, [*base, *longer], resume=True)
    assert losses(plain) == losses(long) and len(losses(long)) == 6


def test_a_changed_stage_that_has_begun_is_one_line_and_changes_nothing(sources, tmp_path):
    run = train(tmp_path / "run", args(sources, SHORT, 5, *CONSTANT_LR))
    before = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}
    changed = [LONG[0], dict(LONG[1], mix={"code": 0.5, "prose": 0.5}), LONG[2]]
    with pytest.raises(UserError) as caught:
        launch(None, args(sources, changed, 8, *CONSTANT_LR), run, True)
    assert str(caught.value).startswith(
        "--resume: data.stages[1] differs from the stage the run trained with from step 4"
    )
    assert "mix was [['code', 0.3], ['prose', 0.7]], now [['code', 0.5], ['prose', 0.5]]" in str(caught.value)
    assert {p.name: p.read_bytes() for p in run.iterdir() if p.is_file() and p.name != "writer.lock"} == {
        k: v for k, v in before.items() if k != "writer.lock"
    }
    moved = [dict(LONG[0], until=2), *LONG[1:]]
    with pytest.raises(UserError, match=r"data.stages\[0\] ended at step 3 in the run, but until '2' now ends it"):
        launch(None, args(sources, moved, 8, *CONSTANT_LR), run, True)


def test_a_bad_stage_on_the_command_line_is_one_line_and_exit_2(sources, tmp_path):
    bad = [{"until": 3}, {"until": 2, "seq_len": 32}, {}]
    result = run_cli(["pretrain", *args(sources, bad, 8), "--run-dir", str(tmp_path / "run")], tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "error: data.stages[1].until 2 ends the stage at step 2, but it must end after step 3 (every stage takes at "
        "least one step and the last one runs to train.max_steps)"
    ]
    assert not (tmp_path / "run").exists()


@pytest.mark.report
def test_report_md_shows_each_stage_s_requested_and_realised_mixture(sources, tmp_path):
    run = train(tmp_path / "run", args(sources, LONG, 8, "--eval.every", "5", "--eval.batches", "2"))
    report = (run / "report.md").read_text()
    section = report[report.index("## Stages") :].split("\n## ")[0]
    rows = [line for line in section.splitlines() if line.startswith("| 1 ") or line.startswith("| 2 ")]
    assert rows[0].startswith("| 1 | 4-5 | 32 | code | 30.00% | ")
    assert rows[1].startswith("| 1 | 4-5 | 32 | prose | 70.00% | ")
    evaluated = json.loads((run / "eval.jsonl").read_text().splitlines()[0])
    assert rows[0].endswith(f"| {evaluated['source_loss']['code']:.4f} | {evaluated['source_bpb']['code']:.4f} |")
    assert "Stages = 3 (data.stages); tokens per step = 32 in each" in report
