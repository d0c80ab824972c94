"""MetricsLogger: valid JSON lines, main rank only, torn lines, resume, TensorBoard missing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dlx.errors import UserError
from dlx.metrics.logger import MetricsLogger, read_jsonl


def test_writes_one_valid_json_line_per_record(tmp_path: Path) -> None:
    with MetricsLogger(tmp_path) as logger:
        logger.log({"step": 1, "loss": 3.0, "mfu": None})
        logger.log({"step": 2, "loss": float("nan")})  # written as null: strict JSON has no NaN
        logger.log_eval({"step": 2, "loss": 2.9, "perplexity": 18.17})
        assert len(read_jsonl(tmp_path / "metrics.jsonl")) == 2  # flushed before close
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line) for line in lines] == [{"step": 1, "loss": 3.0, "mfu": None}, {"step": 2, "loss": None}]
    assert read_jsonl(tmp_path / "eval.jsonl") == [{"step": 2, "loss": 2.9, "perplexity": 18.17}]


def test_non_main_rank_writes_nothing(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    logger = MetricsLogger(run_dir, is_main=False)
    logger.log({"step": 1})
    logger.log_eval({"step": 1})
    logger.close()
    assert not run_dir.exists()


def test_torn_line_is_skipped_and_resume_drops_later_steps(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step":1}\n{"step":2}\n{"step":3}\n{"st')  # crashed mid-write after step 3
    assert read_jsonl(path) == [{"step": 1}, {"step": 2}, {"step": 3}]
    with MetricsLogger(tmp_path, resume_step=2) as logger:  # resumed from the step-2 checkpoint
        logger.log({"step": 3})
    assert read_jsonl(path) == [{"step": 1}, {"step": 2}, {"step": 3}]


def test_torn_line_does_not_swallow_next_record(tmp_path: Path) -> None:
    (tmp_path / "metrics.jsonl").write_text('{"step":1}\n{"st')
    with MetricsLogger(tmp_path) as logger:
        logger.log({"step": 2})
    assert read_jsonl(tmp_path / "metrics.jsonl") == [{"step": 1}, {"step": 2}]


def test_missing_tensorboard_is_one_clear_error(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    try:
        import tensorboard  # noqa: F401
    except ImportError:
        with pytest.raises(UserError, match=r"dlx\[tensorboard\]"):
            MetricsLogger(tmp_path, tensorboard=True)
    else:
        MetricsLogger(tmp_path, tensorboard=True).close()
