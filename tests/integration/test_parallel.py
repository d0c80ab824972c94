"""Scale-out on CPU: torchrun (a subprocess) with 2 gloo ranks. DDP, FSDP2 and DeepSpeed ZeRO-1/2/3 train like one
process with the same global batch (fp32, SGD, synthetic data that does not depend on the world size); checkpoints
written by 2 ranks resume in 1 process; a failing rank ends the whole job; bad input is one line. Activation
checkpointing and torch.compile on one device."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import torch
from safetensors.torch import load_file

from dlx.errors import UserError
from dlx.parallel.build import check_strategy_installed
from dlx.train.build.step_plan import resolve_grad_accum
from dlx.train.config import build_config
from dlx.train.launch import launch
from dlx.train.recipe import load_recipe
from fault_helpers import leaked_shm, shm_entries
from train_helpers import losses, run_cli, train_quietly

pytestmark = [pytest.mark.distributed, pytest.mark.usefixtures("in_process_training")]

TESTS = Path(__file__).parents[1]
RUN = [
    "--model.preset",
    "debug",
    "--data.seq_len",
    "32",
    "--data.micro_batch_size",
    "2",
    "--train.global_batch_size",
    "8",
    "--train.optimizer",
    "sgd",
    "--train.lr",
    "0.5",
    "--train.warmup_ratio",
    "0",
    "--train.max_steps",
    "3",
    "--train.precision",
    "fp32",
    "--eval.every",
    "0",
    "--checkpoint.every",
    "2",
    "--checkpoint.keep_last",
    "3",
    "--log.every",
    "1",
    "--log.progress",
    "false",
]
"""Global batch 8: gradient accumulation 4 in one process, 2 on each of 2 ranks. Checkpoints at steps 2 and 3."""
STRATEGIES = {
    "ddp": ["--parallel.strategy", "ddp"],
    "fsdp": ["--parallel.strategy", "fsdp"],
    "zero1": ["--parallel.strategy", "deepspeed", "--parallel.zero_stage", "1"],
    "zero2": ["--parallel.strategy", "deepspeed", "--parallel.zero_stage", "2"],
    "zero3": ["--parallel.strategy", "deepspeed", "--parallel.zero_stage", "3"],
}
LOSS_TOLERANCE, PARAM_TOLERANCE = 1e-5, 1e-4


def final_weights(run_dir: Path, step: int = 3) -> dict[str, torch.Tensor]:
    return load_file(run_dir / "checkpoints" / f"step-{step:08d}" / "model.safetensors")


def max_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert sorted(a) == sorted(b)
    return max((a[name] - b[name]).abs().max().item() for name in a)


def torchrun(
    args: list[str],
    cwd: Path,
    script: Path = TESTS / "parallel_entry.py",
    timeout: float = 300,
    nproc: int = 2,
    **env: str,
) -> tuple[subprocess.CompletedProcess, list[psutil.Process]]:
    """`torchrun --standalone --nproc_per_node NPROC SCRIPT ARGS`; returns its result and every process seen in its
    tree while it ran (polled), so that a test can check that none outlived it."""
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc)]
    command = [*launcher, str(script), *args]
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "COLUMNS": "200", **env}
    proc = subprocess.Popen(
        command,
        cwd=cwd,
        env=full_env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    seen: dict[int, psutil.Process] = {}
    deadline = time.monotonic() + timeout
    try:
        while proc.poll() is None and time.monotonic() < deadline:
            with contextlib.suppress(psutil.NoSuchProcess):
                seen.update((p.pid, p) for p in psutil.Process(proc.pid).children(recursive=True))
            time.sleep(0.2)
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
            proc.wait()
            raise AssertionError(f"torchrun {' '.join(args)} ran over {timeout} s")
    finally:
        out, err = proc.communicate()
    return subprocess.CompletedProcess(command, proc.returncode, out, err), list(seen.values())


def still_running(processes: list[psutil.Process]) -> list[psutil.Process]:
    alive = []
    for process in processes:
        try:
            if process.status() != psutil.STATUS_ZOMBIE:
                alive.append(process)
        except psutil.NoSuchProcess:
            pass
    return alive


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    """One process, the same global batch (gradient accumulation 4)."""
    run_dir = train_quietly(RUN, tmp_path_factory.mktemp("reference") / "run")
    return run_dir


@pytest.fixture(scope="module")
def two_rank_runs(tmp_path_factory):
    """Run dirs of the 2-rank runs, one per strategy, made on first use."""
    runs: dict[str, tuple[Path, subprocess.CompletedProcess]] = {}

    def get(strategy: str) -> tuple[Path, subprocess.CompletedProcess]:
        if strategy not in runs:
            run_dir = tmp_path_factory.mktemp(strategy) / "run"
            result, _ = torchrun(["pretrain", *RUN, *STRATEGIES[strategy], "--run-dir", str(run_dir)], run_dir.parent)
            assert result.returncode == 0, result.stderr[-6000:]
            runs[strategy] = run_dir, result
        return runs[strategy]

    return get


@pytest.mark.parametrize("strategy", list(STRATEGIES))
def test_two_ranks_train_like_one_process(strategy, reference, two_rank_runs):
    run_dir, result = two_rank_runs(strategy)
    expected, got = losses(reference), losses(run_dir)
    assert sorted(got) == [1, 2, 3]
    assert max(abs(got[step] - expected[step]) for step in expected) <= LOSS_TOLERANCE, (got, expected)
    assert max_difference(final_weights(run_dir), final_weights(reference)) <= PARAM_TOLERANCE
    # only rank 0 prints and logs; the header counts both ranks and the accumulation that makes the global batch
    assert result.stdout.count("step 3 |") == 1, result.stdout
    assert "Total train batch size (w. parallel, distributed & accumulation) = 8" in result.stdout
    assert "Gradient Accumulation steps = 2" in result.stdout and "world size = 2" in result.stdout
    record = json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[-1])
    assert record["communication_s"] > 0, record  # the per-step agreement on loss and stop is timed


def test_gradients_are_identical_on_every_rank(tmp_path):
    """DDP and FSDP2 through dlx's own accumulate_gradients: each rank's gradients equal one process's on all ranks'
    micro-batches, and DDP all-reduces once per optimizer step, not once per micro-step."""
    result, _ = torchrun([str(tmp_path / "grads.json")], tmp_path, script=TESTS / "parallel_grads.py")
    assert result.returncode == 0, result.stderr[-6000:]
    report = json.loads((tmp_path / "grads.json").read_text())
    for strategy in ("ddp", "fsdp"):
        assert report[strategy]["names_match"]
        assert report[strategy]["between_ranks"] == 0.0, report
        assert report[strategy]["vs_one_process"] <= 1e-6, report
    assert report["ddp"]["all_reduces"] == [1, 1], report  # accumulated step: as many as one synchronised backward


def resumable_copy(run_dir: Path, tmp_path: Path) -> Path:
    """The run as if it had stopped after the checkpoint of step 2."""
    copy = tmp_path / "resumed"
    shutil.copytree(run_dir, copy)
    shutil.rmtree(copy / "checkpoints" / "step-00000003")
    return copy


@pytest.mark.parametrize(("strategy", "resume_with"), [("ddp", "none"), ("fsdp", "fsdp")])
def test_saved_on_two_ranks_resumed_in_one_process(strategy, resume_with, reference, two_rank_runs, tmp_path):
    """DDP's checkpoint is the full format (any world size, also without DDP); FSDP's DCP checkpoint is resharded."""
    run_dir = resumable_copy(two_rank_runs(strategy)[0], tmp_path)
    assert launch(None, ["--parallel.strategy", resume_with], run_dir, resume=True) == 0
    expected, got = losses(reference), losses(run_dir)
    assert abs(got[3] - expected[3]) <= LOSS_TOLERANCE
    assert max_difference(final_weights(run_dir), final_weights(reference)) <= PARAM_TOLERANCE


def test_deepspeed_resumes_on_the_same_world_size(reference, two_rank_runs, tmp_path):
    run_dir = resumable_copy(two_rank_runs("zero2")[0], tmp_path)
    result, _ = torchrun(["pretrain", "--resume", "--run-dir", str(run_dir)], tmp_path)
    assert result.returncode == 0, result.stderr[-6000:]
    assert "resuming from" in result.stdout
    assert abs(losses(run_dir)[3] - losses(reference)[3]) <= LOSS_TOLERANCE


def test_a_failing_rank_ends_the_whole_job(tmp_path):
    shm_before = shm_entries()
    started = time.monotonic()
    result, processes = torchrun(
        ["pretrain", *RUN, *STRATEGIES["ddp"], "--run-dir", str(tmp_path / "run")],
        tmp_path,
        DLX_TEST_FAIL_RANK="1",
        DLX_TEST_FAIL_STEP="2",
    )
    assert result.returncode != 0
    # The failing rank prints its own error in one line before it leaves the group (torchrun may end it before its
    # traceback), and no rank blames a live peer for it (on a loaded machine the peer's beat lagged one phase behind).
    announced = "error: rank 1 failed at step 2, forward and backward: RuntimeError: injected failure on rank 1 in "
    assert announced + "step 2" in result.stderr, result.stderr[-6000:]
    assert "did not arrive" not in result.stderr, result.stderr[-6000:]
    assert time.monotonic() - started < 90, "the surviving rank waited for its collective's timeout"
    assert len(processes) >= 2, "torchrun's ranks were never seen"
    assert not still_running(processes), "a rank or a loader worker outlived the job"
    assert not leaked_shm(shm_before)


def test_a_failure_in_rank_0s_attention_choice_ends_every_rank(tmp_path):
    """Not a UserError (a CUDA error while timing, say): rank 0 still broadcasts it (main_decides), and rank 1
    raises the same error. Before, rank 0 left without answering: over gloo rank 1 then failed at once with "Connection
    closed by peer", hiding the cause; over NCCL a peer's leaving need not end a broadcast before the timeout."""
    started = time.monotonic()
    result, processes = torchrun(
        ["pretrain", *RUN, *STRATEGIES["ddp"], "--parallel.timeout_s", "600", "--run-dir", str(tmp_path / "run")],
        tmp_path,
        DLX_FAULT_RAISE="attention_choice",
    )
    assert result.returncode != 0
    line = "MainFailed: rank 0 failed deciding for every rank: RuntimeError: injected failure at attention_choice"
    for rank in (0, 1):  # torchrun prefixes each rank's lines
        assert f"[rank{rank}]: dlx.parallel.distributed.{line}\n" in result.stderr, result.stderr[-6000:]
    assert "[rank0]: RuntimeError: injected failure at attention_choice\n" in result.stderr  # the original error
    assert "Connection closed by peer" not in result.stderr  # gloo's own error, all rank 1 said before
    assert time.monotonic() - started < 90, "rank 1 waited for rank 0's decision until the timeout"
    assert len(processes) >= 2, "torchrun's ranks were never seen"
    assert not still_running(processes), "a rank outlived the job"
    assert not (tmp_path / "run").exists()


