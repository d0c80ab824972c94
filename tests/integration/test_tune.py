"""`dlx tune`: the enumeration, the memory rule against what the CPU measures, the time model's ranking, the recipe
written, the bad inputs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from dlx import device as dev
from dlx.bench.tune import search as tune_module
from dlx.bench.tune import whole_run
from dlx.bench.tune.search import TuneSettings, run_tune
from dlx.bench.tune.space import Layout, SearchSpace, enumerate_layouts
from dlx.bench.tune.time_model import LayoutCost, Rates, calibrate
from dlx.errors import UserError
from dlx.train.recipe import load_recipe

ROOT = Path(__file__).resolve().parents[2]
DEBUG = str(ROOT / "recipes" / "debug.yaml")
SMALL = ("--data.seq_len", "32", "--train.global_batch_size", "8")
"""The debug recipe at 8 sequences of 32 tokens per step: micro-batch × accumulation ∈ {1×8, 2×4, 4×2, 8×1}."""


def truth(layout) -> float:
    """A synthetic step time: accumulation costs 0.1 s a micro-step, checkpointing 0.05 s a level, math attention 0.2 s,
    the strategies differ a little, and compile halves the step."""
    checkpointing = {"none": 0, "selective": 1, "full": 2}[layout.activation_checkpointing]
    strategy = {"none": 0.0, "ddp": 0.01, "fsdp": 0.02, "deepspeed": 0.03}[layout.strategy]
    step = 0.2 + 0.1 * layout.grad_accum + 0.05 * checkpointing + 0.2 * (layout.attention == "math") + strategy
    return step / 2 if layout.compile else step


COMPILE_WARMUP_S = 30.0
"""The synthetic first step's extra seconds under compile (cold), and once its graphs are cached (warm)."""
WARM_COMPILE_S = 6.0
TASKS_S, SAVE_S = 7.0, 0.5
"""One task evaluation and one save, injected (the same for every layout)."""


@pytest.fixture
def synthetic_measure(monkeypatch):
    """measure_config replaced by `truth` (nothing trains; a validation batch a third of a micro-step, compile's
    warm-up `COMPILE_WARMUP_S`); the rates, attention calls, a task evaluation and a save fixed, so no decision depends
    on this machine's speed or load; every measured layout recorded."""
    measured = []

    def fake_measure(config, device, warmup, steps, eval_batches=0):
        from dlx.bench.tune.space import Layout

        parallel, train, micro = config.parallel, config.train, config.data.micro_batch_size
        layout = Layout(
            parallel.strategy, parallel.tp, parallel.activation_checkpointing, config.data.micro_batch_size,
            (train.global_batch_size or train.grad_accum * micro) // micro,
            train.compile, train.float8, train.attention,
        )  # fmt: skip
        measured.append(layout)
        step_s = truth(layout)
        record = {"step_s": step_s, "tokens_per_s": 256 / step_s, "mfu": 0.1, "peak_mem_gb": 0.5}
        record["first_step_s"] = step_s + (COMPILE_WARMUP_S if layout.compile else 0.1)
        if layout.compile:
            record["warm_first_step_s"] = step_s + WARM_COMPILE_S
        if eval_batches:
            record["eval_batch_s"] = step_s / layout.grad_accum / 3
        return record

    rates = Rates({}, 10.0, 1.0, False)

    def fake_rates(args, device, keys, link):
        return Rates({key: 1e-3 * key[1] for key in keys}, rates.memory_gbps, 1.0, False)

    def fake_attention(args, device, seq_len, precision, keys):
        return {(kind, micro): 1e-4 * micro * (1 + (kind == "math")) for kind, micro in keys}

    monkeypatch.setattr(tune_module, "measure_config", fake_measure)
    monkeypatch.setattr(whole_run, "time_task_evaluation", lambda config, device: TASKS_S)
    monkeypatch.setattr(whole_run, "time_save", lambda config, folder: SAVE_S)
    monkeypatch.setattr(tune_module, "measure_rates", fake_rates)
    monkeypatch.setattr(tune_module, "measure_attention", fake_attention)
    return measured


def test_enumeration_covers_the_space_once():
    space = SearchSpace(world_size=2, global_batch=8, tps=(1, 2), compile=(False,), attention=("default",))
    layouts = enumerate_layouts(space)
    assert len(layouts) == len(set(layouts))
    for layout in layouts:
        dp = 2 // layout.tp
        assert layout.micro_batch * layout.grad_accum * dp == 8
        assert (layout.strategy == "none") == (dp == 1)  # none: one replica only; the others: several
    # ddp, fsdp and three ZeRO stages at tp 1 (dp 2: micro 1, 2, 4); none alone at tp 2 (dp 1: micro 1, 2, 4, 8); × 3 AC
    assert len(layouts) == 3 * (5 * 3 + 1 * 4)


