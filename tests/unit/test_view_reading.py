"""`dlx view`'s reading of run folders: lines as they grow, torn and rewritten files, envelopes that keep every spike,
goodput, the mixture per stage, the config differences, and what each argument resolves to."""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path

import numpy as np
import pytest

from dlx.metrics.logger import to_json_line
from dlx.view.columns import StepColumns
from dlx.view.envelope import bucket_starts, envelope
from dlx.view.files import LineFile
from dlx.view.page import page_html
from dlx.view.payload import Viewer
from dlx.view.sources import Problems, resolve
from dlx.view.summary import config_differences, goodput, stage_mixtures


def write_lines(path: Path, records: list[dict], mode: str = "w") -> None:
    with open(path, mode) as f:
        f.writelines(to_json_line(r) + "\n" for r in records)


def record(step: int, **fields) -> dict:
    return {"step": step, "loss": 5.0 - step / 100, "tokens": 32, "step_s": 0.5, "window_steps": 1, **fields}


def test_a_line_file_hands_back_only_what_grew(tmp_path):
    path, problems = tmp_path / "metrics.jsonl", Problems()
    reader = LineFile(str(path), "run/metrics.jsonl")
    assert reader.read_new(problems) == ([], False)
    write_lines(path, [record(1), record(2)])
    assert [r["step"] for r in reader.read_new(problems)[0]] == [1, 2]
    with open(path, "a") as f:
        f.write(to_json_line(record(3)) + "\n" + to_json_line(record(4))[:20])  # step 4 half-written
    new, reset = reader.read_new(problems)
    assert ([r["step"] for r in new], reset) == ([3], False)
    assert problems.lines == [
        "run/metrics.jsonl: its last line is cut short (a crash mid-write); the lines before it are shown"
    ]
    with open(path, "a") as f:
        f.write(to_json_line(record(4))[20:] + "\n")  # the writer finishes the line
    assert [r["step"] for r in reader.read_new(problems)[0]] == [4]
    assert problems.lines == []  # whole now


def test_a_replaced_file_is_read_again_from_its_start(tmp_path):
    """A rollback marks records abandoned by writing the file anew (rename): the reader starts over."""
    path, problems = tmp_path / "metrics.jsonl", Problems()
    write_lines(path, [record(1), record(2), record(3)])
    reader = LineFile(str(path), "m")
    reader.read_new(problems)
    write_lines(tmp_path / "new", [record(1), record(2), record(3, abandoned=True)])
    os.replace(tmp_path / "new", path)
    new, reset = reader.read_new(problems)
    assert reset and [r.get("abandoned", False) for r in new] == [False, False, True]


def test_a_line_cut_short_mid_file_is_skipped_and_named_once(tmp_path):
    path, problems = tmp_path / "metrics.jsonl", Problems()
    path.write_text(to_json_line(record(1)) + "\n" + '{"step": 2, "lo\n' + to_json_line(record(3)) + "\n")
    records, _ = LineFile(str(path), "m").read_new(problems)
    assert [r["step"] for r in records] == [1, 3]
    assert problems.lines == ["m: 1 line(s) cut short by a crash mid-write are skipped"]


def test_the_envelope_keeps_every_spike_of_a_long_series():
    values = np.full(100_000, 2.0)
    values[54_321], values[77_777] = 40.0, -3.0
    starts = bucket_starts(len(values), 1000)
    drawn = envelope(values, starts)
    assert len(starts) == 1000 and len(drawn["hi"]) == len(drawn["lo"]) == 1000
    assert max(drawn["hi"]) == 40.0 and min(drawn["lo"]) == -3.0
    assert drawn["hi"][543] == 40.0 and drawn["lo"][777] == -3.0  # in the bucket that holds it
    assert sorted(set(drawn["hi"])) == [2.0, 40.0]


def test_a_short_series_is_drawn_whole_and_nulls_stay_nulls():
    assert envelope([1.0, math.nan, 3.25], bucket_starts(3, 1000)) == {"v": [1, None, 3.25]}
    assert envelope([1.0, 1.0, 2.0, 2.0], bucket_starts(4, 2)) == {"v": [1, 2]}


def test_goodput_counts_kept_steps_over_the_wall_clock():
    """Start at t=100 after 4 s of start-up; 10 steps of 1 s each logged at 105..114, a 2 s checkpoint after step 5, a
    crash and a resume at 130 (6 s start-up), 5 more steps; one skipped update, one evaluation of 3 s."""
    columns = StepColumns()
    records = [record(s, step_s=1.0, time=104.0 + s + (2.0 if s > 5 else 0.0)) for s in range(1, 11)]
    records[6]["skipped_updates"] = [7]
    records += [record(s, step_s=1.0, time=126.0 + s) for s in range(11, 16)]
    columns.add(records)
    events = [
        {"event": "start", "step": 0, "time": 104.0, "startup_s": 4.0},
        {"event": "checkpoint", "step": 5, "save_s": 2.0, "time": 111.0},
        {"event": "resume", "step": 10, "time": 126.0, "startup_s": 6.0},
    ]
    result = goodput(columns, events, [{"step": 10, "eval_s": 3.0}], [])
    assert result["wall_s"] == 141.0 - 100.0
    assert result["productive_s"] == 15.0 - 1.0
    assert result["goodput"] == pytest.approx(14.0 / 41.0)
    assert result["lost"]["restarts"] == 126.0 - 116.0  # from step 10's record to the resume
    assert result["lost"]["checkpoints"] == 2.0 and result["lost"]["evaluation"] == 3.0
    assert result["lost"]["skipped updates"] == 1.0
    assert result["counts"] == {
        "checkpoints": 1,
        "evaluation": 1,
        "tasks": 0,
        "restarts": 1,
        "rolled back": 0,
        "skipped updates": 1,
    }
    assert sum(result["lost"].values()) + result["productive_s"] == pytest.approx(result["wall_s"])


