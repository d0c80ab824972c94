"""A compiled run with evaluations compiles once: the training graphs at step 1, the blocks' no-gradient graph at the
first validation (a recompile named with the guard that failed, grad mode), nothing at later validations, and nothing
for lm-eval's task requests or samples, whose shapes change from call to call (they run the blocks' eager code). The
compile cache under the user's cache folder: the first run's header says cold, the next run of the same model and
shape says warm, a resume says so, and another shape is cold again. Dynamo decides guards and recompiles before any
backend runs, so the runs compile with the `eager` backend (as tests/integration/test_compile.py does)."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest
import torch
from test_hf_export import prepare_corpus

from dlx.train.launch import launch
from train_helpers import TINY

lm_eval = pytest.importorskip("lm_eval")
pytestmark = pytest.mark.usefixtures("in_process_training")
TORCH_COMPILE = torch.compile
TASK = "dlx_stdlib_next_line"


@pytest.fixture(autouse=True)
def eager_backend(monkeypatch, tmp_path):
    """torch.compile with the eager backend from a fresh Dynamo, and a cache folder of the test's own."""
    monkeypatch.setattr(torch, "compile", functools.partial(TORCH_COMPILE, backend="eager"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> Path:
    return prepare_corpus(tmp_path_factory.mktemp("prepared"), val_documents=1)


def compiled_run(prepared: Path, run_dir: Path, steps: int, *extra: str, resume: bool = False) -> int:
    options = [*TINY, "--data.path", str(prepared), "--data.num_workers", "0", "--train.compile", "true"]
    options += ["--train.max_steps", str(steps), "--checkpoint.every", "2", *extra]
    return launch(None, options, run_dir, resume=resume)


def compile_events(run_dir: Path) -> list[dict]:
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    return [event for event in events if event["event"] == "compile"]


def test_validation_compiles_once_and_tasks_and_samples_compile_nothing(prepared, tmp_path, capsys):
    run_dir = tmp_path / "run"
    extra = ["--eval.every", "2", "--eval.batches", "2", "--eval.tasks", f'["{TASK}"]', "--eval.tasks_every", "2"]
    extra += ["--eval.tasks_limit", "8", "--eval.sample_every", "2", "--eval.sample_tokens", "8"]
    extra += ["--eval.sample_prompts", '["def "]']
    assert compiled_run(prepared, run_dir, 4, *extra) == 0
    events = compile_events(run_dir)
    assert [(e["step"], e["where"], e["graphs"]) for e in events] == [
        (1, "by step 1", 2),  # the blocks' training graph and the loss's chunk math
        (2, "in the evaluation at step 2", 1),  # the blocks without gradients, once
    ]
    (recompile,) = events[1]["recompiles"]
    assert recompile["function"].startswith("forward (dlx/model/llama.py:")
    assert "grad_mode" in recompile["reason"]
    assert len((run_dir / "tasks.jsonl").read_text().splitlines()) == 2
    assert len((run_dir / "samples.jsonl").read_text().splitlines()) >= 2
    out = capsys.readouterr().out
    assert "recompiled in the evaluation at step 2: forward (dlx/model/llama.py:" in out
    assert "because 0/0: GLOBAL_STATE changed: grad_mode" in out
    assert "compile total: 3 graph(s) in" in out and ", 1 recompile(s)" in out
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [(r["step"], r.get("compiles")) for r in records] == [(1, 2), (2, None), (3, None), (4, None)]


def header_line(out: str) -> str:
    (line,) = [line for line in out.splitlines() if line.startswith("compile: ")]
    return line


def test_the_header_says_cold_then_warm_then_resumed_and_another_shape_is_cold(prepared, tmp_path, capsys):
    assert compiled_run(prepared, tmp_path / "a", 2) == 0
    cold = header_line(capsys.readouterr().out)
    assert cold.startswith("compile: cold, no cache yet for this model, shape and torch ")
    folder = Path(cold.split("kept in ")[1].split(" for the next run")[0])
    assert folder.parent == tmp_path / "cache" / "dlx" / "compile"
    marker = json.loads((folder / "dlx-compile.json").read_text())
    assert marker["torch"] == torch.__version__ and marker["first_step_compile_s"] > 0

    assert compiled_run(prepared, tmp_path / "b", 2) == 0
    warm = header_line(capsys.readouterr().out)
    assert warm.startswith(f"compile: warm, cache {folder} from a run of {marker['written']} (model, shapes and")

    assert compiled_run(prepared, tmp_path / "b", 4, resume=True) == 0
    assert header_line(capsys.readouterr().out).startswith(f"compile: warm, resumed at step 2, cache {folder} ")

    assert compiled_run(prepared, tmp_path / "c", 2, "--data.seq_len", "8") == 0
    assert header_line(capsys.readouterr().out).startswith("compile: cold, no cache yet")


def test_an_inductor_cache_folder_the_user_set_is_kept(prepared, tmp_path, monkeypatch, capsys):
    mine = tmp_path / "my-inductor-cache"
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(mine))
    assert compiled_run(prepared, tmp_path / "run", 1) == 0
    line = header_line(capsys.readouterr().out)
    assert line == f"compile: TORCHINDUCTOR_CACHE_DIR={mine} (yours; dlx does not judge it warm or cold)"
    assert not (tmp_path / "cache" / "dlx" / "compile").exists()