def test_hsdp_is_searched_where_the_world_size_makes_a_two_dimensional_mesh():
    def replicas(world_size):
        space = SearchSpace(world_size=world_size, global_batch=8, tps=(1,), compile=(False,), checkpointing=("none",))
        return sorted({layout.dp_replicate for layout in enumerate_layouts(space) if layout.strategy == "hsdp"})

    assert replicas(1) == replicas(2) == []
    assert replicas(4) == [2]
    assert replicas(8) == [2, 4]


def test_calibration_keeps_the_prior_of_a_term_no_measurement_exercises():
    costs = [LayoutCost(0.01, 0.02 * a, 0.03 * a, 0.01, 0.0) for a in (1, 2, 4, 8)]
    model = calibrate(costs, [0.05 + 0.03 * a for a in (1, 2, 4, 8)])
    assert model.coefficients[4:] == pytest.approx(
        (1.0, 1.0, 1.0), rel=1e-12
    )  # comm, attention, compiled: never nonzero, kept at their price


def test_calibration_recovers_a_synthetic_model_and_its_order():
    rng = np.random.default_rng(0)
    costs = [LayoutCost(*rng.uniform(0.01, 1.0, 7)) for _ in range(12)]
    true = np.array([2.0, 0.5, 1.5, 3.0, 0.7, 1.2, 0.4])
    seconds = [float(cost.terms() @ true) for cost in costs]
    model = calibrate(costs[:8], seconds[:8], ridge=0.0)
    assert np.allclose(model.coefficients, true, rtol=1e-9)
    predicted = [model.predict(cost) for cost in costs[8:]]
    assert np.argsort(predicted).tolist() == np.argsort(seconds[8:]).tolist()


def test_tune_measures_the_best_predicted_first_and_picks_the_truly_fastest(synthetic_measure):
    settings = TuneSettings(DEBUG, SMALL, budget_s=600, keep=("train.compile",), max_measured=6)
    result = run_tune(settings)
    fits = [c for c in result.candidates if c.estimate_gb is not None]
    admitted = [c for c in fits if not (c.drop or "").startswith(("does not fit", "parallel.strategy"))]
    best_true = min(truth(c.layout) for c in admitted)
    assert truth(result.winner.layout) == pytest.approx(best_true)
    assert 3 <= len(synthetic_measure) <= 6 < len(admitted)  # calibrated on a few, stopped well before all
    assert result.model.measured_points == len(synthetic_measure)
    (own,) = [c for c in result.candidates if c.is_recipe]  # the recipe's layout (attention auto: default on a CPU)
    assert synthetic_measure[0] == own.layout == Layout("none", 1, "none", 4, 2, False, False, "default")
    assert result.winner.run.total_s <= own.run.total_s
    for candidate in result.candidates:  # every candidate carries why it lost, the winner none
        assert (candidate.drop is None) == (candidate is result.winner)