def test_records_without_time_have_no_goodput():
    columns = StepColumns()
    columns.add([record(1), record(2)])
    assert "missing" in goodput(columns, [], [], [])


def test_the_mixture_per_stage_is_requested_against_realised():
    """Stage 0 asks a:b = 1:3, stage 1 (from step 3) asks 1:1; the tokens each source supplied are cumulative."""
    columns = StepColumns()
    columns.add(
        [
            record(1, stage=0, source_tokens={"a": 8, "b": 24}),
            record(2, stage=0, source_tokens={"a": 16, "b": 48}),
            record(3, stage=1, source_tokens={"a": 32, "b": 64}),
            record(4, stage=1, source_tokens={"a": 48, "b": 80}),
        ]
    )
    config = {"data": {"mix": {"/x/a": 1, "/x/b": 3}, "stages": [{"until": 2}, {"mix": {"/x/a": 1, "/x/b": 1}}]}}
    stages = stage_mixtures(config, columns)
    assert [(s["stage"], s["steps"]) for s in stages] == [(0, [1, 2]), (1, [3, 4])]
    assert stages[0]["sources"] == [
        {"name": "a", "requested": 0.25, "realised": 0.25, "tokens": 16},
        {"name": "b", "requested": 0.75, "realised": 0.75, "tokens": 48},
    ]
    assert stages[1]["sources"] == [
        {"name": "a", "requested": 0.5, "realised": 0.5, "tokens": 32},
        {"name": "b", "requested": 0.5, "realised": 0.5, "tokens": 32},
    ]


def test_task_metrics_are_drawn_without_their_standard_errors(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    write_lines(run / "metrics.jsonl", [record(s, time=100.0 + s) for s in (1, 2, 3, 4)])
    tasks = [{"step": s, "hellaswag/acc": 0.25 + s / 100, "hellaswag/acc_stderr": 0.01, "tasks_s": 9.0} for s in (2, 4)]
    write_lines(run / "tasks.jsonl", tasks)
    viewer = Viewer([str(run)])
    viewer.refresh()
    drawn = viewer.payload()["runs"][0]["tasks"]
    assert drawn["series"] == {"hellaswag/acc": {"v": [0.27, 0.29]}}
    assert drawn["x"]["step"] == [2, 4] and drawn["x"]["tokens"] == [64, 128]


def test_abandoned_records_are_not_drawn_but_counted_lost():
    columns = StepColumns()
    columns.add([record(1), record(2, abandoned=True, window_steps=4), record(2)])
    assert list(columns.step) == [1, 2] and columns.abandoned_steps == 4 and columns.abandoned_s == 2.0


def test_config_differences_name_each_key_that_differs_from_the_first_run():
    first = {"train": {"lr": 0.003, "max_steps": 20}, "data": {"mix": {"a": 1}}}
    second = {"train": {"lr": 0.001, "max_steps": 20}, "data": {"mix": {"a": 2}}}
    assert config_differences([first, second, {}]) == [
        {"key": "data.mix", "values": ['{"a": 1}', '{"a": 2}', None]},
        {"key": "train.lr", "values": ["0.003", "0.001", None]},
        {"key": "train.max_steps", "values": ["20", "20", None]},
    ]


def test_a_folder_of_runs_means_all_of_them_and_a_missing_one_is_one_line(tmp_path):
    for name in ("b", "a"):
        (tmp_path / "runs" / name).mkdir(parents=True)
        (tmp_path / "runs" / name / "config.yaml").write_text("train: {lr: 0.1}\n")
    (tmp_path / "runs" / "notes").mkdir()
    tune = {"candidates": [], "winner": {}}
    (tmp_path / "runs" / "tuned.json").write_text(json.dumps(tune))
    problems = Problems()
    places = resolve([str(tmp_path / "runs"), str(tmp_path / "nothing")], problems)
    assert [(p.name, p.kind) for p in places] == [("a", "run"), ("b", "run"), ("tuned", "tune")]
    assert problems.lines == [
        f"{tmp_path / 'nothing'}: no run folder (config.yaml or metrics.jsonl) and no `dlx tune` output there; it is "
        "left out (pass a run folder, a folder of runs or a tune OUT.json)"
    ]


def test_a_run_without_metrics_is_shown_with_one_line_that_goes_once_it_logs(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("train: {lr: 0.1}\n")
    viewer = Viewer([str(run)])
    viewer.refresh()
    assert viewer.problems.lines == [f"{run}: no metrics.jsonl (no step logged yet, or not a run folder); its other "
                                     "files are shown"]  # fmt: skip
    assert viewer.payload()["runs"][0]["status"]["has_metrics"] is False
    write_lines(run / "metrics.jsonl", [record(1, time=5.0)])
    viewer.refresh()
    assert viewer.problems.lines == [] and viewer.payload()["runs"][0]["status"]["last_step"] == 1


def test_the_page_loads_nothing_and_its_data_cannot_end_its_script():
    """No element of the page points elsewhere (the browser test checks that it requests nothing)."""
    html = page_html({"runs": [], "tunes": [], "config_diff": [], "problems": ["</script><b>x"], "refresh_s": None})
    assert re.findall(r"<(?:script|link|img)[^>]*\b(?:src|href)=\"(?!data:)", html) == []
    assert "</script><b>" not in html and html.count("</script>") == 3