def test_a_missing_engine_is_one_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "deepspeed", None)  # import deepspeed now raises ImportError
    config = load_recipe(None, [*RUN, *STRATEGIES["zero2"]])
    with pytest.raises(UserError, match=r"pip install 'dlx\[deepspeed\]'") as error:
        check_strategy_installed(config.parallel)
    assert "\n" not in str(error.value)


def test_a_world_size_that_does_not_divide_the_global_batch(tmp_path):
    config = build_config({"data": {"micro_batch_size": 3}, "train": {"max_steps": 1, "global_batch_size": 12}})
    assert (resolve_grad_accum(config, 2), resolve_grad_accum(config, 4)) == (2, 1)
    with pytest.raises(UserError, match=r"3 × 3 = 9"):
        resolve_grad_accum(config, 3)
    result = run_cli(
        [
            "pretrain",
            *RUN,
            "--train.global_batch_size",
            "6",
            "--data.micro_batch_size",
            "4",
            "--run-dir",
            str(tmp_path / "run"),
        ],
        tmp_path,
    )
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().count("\n") == 0 and "global_batch_size 6" in result.stderr, result.stderr
    assert not (tmp_path / "run").exists()


def test_a_checkpoint_from_another_strategy_is_refused(two_rank_runs, tmp_path):
    run_dir = resumable_copy(two_rank_runs("ddp")[0], tmp_path)
    with pytest.raises(UserError, match=r"written by parallel\.strategy none or ddp") as error:
        launch(None, ["--parallel.strategy", "fsdp"], run_dir, resume=True)
    assert "\n" not in str(error.value) and "--parallel.strategy none or ddp" in str(error.value)