@pytest.mark.parametrize(("steps", "compiled"), [(20, False), (4000, True)])
def test_the_whole_run_decides_compile_its_warm_up_amortised_over_the_steps(synthetic_measure, steps, compiled):
    """Compile halves the step and costs `COMPILE_WARMUP_S` once: on a short run eager ends first, on a long one the
    compiled layout does. The whole run counts the evaluations, the task evaluations and the saves the recipe runs."""
    overrides = (*SMALL, "--train.max_steps", str(steps), "--eval.every", "10", "--eval.batches", "4")
    keep = ("parallel.strategy", "train.attention", "parallel.activation_checkpointing", "data.micro_batch_size")
    result = run_tune(TuneSettings(DEBUG, overrides, budget_s=600, keep=keep, max_measured=6))
    assert result.winner.layout.compile is compiled
    shape = result.shape
    assert (shape.steps, shape.evaluations, shape.eval_batches, shape.task_evaluations) == (steps, steps // 10, 4, 0)
    assert shape.saves == steps // 20  # the debug recipe's checkpoint.every 20; the last step is one of them
    for c in result.candidates:  # measured: from the injected record; compiled ones start warm (the cache is filled)
        if c.record is not None:
            step_s, micro = truth(c.layout), c.layout.micro_batch
            warmup = WARM_COMPILE_S if c.layout.compile else 0.1
            evals = shape.evaluations * 4 * step_s / (8 // micro) / 3
            expected = warmup + steps * step_s + evals + shape.saves * SAVE_S
            assert c.run.total_s == pytest.approx(expected, rel=1e-9)


def test_pruning_never_admits_a_layout_the_cpu_measures_above_the_stated_memory(monkeypatch):
    """A budget between the layouts' estimates: the admitted ones, each measured for real, stay within it."""
    monkeypatch.setattr(tune_module, "STOP_MARGIN", 100.0)  # measure every admitted layout
    keep = ("train.compile", "parallel.strategy", "train.attention", "data.micro_batch_size")  # AC: the one dimension
    quick = {"budget_s": 600, "keep": keep, "warmup": 1, "steps": 1}
    probe = run_tune(TuneSettings(DEBUG, SMALL, **quick, memory_limit_gb=1e6, max_measured=0))
    estimates = sorted(c.estimate_gb for c in probe.candidates if c.estimate_gb is not None)
    rule = probe.rule
    held = dev.memory_in_use_gb(torch.device("cpu"))
    limit = held + rule.fixed_gb + (1 + rule.margin) * estimates[len(estimates) // 2]
    result = run_tune(TuneSettings(DEBUG, SMALL, **quick, memory_limit_gb=limit, max_measured=99))
    dropped = [c for c in result.candidates if c.drop and c.drop.startswith("does not fit")]
    measured = [c for c in result.candidates if c.record is not None]
    assert dropped and measured
    assert len(measured) + len(dropped) == len(result.candidates)
    for c in measured:
        assert c.record["peak_mem_gb"] <= limit, (c.layout.label(), c.record["peak_mem_gb"], limit)


def invoke(*args: str):
    from typer.testing import CliRunner

    from dlx.cli.app import _register_commands, app

    if not app.registered_commands:
        _register_commands()
    return CliRunner().invoke(app, list(args))


def test_the_winner_is_written_as_a_recipe_pretrain_loads(synthetic_measure, tmp_path):
    out = tmp_path / "tuned.yaml"
    result = invoke("tune", DEBUG, *SMALL, "--keep", "train.compile", "--out", str(out), "--json")
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output.strip().splitlines()[-1])
    winner = summary["winner"]["layout"]
    config = load_recipe(str(out), [])
    assert config.data.micro_batch_size == winner["micro_batch_size"] == 8
    assert config.parallel.activation_checkpointing == winner["activation_checkpointing"] == "none"
    assert config.train.attention == winner["attention"]
    assert config.train.global_batch_size == 8 and config.data.seq_len == 32
    keys = {"layout", "predicted_step_s", "measured_step_s", "tokens_per_s", "mfu", "estimate_gb", "drop"}
    assert all(keys <= set(row) for row in summary["candidates"])
    assert sum(row["measured_step_s"] is not None for row in summary["candidates"]) == len(synthetic_measure)
    assert (tmp_path / "tuned.md").read_text().count("\n| ") == len(summary["candidates"]) + 1


def test_the_table_lists_the_measured_and_the_best_unmeasured_and_all_with_all(synthetic_measure, tmp_path):
    """At world size 1 no data-parallel strategy is listed; the printed table holds the winner, the measured layouts
    and the best unmeasured one, and says how many more `--all` lists."""
    args = ("tune", DEBUG, *SMALL, "--keep", "train.compile", "--out", str(tmp_path / "t.yaml"))
    short, every = invoke(*args), invoke(*args, "--all")
    assert short.exit_code == 0 and every.exit_code == 0, short.output + every.output
    rows = [line for line in short.output.splitlines() if line.startswith("| ") and "---" not in line][1:]
    all_rows = [line for line in every.output.splitlines() if line.startswith("| ") and "---" not in line][1:]
    candidates = json.loads((tmp_path / "t.json").read_text())["candidates"]
    measured = sum(row["measured_step_s"] is not None for row in candidates)
    assert len(rows) == measured + 1 < len(all_rows) == len(candidates)
    assert f"{len(candidates) - len(rows)} more candidate(s), predicted slower or dropped" in short.output
    assert {row["layout"]["strategy"] for row in candidates} == {"none"}
    assert "ranked by the whole run (60 steps, 3 evaluation(s) of 4 batches, 3 save(s) of" in short.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--world-size", "3"), "--world-size 3: no layout divides it"),
        (("--memory-limit-gb", "0.01"), "no layout reaches the global batch of 8 sequences"),
        (("--budget-min", "0.01"), "is too small for one measurement"),
        (("--budget-min", "nan"), "--budget-min must be a positive number of minutes, got nan"),
        (("--budget-min", "inf"), "--budget-min must be a positive number of minutes, got inf"),
    ],
)
def test_bad_inputs_are_one_line(args, message, tmp_path):
    result = invoke("tune", DEBUG, *SMALL, *args, "--out", str(tmp_path / "t.yaml"))
    assert isinstance(result.exception, UserError), result.output
    assert message in str(result.exception) and "\n" not in str(result.exception)
    assert not (tmp_path / "t.yaml").exists()


