"""Context parallelism (`parallel.cp`) on gloo CPU ranks: every step's loss and gradients equal one process's within
1e-5 in fp32, with and without document masks; `dlx pretrain` with cp 2 trains like one process and its checkpoint
resumes on cp 1 and on DDP; the balanced split; bad layouts."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from test_parallel import (
    LOSS_TOLERANCE,
    PARAM_TOLERANCE,
    RUN,
    TESTS,
    final_weights,
    max_difference,
    resumable_copy,
    torchrun,
)

from dlx.errors import UserError
from dlx.metrics.communication import communication_bytes, cp_communication_bytes
from dlx.metrics.estimate import TrainingShape, gathered_kv_bytes, plan_memory
from dlx.model.llama import Transformer, causal_attention
from dlx.model.presets import resolve_model_args
from dlx.parallel.context import (
    ContextParallel,
    gathered_positions,
    held_positions,
    layout_problem,
    sequence_problem,
)
from dlx.train.launch import launch
from dlx.train.recipe import load_recipe
from train_helpers import losses, run_cli, train_quietly

TOLERANCE = 1e-5


def test_balanced_split_holds_chunk_i_and_its_mirror():
    assert held_positions(0, 2, 8, torch.device("cpu")).tolist() == [0, 1, 6, 7]
    assert held_positions(1, 2, 8, torch.device("cpu")).tolist() == [2, 3, 4, 5]
    assert sorted(gathered_positions(4, 32, torch.device("cpu")).tolist()) == list(range(32))
    # every rank's queries see the same number of keys under the causal mask
    seen = [int((held_positions(r, 4, 32, torch.device("cpu")) + 1).sum()) for r in range(4)]
    assert len(set(seen)) == 1


def test_degree_one_shard_is_the_whole_sequence_with_plain_causal_attention():
    inputs = torch.arange(16).reshape(2, 8)
    local, targets, kwargs, weight = ContextParallel(1, 0, None).shard(inputs, inputs + 1, {})
    assert torch.equal(local, inputs) and torch.equal(targets, inputs + 1)
    assert kwargs["attention_mask"] is None and kwargs["positions"].tolist() == list(range(8))
    assert weight.item() == 1.0


def test_bad_layouts_are_one_line():
    assert "parallel.strategy ddp, fsdp or hsdp" in layout_problem("none", 2, 1, 1, 2)
    assert "does not divide the 6 ranks" in layout_problem("ddp", 4, 1, 1, 6)
    assert "parallel.dp_replicate 3" in layout_problem("hsdp", 1, 1, 3, 4)
    assert "hsdp runs without tensor parallelism" in layout_problem("hsdp", 1, 2, 1, 4)
    assert layout_problem("fsdp", 2, 2, 1, 8) is None
    assert "divisible by 8" in sequence_problem(4, False, 36, "default")
    assert "train.attention flash" in sequence_problem(2, False, 32, "flash")
    assert "train.attention flex" in sequence_problem(1, True, 32, "flex")
    assert sequence_problem(1, False, 33, "flash") is None
    assert sequence_problem(1, True, 32, "flash") is None  # the cp path at degree 1: plain causal SDPA
    assert "train.attention flash" in sequence_problem(1, True, 32, "flash", document_mask=True)


@pytest.mark.distributed
@pytest.mark.parametrize("degree", [2, pytest.param(4, marks=pytest.mark.slow)])
def test_context_parallel_equals_one_process(tmp_path, degree):
    """cp ranks (DDP averaging their gradients) against one process on the same whole sequences, 3 SGD steps."""
    out = tmp_path / "result.json"
    result, _ = torchrun([str(out), str(degree)], tmp_path, TESTS / "context_entry.py", nproc=degree)
    assert result.returncode == 0, result.stderr[-3000:]
    found = json.loads(out.read_text())
    for name in ("causal", "documents"):
        assert found[name]["loss"] < TOLERANCE, (name, found[name])
        assert found[name]["grads"] < TOLERANCE, (name, found[name])
    assert found["causal"]["losses"] != found["documents"]["losses"]  # the document mask changed the attention
    # per step and layer, k and v (B=2, T=32, 2 kv heads × 16, fp32) gathered whole, their gradients scattered back;
    # each rank sends (cp − 1)/cp of both: `dlx plan`'s formula
    counted = found["causal"]["bytes_per_step"]
    assert counted == {"all_gather": 2 * 2 * 2 * 32 * 32 * 4, "reduce_scatter": 2 * 2 * 2 * 32 * 32 * 4}
    shape = TrainingShape(seq_len=32, micro_batch=2, precision="fp32", strategy="ddp", world_size=degree, cp=degree)
    sent = (counted["all_gather"] + counted["reduce_scatter"]) * (degree - 1) / degree
    assert cp_communication_bytes(resolve_model_args("debug"), shape) == sent


def test_plan_divides_activations_by_cp_and_adds_the_gathered_keys_and_values():
    args = resolve_model_args("llama3.2-1b")
    one = TrainingShape(seq_len=65536, micro_batch=1, strategy="fsdp", world_size=8, activation_checkpointing="full")
    eight = replace(one, cp=8)
    split = plan_memory(args, eight)
    kv = gathered_kv_bytes(args, eight)
    # full checkpointing: 16 layer inputs of 8,192 tokens plus one recomputed layer; its gathered k and v (repeated to
    # dim on CUDA) for the other 57,344 tokens, in bf16
    assert kv.saved == 2 * 2 * args.dim * 57344
    assert kv.mask == 8192 * 65536
    assert split.activations_gb < plan_memory(args, one).activations_gb / 4
    assert split.tokens_per_step == 65536  # one replica of 8 cp ranks
    assert communication_bytes(args, eight).context_parallel == cp_communication_bytes(args, eight) > 0


CP2 = ["--parallel.strategy", "ddp", "--parallel.cp", "2", "--train.attention", "default"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """`dlx pretrain` in one process and on 2 ranks with parallel.cp 2 (one replica, DDP over the cp ranks)."""
    root = tmp_path_factory.mktemp("cp")
    reference = train_quietly(RUN, root / "reference")
    counts = root / "counts"  # Dynamo's graph breaks and graphs per rank (parallel_entry.py, the eager backend)
    counts.mkdir()
    compiled = ["--train.compile", "true", "--run-dir", str(root / "cp2")]
    result, _ = torchrun(["pretrain", *RUN, *CP2, *compiled], root, DLX_TEST_COMPILE_COUNTS=str(counts))
    assert result.returncode == 0, result.stderr[-6000:]
    return {"reference": reference, "cp2": root / "cp2", "counts": counts}


@pytest.mark.distributed
def test_pretrain_with_cp2_trains_like_one_process(runs):
    """Compiled blocks (train.compile) with the cp attention inside: no graph break, the same losses and weights."""
    for rank in (0, 1):
        found = json.loads((runs["counts"] / f"{rank}.json").read_text())
        assert found["graph_break"] == {}, found
    expected, got = losses(runs["reference"]), losses(runs["cp2"])
    assert sorted(got) == [1, 2, 3]
    assert max(abs(got[step] - expected[step]) for step in expected) <= LOSS_TOLERANCE, (got, expected)
    assert max_difference(final_weights(runs["cp2"]), final_weights(runs["reference"])) <= PARAM_TOLERANCE


@pytest.mark.distributed
@pytest.mark.usefixtures("in_process_training")
@pytest.mark.parametrize("resume_with", ["cp1", pytest.param("ddp", marks=pytest.mark.slow)])
def test_cp2_checkpoint_resumes_on_another_layout(runs, resume_with, tmp_path):
    """The cp 2 run's step-2 checkpoint, resumed in one process (cp 1) and on 2 DDP ranks (cp 1): step 3 as the
    one-process run's."""
    run_dir = resumable_copy(runs["cp2"], tmp_path)
    layout = ["--parallel.cp", "1", "--train.attention", "auto"]
    if resume_with == "cp1":
        assert launch(None, ["--parallel.strategy", "none", *layout], run_dir, resume=True) == 0
    else:
        result, _ = torchrun(["pretrain", "--resume", "--run-dir", str(run_dir), *layout], tmp_path)
        assert result.returncode == 0, result.stderr[-6000:]
        assert "written by 2 rank(s)" in result.stdout
    assert abs(losses(run_dir)[3] - losses(runs["reference"])[3]) <= LOSS_TOLERANCE
    assert max_difference(final_weights(run_dir), final_weights(runs["reference"])) <= PARAM_TOLERANCE