@pytest.mark.parametrize("mode", ["full", "selective"])
def test_activation_checkpointing_on_one_device(mode, reference, tmp_path):
    """Recomputing the blocks in backward changes memory, not the arithmetic."""
    assert launch(None, [*RUN, "--parallel.activation_checkpointing", mode], tmp_path / "run", resume=False) == 0
    assert losses(tmp_path / "run") == losses(reference)
    assert max_difference(final_weights(tmp_path / "run"), final_weights(reference)) == 0.0


def test_fsdp_bf16_keeps_the_residual_stream_and_the_output_gradient_in_fp32(tmp_path):
    """FSDP2 gathers bf16 weights; the residual stream between blocks stays fp32 (block inputs are not cast), and
    the output weight's gradient adds up its chunks in fp32, is rounded once to bf16 per micro-step (the gathered
    weight's dtype) and accumulates in fp32: within two bf16 roundings of one process's fp32-master gradient."""
    result, _ = torchrun([str(tmp_path / "fsdp.json")], tmp_path, script=TESTS / "parallel_fsdp_precision.py")
    assert result.returncode == 0, result.stderr[-6000:]
    report = json.loads((tmp_path / "fsdp.json").read_text())
    assert report["block_dtypes"] == ["torch.float32"], report
    assert report["output_grad_dtype"] == "torch.float32", report
    assert report["output_vs_one_process"] <= 2 * 2**-8 * report["output_largest"], report
