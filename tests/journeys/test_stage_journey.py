"""The anneal a user appends to a run, command by command: `dlx prepare` two corpora (the second with the first's
tokenizer), `dlx pretrain` on the first alone, then `dlx pretrain --resume` with a stage appended that anneals on the
second with replay; the run folder then tells the story (events, records, report.md) and `dlx generate` reads the
result. Each command is a real process reading what the previous one wrote."""

from __future__ import annotations

import inspect
import json
import textwrap
from pathlib import Path

import pytest

from train_helpers import run_cli

pytestmark = pytest.mark.report

RUN = ["--model.preset", "debug", "--data.seq_len", "32", "--data.micro_batch_size", "4", "--train.precision", "fp32"]
RUN += ["--train.schedule", "wsd", "--train.decay_ratio", "0", "--train.warmup_ratio", "0", "--log.every", "1"]
RUN += ["--log.progress", "false", "--eval.every", "6", "--eval.batches", "2", "--data.num_workers", "1"]


def write_jsonl(path: Path, texts: list[str]) -> Path:
    path.write_text("".join(json.dumps({"text": text}) + "\n" for text in texts))
    return path


def corpora(folder: Path) -> tuple[Path, Path]:
    """Code (a few stdlib modules' functions) and prose (their docstrings), as JSON lines."""
    import email.message
    import json as json_module

    code, prose = [], []
    for module in (json_module.decoder, json_module.encoder, textwrap, email.message):
        for name, member in inspect.getmembers(module, inspect.isfunction):
            if member.__module__ == module.__name__:
                code.append(inspect.getsource(member))
                prose.append(inspect.getdoc(member) or name)
    return write_jsonl(folder / "code.jsonl", code), write_jsonl(folder / "prose.jsonl", prose * 3)


def dlx(args: list[str], cwd: Path) -> str:
    result = run_cli(args, cwd, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def test_an_anneal_appended_to_a_finished_run(tmp_path):
    code, prose = corpora(tmp_path)
    dlx(["prepare", str(code), "--train-tokenizer", "400", "--val-documents", "3", "--out", "code"], tmp_path)
    tokenizer = ["--tokenizer", "code", "--val-documents", "3"]
    dlx(["prepare", str(prose), *tokenizer, "--out", "prose"], tmp_path)
    first = [*RUN, "--data.mix", "code=1", "--train.max_steps", "6", "--run-dir", "run"]
    dlx(["pretrain", *first], tmp_path)
    stages = json.dumps([{"until": 6}, {"mix": {"prose": 0.7, "code": 0.3}}])
    out = dlx(
        [
            "pretrain",
            *RUN,
            "--data.mix",
            "code=1",
            "--train.max_steps",
            "10",
            "--data.stages",
            stages,
            "--resume",
            "--run-dir",
            "run",
        ],
        tmp_path,
    )
    assert "stage 1 from step 7: code 30%, prose 70%, seq_len 32" in out
    run = tmp_path / "run"
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r.get("stage") for r in records] == [None] * 6 + [1] * 4  # the first run had no stages
    events = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]
    events = [e for e in events if e["event"] in ("resume", "stage", "stage_end")]  # not start, checkpoint
    assert [e["event"] for e in events] == ["resume", "stage", "stage_end"]
    assert events[1]["mix"] == {"code": 0.3, "prose": 0.7} and events[2]["step"] == 10
    evaluated = json.loads((run / "eval.jsonl").read_text().splitlines()[-1])
    assert set(evaluated["source_bpb"]) == {"code", "prose"}
    report = (run / "report.md").read_text()
    assert "| 1 | 7-10 | 32 | code | 30.00% |" in report and "| 1 | 7-10 | 32 | prose | 70.00% |" in report
    dlx(["generate", "run", "--prompt", "def ", "--max-new-tokens", "4"], tmp_path)