@pytest.mark.distributed
@pytest.mark.slow
def test_fsdp_tp2_cp2_trains_like_one_process(runs, tmp_path):
    """A dp 1 × cp 2 × tp 2 grid on 4 ranks: FSDP2 over the cp ranks, tensor parallelism within each."""
    layout = ["--parallel.strategy", "fsdp", "--parallel.tp", "2", "--parallel.cp", "2", "--train.attention", "default"]
    result, _ = torchrun(["pretrain", *RUN, *layout, "--run-dir", str(tmp_path / "run")], tmp_path, nproc=4)
    assert result.returncode == 0, result.stderr[-6000:]
    expected, got = losses(runs["reference"]), losses(tmp_path / "run")
    assert max(abs(got[step] - expected[step]) for step in expected) <= LOSS_TOLERANCE, (got, expected)


def test_the_attention_function_serves_only_forwards_over_slices():
    """Generation and lm-eval requests call the model without positions: they attend as the model alone does."""
    model = Transformer(resolve_model_args("debug"))
    tokens = torch.randint(0, 512, (1, 8))
    plain = model(tokens)
    calls = []

    def attend(q, k, v, mask, kernel):
        calls.append(q.shape)
        return causal_attention(q, k, v, kernel)

    model.use_attention_fn(attend)
    assert torch.equal(model(tokens), plain) and not calls
    sliced = model(tokens, positions=torch.arange(8))
    assert len(calls) == model.args.n_layers and torch.allclose(sliced, plain, atol=1e-6)