def test_a_bad_input_exits_2(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "dlx", "tune", DEBUG, *SMALL, "--world-size", "3", "--out", str(tmp_path / "t.yaml")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "no layout divides it" in proc.stderr


def test_pretrain_tune_trains_with_the_winner_and_keeps_the_table(synthetic_measure, tmp_path):
    run_dir = tmp_path / "run"
    overrides = ("--train.max_steps", "2", "--eval.every", "2", "--checkpoint.every", "2")
    result = invoke("pretrain", DEBUG, *SMALL, *overrides, "--tune", "--run-dir", str(run_dir))
    assert result.exit_code == 0, result.output
    winner = json.loads((run_dir / "tune.json").read_text())["winner"]["layout"]
    config = load_recipe(None, [], base=__import__("yaml").safe_load((run_dir / "config.yaml").read_text()))
    assert config.data.micro_batch_size == winner["micro_batch_size"]
    assert config.parallel.activation_checkpointing == winner["activation_checkpointing"]
    assert config.train.max_steps == 2 and (run_dir / "tune.md").is_file() and (run_dir / "tune.yaml").is_file()


def test_a_process_measures_deepspeed_layouts_in_two_tunes_in_a_row():
    """DeepSpeed caches the groups it makes; the group's teardown must drop them with it, or the second tune's engine
    fails on a group that is no longer registered (as `benchmarks/bench_tune.py` runs tune, then the sweep)."""
    pytest.importorskip("deepspeed")
    overrides = (*SMALL, "--parallel.strategy", "deepspeed", "--data.micro_batch_size", "8")
    keep = ("parallel.strategy", "data.micro_batch_size", "parallel.activation_checkpointing", "train.attention")
    keep += ("train.compile", "train.float8")
    for _ in range(2):
        result = run_tune(TuneSettings(DEBUG, overrides, keep=keep, warmup=1, steps=1, budget_s=600))
        assert {c.layout.zero_stage for c in result.candidates} == {1, 2, 3}
        assert all(c.record is not None and not (c.drop or "").startswith("failed") for c in result.candidates)


def test_measured_attention_prices_the_attention_term_in_place_of_its_flops():
    from dlx.bench.tune.space import Layout
    from dlx.bench.tune.time_model import layout_cost
    from dlx.metrics.flops import training_flops_per_token

    args = load_recipe(DEBUG, []).model.args
    layout = Layout("none", 1, "full", 2, 4, False, False, "math")
    unmeasured = Rates({("fp32", 64): 1e-3}, 10.0, 1.0, False)
    measured = Rates({("fp32", 64): 1e-3}, 10.0, 1.0, False, attention_s={("math", 2): 0.004})
    before, after = (layout_cost(args, layout, 32, "fp32", 1, rates) for rates in (unmeasured, measured))
    assert after.attention_s == pytest.approx(0.004 * args.n_layers * 4 * (1 + 1 / 3), rel=1e-12)
    dense = training_flops_per_token(args, 32).dense * 2 * 32 * 4 * (1 + 1 / 3)
    assert after.compute_s == pytest.approx(dense / 1e9, rel=1e-12)
    assert before.compute_s == after.compute_s and before.attention_s > 0  # unmeasured: its FLOPs and scores


def test_attention_is_timed_per_kernel_and_micro_batch_and_scaled_past_the_token_cap(monkeypatch):
    from dlx.bench.tune import rates as tune_rates

    args = load_recipe(DEBUG, []).model.args
    cpu = torch.device("cpu")
    keys = {("default", 1), ("math", 1), ("math", 4)}
    seconds = tune_rates.measure_attention(args, cpu, 32, "fp32", keys)
    assert set(seconds) == keys and all(value > 0 for value in seconds.values())
    timed = []
    monkeypatch.setattr(tune_rates, "MAX_TOKENS", 64)  # two sequences of 32 at most
    monkeypatch.setattr(tune_rates, "attention_call_s", lambda setting, shape, device: timed.append(shape.batch) or 1.0)
    assert tune_rates.measure_attention(args, cpu, 32, "fp32", {("math", 8)}) == {("math", 8): 4.0}
    assert timed == [2]
