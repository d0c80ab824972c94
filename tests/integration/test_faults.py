"""The fault matrix, signals × moments: SIGINT, SIGTERM and SIGKILL during `dlx prepare`, a training step, a checkpoint
save and an evaluation, each sent to the real CLI at an exact point (dlx.faults) rather than after a guessed sleep.

Every cell checks: no process of the run is left, nothing new is left in /dev/shm, the newest checkpoint reads back
(and is the one expected: the step an orderly stop saved, or the last one before a SIGKILL), and the resumed run's
losses equal an uninterrupted run's bit for bit (CPU, fp32) at every step; for prepare, the rerun's folder equals an
uninterrupted run's byte for byte. The resume runs in-process through `launch`, the function `dlx pretrain --resume`
calls, to keep the matrix within its time budget (`test_train_cli` resumes through the CLI itself).
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from dlx.data.prepare import prepare_dataset
from dlx.model.io import load_model
from dlx.train.launch import launch
from dlx.train.rundir.checkpoint import list_checkpoints, read_checkpoint
from fault_helpers import (
    SIGNALS,
    cli_env,
    finish,
    leaked_shm,
    left_running,
    process_tree,
    send,
    shm_entries,
    signal_after_progress,
    start_cli,
    wait_for_file,
)
from prepare_helpers import folder_bytes, make_documents, prepare_command, tiny_tokenizer, write_jsonl
from train_helpers import TINY, losses, make_dataset, train_quietly

__all__ = ["tiny_tokenizer"]
pytestmark = [pytest.mark.faults, pytest.mark.usefixtures("in_process_training")]

RUN = [
    *TINY,
    "--data.num_workers",
    "1",
    "--train.max_steps",
    "10",
    "--checkpoint.every",
    "3",
    "--eval.every",
    "4",
    "--eval.batches",
    "2",
]
"""Checkpoints at steps 3, 6, 9, 10; evaluations at 4, 8, 10; one loader worker process."""

MOMENTS = {
    "step": ("train_batch@6", 6),  # step 6 asks for its batch (checkpoint 3 exists)
    "eval": ("val_batch@1", 4),  # the evaluation after step 4 asks for its first batch
    "save": ("checkpoint_save@2", 6),  # the save of step 6, its weights written, trainer_state.json not yet
}
"""Moment → (the dlx.faults point, the checkpoint an orderly stop leaves). After a SIGKILL it is step 3's."""
LAST_BEFORE_KILL = 3
EXIT_CODES = {"SIGINT": 128 + signal.SIGINT, "SIGTERM": 128 + signal.SIGTERM, "SIGKILL": -signal.SIGKILL}


@pytest.fixture(scope="session")
def dataset(tmp_path_factory) -> Path:
    return make_dataset(tmp_path_factory.mktemp("faults") / "data")


@pytest.fixture(scope="session")
def reference(dataset, tmp_path_factory) -> dict[int, float]:
    """Losses of the uninterrupted run, step by step."""
    run_dir = train_quietly([*RUN, "--data.path", str(dataset)], tmp_path_factory.mktemp("reference") / "run")
    return losses(run_dir)


@pytest.mark.parametrize("name", SIGNALS)
@pytest.mark.parametrize("moment", list(MOMENTS))
def test_pretrain_signalled(moment, name, dataset, reference, tmp_path, capsys):
    point, orderly_step = MOMENTS[moment]
    run_dir, marker = tmp_path / "run", tmp_path / point.partition("@")[0]
    shm_before = shm_entries()
    env = cli_env(DLX_FAULT_PAUSE=point, DLX_FAULT_DIR=str(tmp_path))
    proc = start_cli(
        ["pretrain", *RUN, "--data.path", str(dataset), "--run-dir", str(run_dir)], tmp_path, env, plots=False
    )
    wait_for_file(marker, proc)
    tree = process_tree(proc.pid)
    assert len(tree) >= 2, "the run should have its loader worker"
    send(proc, name)
    marker.unlink()  # the paused process goes on: to its orderly stop, or nowhere after SIGKILL
    _, err = finish(proc)

    assert proc.returncode == EXIT_CODES[name], err
    assert not left_running(tree), "processes of the run outlived it"
    assert not leaked_shm(shm_before)
    if name != "SIGKILL":
        assert f"{name} received" in err and "--resume" in err and "Traceback" not in err, err
    newest = list_checkpoints(run_dir)[0]
    expected = LAST_BEFORE_KILL if name == "SIGKILL" else orderly_step
    assert read_checkpoint(newest).state.step == expected
    assert load_model(newest).args.dim == 64

    assert launch(None, [], run_dir, resume=True) == 0
    assert f"resuming from {newest}" in capsys.readouterr().out
    assert losses(run_dir) == reference  # exact float equality at every step 1..10
    assert not list((run_dir / "checkpoints").glob(".*")), "the unfinished save's temporary folder was left"


PREPARE = ["--shard-tokens", "3000", "--val-fraction", "0.05", "--workers", "2", "--no-progress"]


@pytest.fixture(scope="session")
def corpus(tmp_path_factory, tiny_tokenizer) -> tuple[Path, dict[str, bytes]]:
    """A corpus file and the bytes of its uninterrupted `dlx prepare` output."""
    folder = tmp_path_factory.mktemp("corpus")
    write_jsonl(folder / "a.jsonl", make_documents(2500, seed=5))
    clean = folder / "clean"
    prepare_dataset(
        [str(folder / "a.jsonl")],
        clean,
        tokenizer=tiny_tokenizer,
        shard_tokens=3000,
        val_fraction=0.05,
        workers=1,
        progress=False,
    )
    return folder / "a.jsonl", folder_bytes(clean)


@pytest.mark.parametrize("name", SIGNALS)
def test_prepare_signalled(name, corpus, tiny_tokenizer, tmp_path):
    source, clean = corpus
    out = tmp_path / "out"
    cmd = prepare_command(source, out, tiny_tokenizer, *PREPARE)
    shm_before = shm_entries()
    proc, tree = signal_after_progress(cmd, out, min_next_unit=4, name=name)
    assert proc is not None, "prepare finished before the signal: the corpus is too small"
    err = proc.stderr.read()
    proc.stderr.close()

    assert proc.returncode == EXIT_CODES[name], err
    if name != "SIGKILL":  # says what it kept and how to go on
        assert f"stopped by {name}: {out} keeps " in err and "run the same command again to continue" in err, err
    assert len(tree) >= 3, "prepare should have run its two workers"
    assert not left_running(tree), "processes of prepare outlived it"
    assert not leaked_shm(shm_before)
    assert "Traceback" not in err, err
    prepare_dataset(
        [str(source)], out, tokenizer=tiny_tokenizer, shard_tokens=3000, val_fraction=0.05, workers=2, progress=False
    )
    assert folder_bytes(out) == clean