@pytest.mark.parametrize(
    ("layout", "line"),
    [
        (["--data.seq_len", "30"], "data.seq_len 30 does not split into 2 × parallel.cp = 4"),
        (["--train.attention", "flash"], "train.attention flash cannot run context parallelism's attention"),
        (["--train.attention", "flex"], "train.attention flex cannot run"),
    ],
)
def test_bad_cp_recipe_is_one_line(layout, line):
    with pytest.raises(UserError, match=line):
        load_recipe(None, [*RUN, *CP2, *layout])


def test_cp_with_the_defaults_is_a_recipe_that_runs():
    """parallel.cp alone: strategy auto becomes what the ranks need, attention auto leaves SDPA a kernel that takes
    the cp mask (the journey tests/journeys/test_journey_context_parallel.py trains it under torchrun)."""
    from dlx.train.config import build_config

    debug = {"model": {"preset": "debug"}, "data": {"seq_len": 64}, "train": {"max_steps": 1}}
    config = build_config({**debug, "parallel": {"cp": 2}}, world_size=2)
    assert (config.parallel.strategy, config.train.attention) == ("ddp", "auto")
    assert config.parallel.auto_note == "2 ranks: 1 data-parallel × 2 context-parallel"
    assert build_config({**debug, "parallel": {"cp": 2, "tp": 2}}, world_size=8).parallel.strategy == "fsdp"
    assert build_config({**debug, "parallel": {"tp": 2}}, world_size=2).parallel.strategy == "none"
    assert build_config({**debug, "parallel": {"dp_replicate": 2}}, world_size=4).parallel.strategy == "hsdp"
    assert build_config(debug, world_size=1).parallel.strategy == "none"


def test_cp_without_a_strategy_that_averages_its_gradients_is_one_line_before_step_1(tmp_path):
    layout = ["--parallel.strategy", "none", "--parallel.cp", "2", "--train.attention", "math"]
    result = run_cli(["pretrain", *RUN, *layout, "--run-dir", str(tmp_path / "run")], tmp_path)
    assert result.returncode == 2, result.stderr[-2000:]
    assert "parallel.cp 2 needs parallel.strategy ddp, fsdp or hsdp" in result.stderr, result.stderr[-2000:]
    assert "Traceback" not in result.stderr and not (tmp_path / "run").exists()
