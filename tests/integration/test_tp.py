"""Tensor parallelism on CPU (gloo, torchrun): tp 2 on 2 ranks and fsdp × tp 2 on 4 ranks train like one process with
the same global batch (fp32, SGD); gradients equal one process's; every layout starts from the same weights, built on
the meta device and initialised per shard; a tp 2 checkpoint (DCP) resumes in one process and on fsdp 2; export-hf
reads a DCP checkpoint; asynchronous saves; bad layouts are one line."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from test_parallel import LOSS_TOLERANCE, PARAM_TOLERANCE, RUN, TESTS, final_weights, max_difference, torchrun

from dlx.errors import UserError
from dlx.model.hf import dlx_to_hf_name
from dlx.model.io import empty_model
from dlx.model.llama import Transformer
from dlx.model.presets import resolve_model_args
from dlx.parallel.config import ParallelConfig
from dlx.parallel.distributed import DistEnv
from dlx.parallel.materialize import canonical_name, local_region, materialize
from dlx.parallel.strategy import Strategy, check_format
from dlx.parallel.tensor import check_layout
from dlx.train.build.model import load_initial_weights
from dlx.train.config import build_config
from dlx.train.launch import launch
from dlx.train.rundir.checkpoint import load_checkpoint_model
from dlx.train.rundir.trained import resolve_trained
from train_helpers import losses, run_cli, train_quietly

pytestmark = [pytest.mark.distributed, pytest.mark.usefixtures("in_process_training")]

TP2 = ["--parallel.tp", "2"]
FSDP_TP2 = ["--parallel.strategy", "fsdp", "--parallel.tp", "2", "--checkpoint.async", "true"]


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    """One process, the same global batch (gradient accumulation 4)."""
    return train_quietly(RUN, tmp_path_factory.mktemp("reference") / "run")


@pytest.fixture(scope="module")
def tp2_run(tmp_path_factory) -> tuple[Path, str]:
    """tp 2 on 2 ranks (strategy none: one replica): checkpoints at steps 2 and 3."""
    run_dir = tmp_path_factory.mktemp("tp2") / "run"
    result, _ = torchrun(["pretrain", *RUN, *TP2, "--run-dir", str(run_dir)], run_dir.parent)
    assert result.returncode == 0, result.stderr[-6000:]
    return run_dir, result.stdout


def assert_trains_like_one_process(run_dir: Path, reference: Path) -> None:
    expected, got = losses(reference), losses(run_dir)
    assert sorted(got) == [1, 2, 3]
    assert max(abs(got[step] - expected[step]) for step in expected) <= LOSS_TOLERANCE, (got, expected)
    assert max_difference(final_weights(run_dir), final_weights(reference)) <= PARAM_TOLERANCE


def test_tp2_trains_like_one_process(reference, tp2_run):
    run_dir, stdout = tp2_run
    assert_trains_like_one_process(run_dir, reference)
    assert "world size = 2 (1 data-parallel × 2 tensor-parallel)" in stdout
    assert "Gradient Accumulation steps = 4" in stdout  # both ranks read the same batches: one replica
    step2, step3 = (run_dir / "checkpoints" / f"step-0000000{n}" for n in (2, 3))
    state = json.loads((step2 / "trainer_state.json").read_text())
    assert (state["format"], state["world_size"], state["full_weights"]) == ("dcp", 2, False)
    assert not (step2 / "model.safetensors").exists()  # checkpoint.full_weights last: only the final one has it
    assert (step3 / "model.safetensors").is_file() and (step3 / "dcp" / ".metadata").is_file()


def test_fsdp_tp_on_four_ranks_trains_like_one_process(reference, tmp_path):
    """2 replicas × tp 2, FSDP2 over the replicas, checkpoints saved in the background."""
    run_dir = tmp_path / "run"
    result, _ = torchrun(["pretrain", *RUN, *FSDP_TP2, "--run-dir", str(run_dir)], tmp_path, nproc=4)
    assert result.returncode == 0, result.stderr[-6000:]
    assert_trains_like_one_process(run_dir, reference)
    assert "world size = 4 (2 data-parallel × 2 tensor-parallel)" in result.stdout
    step2 = run_dir / "checkpoints" / "step-00000002"
    assert json.loads((step2 / "trainer_state.json").read_text())["format"] == "dcp"  # published once complete
    assert not list((run_dir / "checkpoints").glob(".step-*"))


@pytest.mark.parametrize("nproc", [2, 4])
def test_gradients_equal_one_process(nproc, tmp_path):
    """tp 2 (2 ranks), fsdp × tp 2 and ddp × tp 2 (4 ranks): the same starting weights as one process, bitwise; the
    same gradients after an accumulated step; each rank holds only its shards; a background save keeps a staged copy."""
    out = tmp_path / "grads.json"
    result, _ = torchrun([str(out)], tmp_path, script=TESTS / "parallel_tp_grads.py", nproc=nproc)
    assert result.returncode == 0, result.stderr[-6000:]
    report = json.loads(out.read_text())
    total = report.pop("total_elements")
    norms = 5 * 64  # (2 · n_layers + 1) · dim norm weights, whole on every tensor-parallel rank
    held = {"none-tp2": (total - norms) // 2 + norms, "fsdp-tp2": (total - norms) // 4 + norms // 2}
    held["ddp-tp2"] = held["none-tp2"]
    assert sorted(report) == (["none-tp2"] if nproc == 2 else ["ddp-tp2", "fsdp-tp2"])
    for layout, result in report.items():
        assert result["same_start"], layout
        assert result["between_ranks"] == 0.0, (layout, result)
        assert result["vs_one_process"] <= 1e-6, (layout, result)
        assert result["local_elements"] == [held[layout]] * nproc, (layout, result)
        assert result["grad_elements_equal"], layout
        assert result["staged_copy"], layout


def resumable_copy(run_dir: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "resumed"
    shutil.copytree(run_dir, copy)
    shutil.rmtree(copy / "checkpoints" / "step-00000003")
    return copy


def test_tp2_checkpoint_resumes_in_one_process(reference, tp2_run, tmp_path):
    run_dir = resumable_copy(tp2_run[0], tmp_path)
    assert launch(None, ["--parallel.tp", "1"], run_dir, resume=True) == 0
    assert abs(losses(run_dir)[3] - losses(reference)[3]) <= LOSS_TOLERANCE
    assert max_difference(final_weights(run_dir), final_weights(reference)) <= PARAM_TOLERANCE


def test_tp2_checkpoint_resumes_on_fsdp_2(reference, tp2_run, tmp_path):
    run_dir = resumable_copy(tp2_run[0], tmp_path)
    args = ["pretrain", "--resume", "--run-dir", str(run_dir), "--parallel.tp", "1", "--parallel.strategy", "fsdp"]
    result, _ = torchrun(args, tmp_path)
    assert result.returncode == 0, result.stderr[-6000:]
    assert "written by 2 rank(s), dcp format" in result.stdout
    assert abs(losses(run_dir)[3] - losses(reference)[3]) <= LOSS_TOLERANCE
    assert max_difference(final_weights(run_dir), final_weights(reference)) <= PARAM_TOLERANCE


def test_export_hf_reads_a_dcp_checkpoint(tp2_run, tmp_path):
    """The final checkpoint holds both: `dlx export-hf` on it without its model.safetensors writes exactly the weights
    of that file; the step-2 checkpoint (DCP shards only) is found in the run folder and read too."""
    step2, step3 = (tp2_run[0] / "checkpoints" / f"step-0000000{n}" for n in (2, 3))
    only_dcp = tmp_path / "step3-dcp"  # as checkpoint.full_weights never writes it
    shutil.copytree(step3, only_dcp)
    (only_dcp / "model.safetensors").unlink()
    state = json.loads((only_dcp / "trainer_state.json").read_text())
    del state["files"]["model.safetensors"]
    (only_dcp / "trainer_state.json").write_text(json.dumps({**state, "full_weights": False}))
    result = run_cli(["export-hf", str(only_dcp), str(tmp_path / "hf")], tmp_path)
    assert result.returncode == 0, result.stderr
    exported, saved = load_file(tmp_path / "hf" / "model.safetensors"), load_file(step3 / "model.safetensors")
    assert sorted(exported) == sorted(dlx_to_hf_name(name) for name in saved)
    assert all(torch.equal(exported[dlx_to_hf_name(name)], tensor) for name, tensor in saved.items())
    run_dir = resumable_copy(tp2_run[0], tmp_path)  # its newest checkpoint is step 2: DCP shards only
    found = resolve_trained(run_dir, "dlx export-hf")
    assert found.weights == run_dir / "checkpoints" / step2.name
    earlier = load_checkpoint_model(found.weights).state_dict()
    assert not torch.equal(earlier["output.weight"], saved["output.weight"])


def test_init_from_reads_a_checkpoint_that_has_dcp_shards_only(tp2_run, tmp_path):
    """checkpoint.full_weights last leaves step 2 without model.safetensors: model.init_from reads its DCP shards, in
    one process (the weights export-hf reads) and shard-wise under fsdp 2 (the same first loss); with neither weights
    shards it is one line."""
    step2 = tp2_run[0] / "checkpoints" / "step-00000002"
    source = resolve_trained(step2, "model.init_from")
    assert source.in_shards
    source.check()
    model = empty_model(source.args(), "cpu")
    load_initial_weights(model, source)
    expected = load_checkpoint_model(step2).state_dict()
    assert all(torch.equal(tensor, expected[name]) for name, tensor in model.state_dict().items())
    start = [*RUN, "--model.init_from", str(step2), "--train.max_steps", "1", "--checkpoint.every", "0"]
    one = train_quietly(start, tmp_path / "one")
    two = tmp_path / "two"
    result, _ = torchrun(["pretrain", *start, "--parallel.strategy", "fsdp", "--run-dir", str(two)], tmp_path)
    assert result.returncode == 0, result.stderr[-6000:]
    assert abs(losses(two)[1] - losses(one)[1]) <= LOSS_TOLERANCE
    assert losses(one)[1] != losses(tp2_run[0])[1]  # from step 2's weights, not from the seed's random ones
    no_shards = tmp_path / "no-shards"
    shutil.copytree(step2, no_shards)
    shutil.rmtree(no_shards / "dcp")
    with pytest.raises(UserError, match=r"no-shards: the checkpoint is damaged \(dcp/\.metadata is missing\)"):
        resolve_trained(no_shards, "model.init_from")


def test_materialised_model_is_the_seeded_init():
    """One process: the meta build plus `materialize` is `init_weights` from a generator seeded with the seed,
    tied embeddings stay one parameter, and RoPE tables are rebuilt."""
    args = resolve_model_args("debug").model_copy(update={"tie_embeddings": True})
    with torch.device("meta"):
        model = Transformer(args)
    materialize(model, torch.device("cpu"), seed=5)
    expected = Transformer(args)
    expected.init_weights(torch.Generator().manual_seed(5))
    assert model.output.weight is model.tok_embeddings.weight
    got, want = model.state_dict(), expected.state_dict()
    assert list(got) == list(want) and all(torch.equal(got[name], want[name]) for name in want)
    assert torch.equal(model.rope_cos, expected.rope_cos)


def test_bad_layouts_are_one_line(tmp_path):
    base = {"train": {"max_steps": 1}, "model": {"preset": "debug"}, "data": {"seq_len": 32}}
    with pytest.raises(UserError, match=r"parallel\.tp 8 must divide model\.n_heads \(4\)"):
        build_config({**base, "parallel": {"tp": 8}})
    with pytest.raises(UserError, match=r"deepspeed does not combine with parallel\.tp 2"):
        build_config({**base, "parallel": {"tp": 2, "strategy": "deepspeed"}})
    with pytest.raises(UserError, match=r"data\.seq_len \(31\) must be a multiple of parallel\.tp \(2\)"):
        build_config({**base, "data": {"seq_len": 31}, "parallel": {"tp": 2}})
    with pytest.raises(UserError, match=r"parallel\.tp 2 needs a multiple of 2 ranks and this run has 3"):
        check_layout(ParallelConfig(tp=2), 3)
    with pytest.raises(UserError, match=r"runs on exactly 2 ranks and this run has 4; set parallel\.strategy ddp"):
        check_layout(ParallelConfig(tp=2), 4)
    check_layout(ParallelConfig(tp=2, strategy="fsdp"), 4)
    strategy = Strategy(None, None, None, None, 0.0, DistEnv(0, 2, 0, tp=2))  # type: ignore[arg-type]
    with pytest.raises(UserError, match=r"resume with --parallel\.tp 1"):
        check_format("full", 1, strategy, 2, Path("ckpt"))
    check_format("dcp", 4, strategy, 2, Path("ckpt"))
    result = run_cli(["pretrain", *RUN, *TP2, "--run-dir", str(tmp_path / "run")], tmp_path)  # no torchrun
    assert result.returncode == 2 and result.stderr.strip().count("\n") == 0, result.stderr
    assert "torchrun --nproc_per_node 2" in result.stderr and not (tmp_path / "run").exists()


def test_a_shard_filler_replaces_the_random_init():
    """`materialize(fill=...)`: the hook `model.init_from` loads through; each parameter's local region is filled from
    stored weights and nothing is drawn."""
    args = resolve_model_args("debug")
    stored = Transformer(args).state_dict()

    def fill(model: Transformer) -> None:
        for name, param in model.named_parameters():
            param.copy_(stored[canonical_name(name)][local_region(param)])

    with torch.device("meta"):
        model = Transformer(args)
    materialize(model, torch.device("cpu"), seed=5, fill=fill)
    assert all(torch.equal(model.state_dict()[name], tensor) for name, tensor in stored.items())


def test_checkpoint_keys_a_layout_does_not_use_are_named():
    from dlx.train.build.restore import unused_checkpoint_keys
    from dlx.train.config import CheckpointSection

    both = CheckpointSection.model_validate({"async": True, "full_weights": "every"})
    assert [note.split(" applies")[0] for note in unused_checkpoint_keys(both, "full")] == [
        "checkpoint.async",
        "checkpoint.full_weights",
    ]
    assert [note.split(" applies")[0] for note in unused_checkpoint_keys(both, "deepspeed")] == ["checkpoint.async"]
    assert unused_checkpoint_keys(both, "dcp") == []
    assert unused_checkpoint_keys(CheckpointSection(), "full") == []
    assert unused_checkpoint_keys(CheckpointSection(full_weights="last"), "full") == []  # as a resumed recipe says


def test_bench_measures_a_point_under_torchrun_with_tp_2(tmp_path):
    """`dlx bench --tp 2` on 2 ranks measures the step pretrain runs in that layout; rank 0 alone writes bench.csv."""
    out = tmp_path / "bench"
    point = ["--model", "debug", "--seq-len", "32", "--micro-batch", "2", "--precision", "fp32", "--steps", "1"]
    result, _ = torchrun(["bench", *point, "--warmup", "0", "--tp", "2", "--out", str(out)], tmp_path)
    assert result.returncode == 0, result.stderr[-6000:]
    with (out / "bench.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert [(row["status"], row["seq_len"], row["micro_batch"]) for row in rows] == [("ok", "32", "2")]
    assert float(rows[0]["tokens_per_s"]) > 0 and float(rows[0]["est_mem_gb"]) > 0
