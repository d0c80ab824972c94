"""Observability: torch.profiler over chosen steps, samples during training, Weights & Biases (offline), bad input."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys

import pytest
import torch

from dlx.errors import UserError
from dlx.metrics.cuda_memory import write_snapshot_files
from dlx.metrics.profiler import ProfileWindow, StepProfiler
from dlx.metrics.timing import PhaseTimer
from dlx.train.loop.trainer import pretrain
from dlx.train.observers.base import Observer, ObserverList
from dlx.train.observers.sample import TrainingSampler, build_sampler, sample_during_training, sample_text
from dlx.train.recipe import load_recipe
from train_helpers import TINY, losses, make_dataset, run_cli

pytestmark = pytest.mark.usefixtures("in_process_training")


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return make_dataset(tmp_path_factory.mktemp("observe") / "data")


def tiny(data, *extra: str) -> list[str]:
    return [*TINY, "--data.path", str(data), "--data.num_workers", "0", *extra]


class Recorder(Observer):
    """Writes down every hook the run calls, in order; due (and works) after step 3 only."""

    def __init__(self, name: str = "recorder", fail_close: bool = False) -> None:
        self.name, self.fail_close, self.calls = name, fail_close, []

    def header(self):
        self.calls.append("header")
        return [f"{self.name}: on"]

    @contextlib.contextmanager
    def step(self, step):
        self.calls.append(f"step {step}")
        yield

    def columns(self, step):
        self.calls.append(f"columns {step}")
        return {"seen": step}

    def on_record(self, record):
        self.calls.append(f"record {record['step']} {record['seen']}")

    def on_eval(self, record):
        self.calls.append(f"eval {record['step']}")

    def due(self, step):
        return step == 3

    def between_steps(self, step):
        if self.due(step):
            self.calls.append(f"between {step}")

    def finish(self, step):
        self.calls.append(f"finish {step}")

    def on_report(self, step, verdict, files):
        self.calls.append(f"report {step} {[f.name for f in files][:1]} {verdict is not None}")

    def close(self):
        self.calls.append("close")
        if self.fail_close:
            raise RuntimeError(f"{self.name} could not close")


def test_the_loop_calls_every_hook_of_an_observer_in_its_order(tmp_path, data, monkeypatch, capsys):
    from dlx.train import run as run_module

    recorder, real = Recorder(), run_module.build_observers

    def build(*args, **kwargs):
        observers = real(*args, **kwargs)
        observers.extend([recorder])
        return observers

    monkeypatch.setattr(run_module, "build_observers", build)
    config = load_recipe(None, tiny(data, "--train.max_steps", "4", "--log.every", "2", "--eval.every", "2"))
    pretrain(config, "t", tmp_path / "run")
    assert recorder.calls == [
        "header",
        *("step 1", "columns 1", "record 1 1"),
        *("step 2", "columns 2", "record 2 2", "eval 2"),
        *("step 3", "between 3"),
        *("step 4", "columns 4", "record 4 4", "eval 4"),
        *("finish 4", "report 4 ['report.md'] True", "close"),
    ]
    assert "recorder: on" in capsys.readouterr().out
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["seen"] for r in records] == [1, 2, 4]


def test_an_observer_list_calls_in_order_and_closes_every_one():
    first, second = Recorder("first", fail_close=True), Recorder("second")
    observers = ObserverList([first, second])
    assert observers.header() == ["first: on", "second: on"]
    with observers.step(7):
        pass
    assert observers.columns(7) == {"seen": 7} and observers.due(3) and not observers.due(4)
    with pytest.raises(RuntimeError, match="first could not close"):
        observers.close()
    assert first.calls == second.calls == ["header", "step 7", "columns 7", "close"]


@pytest.mark.report
def test_the_trace_holds_the_aten_ops_of_the_profiled_steps(tmp_path, data, capsys):
    config = load_recipe(None, tiny(data, "--train.max_steps", "5", "--profile.start", "2", "--profile.steps", "2"))
    result = pretrain(config, "t", tmp_path / "run")
    out = capsys.readouterr().out
    folder = tmp_path / "run" / "profile"
    trace = json.loads((folder / "rank0-steps2-3.pt.trace.json").read_text())["traceEvents"]
    steps = {e["name"]: (e["ts"], e["ts"] + e["dur"]) for e in trace if e.get("name", "").startswith("dlx_step_")}
    assert sorted(steps) == ["dlx_step_2", "dlx_step_3"]
    aten = [e for e in trace if e.get("name", "").startswith("aten::") and e.get("ph") == "X"]
    assert {"aten::mm", "aten::_fused_adamw_"} <= {e["name"] for e in aten}
    for step, (start, end) in steps.items():  # each profiled step ran matmuls inside its own annotation
        assert any(e["name"] == "aten::mm" and start <= e["ts"] <= end for e in aten), step
    top = json.loads((folder / "rank0-top_ops.json").read_text())
    assert top["steps"] == [2, 3] and len(top["ops"]) == 15 and top["clock"] == "host time"
    assert sum(op["self_pct"] for op in top["ops"]) <= 100.0 + 1e-9
    assert top["ops"][0]["self_ms"] >= top["ops"][-1]["self_ms"]
    assert "Top 15 ops by self host time over profiled steps 2..3" in out
    # The profiled steps are named in their records and left out of the verdict and the report's summary.
    assert [r.get("profiled_steps") for r in result.records] == [None, [2], [3], None, None]
    assert "profiled steps [2]: left out of the summary" in out
    assert result.verdict.evidence["steps"] == 2  # 5 records - 1 warm-up - 2 profiled
    report = (tmp_path / "run" / "report.md").read_text()
    assert "## Profile" in report and "| `aten::mm` |" in report
    assert "Over 2 logged steps (3 warm-up or profiled record(s) left out)" in report
    # On a CPU the GPU columns are absent, and the header says why.
    assert "GPU utilisation, tensor/DRAM activity: n/a (a cpu run: NVML samples NVIDIA GPUs only)" in out
    assert not any("gpu_util_pct" in r for r in result.records)


def test_a_run_stopped_inside_the_window_writes_the_steps_it_recorded(tmp_path):
    device = torch.device("cpu")
    said = []
    profiler = StepProfiler(ProfileWindow(1, 3), tmp_path, 0, device, PhaseTimer(device), said.append)
    a = torch.randn(32, 32)
    for step in (1, 2):
        with profiler.step(step):
            a = a @ a
    assert profiler.take_profiled_steps() == [1, 2] and profiler.take_profiled_steps() == []
    assert not (tmp_path / "profile").exists()
    profiler.close()  # the run stopped after step 2
    assert (tmp_path / "profile" / "rank0-steps1-2.pt.trace.json").is_file()
    assert "over profiled steps 1..2" in said[0]
    with profiler.step(4):  # outside the window: nothing is recorded
        a = a @ a
    assert profiler.take_profiled_steps() == []


def test_memory_snapshot_files_from_a_snapshot(tmp_path):
    """The writing half of the CUDA memory snapshot, on a snapshot in the allocator's format (recording it needs a
    GPU: unmeasured here)."""
    frames = [{"filename": "/src/dlx/model/llama.py", "line": 90, "name": "forward"}]
    block = {"size": 1024, "requested_size": 1000, "address": 4096, "state": "active_allocated", "frames": frames}
    segment = {"address": 4096, "total_size": 2048, "stream": 0, "segment_type": "small", "blocks": [block]}
    snapshot = {"segments": [segment], "device_traces": [[]]}
    paths = write_snapshot_files(snapshot, tmp_path, "rank0-memory")
    assert [p.name for p in paths] == ["rank0-memory.pickle", "rank0-memory.html", "rank0-memory.folded"]
    folded = (tmp_path / "rank0-memory.folded").read_text().splitlines()  # bytes by stack; the block's rounding
    assert folded == ["stream_0;active_allocated;llama.py:90:forward 1000", "stream_0;active_allocated;<gaps> 24"]
    assert "snapshot.pickle" in (tmp_path / "rank0-memory.html").read_text()


def test_samples_appear_at_the_asked_steps_and_leave_the_losses_bit_identical(tmp_path, data, capsys):
    common = tiny(data, "--train.max_steps", "6", "--checkpoint.every", "4")
    plain = pretrain(load_recipe(None, common), "t", tmp_path / "plain")
    sampling = ["--eval.sample_every", "2", "--eval.sample_prompts", '["def ", "import json"]']
    sampled = pretrain(load_recipe(None, [*common, *sampling, "--eval.sample_tokens", "8"]), "t", tmp_path / "s")
    assert losses(tmp_path / "plain") == losses(tmp_path / "s")  # exact float equality, every step
    assert all(torch.equal(a, b) for a, b in zip(plain.model.parameters(), sampled.model.parameters(), strict=True))
    records = [json.loads(line) for line in (tmp_path / "s" / "samples.jsonl").read_text().splitlines()]
    assert [(r["step"], r["prompt"]) for r in records] == [(s, p) for s in (2, 4, 6) for p in ("def ", "import json")]
    assert all(r["text"].startswith(r["prompt"]) and r["temperature"] == 0.8 and r["seed"] == 0 for r in records)
    assert f"sample step 4 | 'import json' →\n{records[3]['text']}" in capsys.readouterr().out
    # The same code as `dlx generate`: the step-4 checkpoint continues the prompt into the same text.
    again = sample_text(tmp_path / "s" / "checkpoints" / "step-00000004", "import json", 8, 0.8, 50, None, 0, "cpu")
    assert again == records[3]["text"]


def test_sampling_restores_the_mode_and_draws_from_its_own_generator(data):
    from tokenizers import Tokenizer

    from dlx.model import Transformer, resolve_model_args

    torch.manual_seed(0)
    model = Transformer(resolve_model_args("debug"))
    sampler = TrainingSampler(Tokenizer.from_file(str(data / "tokenizer.json")), ["def "], 1, 6, 1.0, None, 7)
    before = torch.get_rng_state()
    first = sample_during_training(model, sampler, step=1)
    assert model.training and torch.equal(torch.get_rng_state(), before)
    model.eval()
    assert sample_during_training(model, sampler, step=2)[0]["text"] == first[0]["text"] and not model.training


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--eval.sample_every", "2"], "eval.sample_every is 2 but eval.sample_prompts is empty"),
        (["--eval.sample_every", "2", "--eval.sample_prompts", '["a", ""]'], r"eval.sample_prompts\[1\] is an empty"),
        (
            ["--profile.start", "4", "--profile.steps", "3"],
            r"profile.start 4 \+ profile.steps 3 run past train.max_steps 5; profile steps 4..6",
        ),
        (["--profile.steps", "-1"], "profile.steps: input should be greater than or equal to 0"),
        (["--log.wandb_project", ""], "log.wandb_project: string should have at least 1 character"),
    ],
)
def test_bad_observer_keys_are_one_line(data, extra, message):
    with pytest.raises(UserError, match=message):
        load_recipe(None, tiny(data, "--train.max_steps", "5", *extra))


def test_sampling_needs_a_tokenizer_and_a_profile_within_the_run(tmp_path):
    with pytest.raises(UserError, match=r"eval.sample_every needs a tokenizer and synthetic data has none"):
        load_recipe(None, [*TINY, "--train.max_steps", "3", "--eval.sample_every", "1", "--eval.sample_prompts", "[a]"])
    bare = make_dataset(tmp_path / "bare")
    (bare / "tokenizer.json").unlink()
    config = load_recipe(
        None, tiny(bare, "--train.max_steps", "3", "--eval.sample_every", "1", "--eval.sample_prompts", "[a]")
    )
    with pytest.raises(UserError, match=f"data.path {bare} has no tokenizer.json"):  # preflight, before any sampler
        pretrain(config, "t", tmp_path / "run")
    sampler = config.eval.model_copy(update={"sample_every": 1, "sample_prompts": ["a"]})
    with pytest.raises(UserError, match=f"eval.sample_every needs the dataset's tokenizer.json and data.path {bare}"):
        build_sampler(sampler, None, str(bare))  # the sampler's own check, for data that reach it without one
    data = make_dataset(tmp_path / "data")
    config = load_recipe(None, tiny(data, "--train.epochs", "0.01", "--profile.start", "50", "--profile.steps", "2"))
    with pytest.raises(UserError, match=r"profile.start 50 \+ profile.steps 2 run past the run's \d+ optimizer steps"):
        pretrain(config, "t", tmp_path / "run")
    assert not (tmp_path / "run").exists()


def wandb_env(tmp_path, mode: str | None) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith("WANDB_")}
    env.update(HOME=str(tmp_path / "home"), NETRC=str(tmp_path / "home" / "netrc"), WANDB_SILENT="true")
    if mode:
        env["WANDB_MODE"] = mode
    return env


def test_an_offline_wandb_run_holds_the_logged_steps(tmp_path, data, monkeypatch):
    pytest.importorskip("wandb")
    for key, value in wandb_env(tmp_path, "offline").items():
        monkeypatch.setenv(key, value)
    args = ["pretrain", *tiny(data, "--train.max_steps", "4", "--eval.every", "2", "--eval.batches", "1")]
    args += ["--eval.sample_every", "4", "--eval.sample_prompts", '["def "]', "--log.wandb", "true"]
    result = run_cli([*args, "--log.wandb_name", "tiny", "--run-dir", str(tmp_path / "run")], cwd=tmp_path, timeout=240)
    assert result.returncode == 0, result.stderr
    logs = list((tmp_path / "run" / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(logs) == 1 and logs[0].name == f"run-{(tmp_path / 'run' / 'wandb-id').read_text().strip()}.wandb"
    inspect = [sys.executable, "-m", "wandb", "leet", "inspect", "--json", str(logs[0])]
    lines = subprocess.run(inspect, capture_output=True, text=True, timeout=120, check=True, env=os.environ).stdout
    history = [json.loads(line)["history"] for line in lines.splitlines() if '"type":"history"' in line]
    rows = {h["step"]["num"]: h["item"] for h in history}
    assert {step: row["train/loss"] for step, row in rows.items() if "train/loss" in row} == losses(tmp_path / "run")
    evals = [json.loads(line) for line in (tmp_path / "run" / "eval.jsonl").read_text().splitlines()]
    assert {r["step"]: r["loss"] for r in evals} == {
        s: row["eval/loss"] for s, row in rows.items() if "eval/loss" in row
    }
    assert rows[4]["plots/loss._type"] == "image-file" and rows[4]["samples._type"] == "table-file"
    table = json.loads((logs[0].parent / "files" / rows[4]["samples.path"]).read_text())
    sample = json.loads((tmp_path / "run" / "samples.jsonl").read_text())
    assert table["columns"] == ["step", "prompt", "text"] and table["data"] == [[4, "def ", sample["text"]]]
    records = [json.loads(line) for line in lines.splitlines()]
    run = next(r["run"] for r in records if r["type"] == "run")
    assert run["display_name"] == "tiny" and run["project"] == "dlx"
    assert run["config"]["update"]["train"]["max_steps"] == 4
    summary = {k: v for r in records if r["type"] == "summary" for k, v in r["summary"].get("update", {}).items()}
    kind = summary["verdict/kind"]  # printed "(tentative)" when the step times were too noisy to be sure
    assert f"Bottleneck: {kind}: {summary['verdict/reason']}." in result.stdout or (
        f"Bottleneck: {kind} (tentative): {summary['verdict/reason']}." in result.stdout
    )
    assert f"Confidence: {summary['verdict/confidence']}" in result.stdout


def test_wandb_without_credentials_or_package_is_refused_before_anything_is_written(tmp_path, data, monkeypatch):
    pytest.importorskip("wandb")
    for key, value in wandb_env(tmp_path, None).items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    args = ["pretrain", *tiny(data, "--train.max_steps", "2"), "--log.wandb", "true", "--run-dir", str(tmp_path / "r")]
    result = run_cli(args, cwd=tmp_path)
    assert result.returncode == 2 and not (tmp_path / "r").exists()
    assert "log.wandb is true but W&B has no credentials: run `wandb login`" in result.stderr
    monkeypatch.setitem(sys.modules, "wandb", None)  # the package missing
    with pytest.raises(UserError, match=r"wandb is not installed: pip install 'dlx\[wandb\]'"):
        pretrain(load_recipe(None, tiny(data, "--train.max_steps", "2", "--log.wandb", "true")), "t", tmp_path / "r")
    assert not (tmp_path / "r").exists()


@pytest.mark.distributed
def test_two_fsdp_ranks_sample_and_profile_together(tmp_path, data):
    """Under FSDP every rank generates (the forward gathers the shards) and profiles; rank 0 writes the samples."""
    from test_parallel import still_running, torchrun

    args = ["pretrain", *tiny(data, "--train.max_steps", "4", "--parallel.strategy", "fsdp")]
    args += ["--eval.sample_every", "2", "--eval.sample_prompts", '["def "]', "--eval.sample_tokens", "4"]
    args += ["--profile.start", "2", "--profile.steps", "2", "--run-dir", str(tmp_path / "run")]
    result, processes = torchrun(args, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert not still_running(processes)
    samples = [json.loads(line) for line in (tmp_path / "run" / "samples.jsonl").read_text().splitlines()]
    assert [s["step"] for s in samples] == [2, 4]
    traces = sorted(p.name for p in (tmp_path / "run" / "profile").glob("*.pt.trace.json"))
    assert traces == ["rank0-steps2-3.pt.trace.json", "rank1-steps2-3.pt.trace.json"]


def test_wandb_failing_under_way_is_one_line_and_the_files_go_on(tmp_path, monkeypatch):
    wandb = pytest.importorskip("wandb")
    from dlx.metrics.logger import MetricsLogger
    from dlx.metrics.wandb_sink import WandbSink
    from dlx.train.observers.build import WandbObserver

    class BrokenRun:
        def __init__(self):
            self.calls = 0

        def log(self, values, step):
            self.calls += 1
            raise ConnectionError("W&B service died")

    broken = BrokenRun()
    monkeypatch.setattr(wandb, "init", lambda **kwargs: broken)
    said = []
    observer = WandbObserver(WandbSink(tmp_path, "p", None, {}, said.append))
    with MetricsLogger(tmp_path) as logger:
        for step in (1, 2, 3):
            logger.log({"step": step, "loss": 1.0})
            observer.on_record({"step": step, "loss": 1.0})
    observer.close()
    assert broken.calls == 1 and said == [
        "W&B failed (ConnectionError: W&B service died); this run logs to its files only from here on"
    ]
    assert [json.loads(line)["step"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()] == [1, 2, 3]

    def unreachable(**kwargs):
        raise TimeoutError("no answer from the server in 90 s")

    monkeypatch.setattr(wandb, "init", unreachable)
    sink = WandbSink(tmp_path, "p", None, {}, said.append)
    assert sink.run is None and said[-1].startswith("W&B: could not start a run (TimeoutError: no answer")
