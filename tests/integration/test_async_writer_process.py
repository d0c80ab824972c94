"""checkpoint.async writes through DCP's checkpoint process at the lowest CPU priority (dlx.parallel.background_writer):
a real `dlx pretrain` (fsdp on one rank, DCP checkpoints) is held at a fault point in its second background save; the
writer process is found among its descendants, every thread of it at nice 19 (the trainer's main thread as it was);
then the trainer alone is SIGKILLed (as the out-of-memory killer does) and nothing it started is left running, nor
anything in /dev/shm. A run resumed from a checkpoint written in the background continues to the same losses as the
run straight through; none of the writer process's INFO lines reach the console."""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
from pathlib import Path

import psutil
import pytest
from tests.fault_helpers import (
    cli_env,
    finish,
    is_gone,
    leaked_shm,
    left_running,
    shm_entries,
    start_cli,
    wait_for_file,
)

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="Linux threads")

RUN = [
    "pretrain",
    *("--model.preset", "debug", "--data.seq_len", "64", "--data.micro_batch_size", "2", "--data.path", "synthetic"),
    *("--train.max_steps", "6", "--checkpoint.every", "2", "--eval.every", "0", "--log.every", "1"),
    *("--log.progress", "false", "--parallel.strategy", "fsdp", "--checkpoint.async", "true"),
]


def writer_processes(trainer: psutil.Process) -> list[psutil.Process]:
    """The trainer's descendants started by multiprocessing's spawn (DCP's checkpoint process)."""
    found = []
    for child in trainer.children(recursive=True):
        try:
            if "spawn_main" in " ".join(child.cmdline()):
                found.append(child)
        except psutil.Error:
            continue
    return found


def test_writer_process_runs_idle_and_ends_with_a_killed_trainer(tmp_path: Path) -> None:
    faults = tmp_path / "faults"
    faults.mkdir()
    shm_before = shm_entries()
    env = cli_env(DLX_FAULT_PAUSE="checkpoint_save@2", DLX_FAULT_DIR=str(faults))  # the 2nd save
    proc = start_cli([*RUN, "--run-dir", str(tmp_path / "run")], tmp_path, env=env, plots=False)
    try:
        wait_for_file(faults / "checkpoint_save", proc)
        trainer = psutil.Process(proc.pid)
        deadline = time.monotonic() + 120  # the writer imports torch at the idle class: the trainer is paused
        while not (writers := writer_processes(trainer)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len(writers) == 1, [p.cmdline() for p in trainer.children(recursive=True)]
        (writer,) = writers
        threads = [thread.id for thread in writer.threads()]
        priorities = {tid: os.getpriority(os.PRIO_PROCESS, tid) for tid in threads}
        assert set(priorities.values()) == {19}, priorities
        ours = os.getpriority(os.PRIO_PROCESS, 0)
        assert os.getpriority(os.PRIO_PROCESS, proc.pid) == ours  # the training's own thread is not lowered
        tree = [trainer, *trainer.children(recursive=True)]
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert left_running(tree, timeout=30) == []
    assert is_gone(writer)
    assert leaked_shm(shm_before) == []


def test_background_written_checkpoints_resume_to_the_same_losses(tmp_path: Path) -> None:
    straight = tmp_path / "straight"
    proc = start_cli([*RUN, "--run-dir", str(straight)], tmp_path)
    out, err = finish(proc, timeout=180)
    assert proc.returncode == 0, err
    assert "INFO" not in err, err  # DCP's checkpoint process logs every request at INFO: not on the run's console
    assert sorted(p.name for p in (straight / "checkpoints").iterdir()) == [
        "step-00000002",
        "step-00000004",
        "step-00000006",
    ]
    events = [json.loads(line) for line in (straight / "events.jsonl").read_text().splitlines()]
    assert [e["background"] for e in events if e["event"] == "checkpoint"] == [True, True, False]

    resumed = tmp_path / "resumed"  # the straight run as it was at step 4: its checkpoint written in the background
    shutil.copytree(straight, resumed)
    shutil.rmtree(resumed / "checkpoints" / "step-00000006")
    proc = start_cli([*RUN, "--run-dir", str(resumed), "--resume", "auto"], tmp_path, plots=False)
    out, err = finish(proc, timeout=180)
    assert proc.returncode == 0, err
    assert "resum" in out.lower() and "step 4" in out, out

    def losses(run: Path) -> dict[int, float]:
        records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        return {r["step"]: r["loss"] for r in records if "loss" in r}  # the last record of a step: the resumed one

    assert [losses(resumed)[s] for s in (5, 6)] == [losses(straight)[s] for s in (5, 6)]


def test_an_in_process_run_ends_its_writer_and_the_next_run_starts_its_own(tmp_path: Path) -> None:
    """`dlx.train.loop.trainer.pretrain` twice in this process (a notebook, `dlx tune`): each run's writer process
    ends with its group, so no child is left and the second run's saves go to a writer of its own group."""
    from dlx.train.loop.trainer import pretrain
    from dlx.train.recipe import load_recipe

    def spawned() -> list[psutil.Process]:
        return writer_processes(psutil.Process())

    overrides = RUN[1:]
    for name in ("first", "second"):
        result = pretrain(load_recipe(None, overrides), name, tmp_path / name)
        assert result.last_checkpoint is not None and result.last_checkpoint.name == "step-00000006"
        assert spawned() == [], [p.cmdline() for p in spawned()]
    events = [json.loads(line) for line in (tmp_path / "second" / "events.jsonl").read_text().splitlines()]
    assert [e["background"] for e in events if e["event"] == "checkpoint"] == [True, True, False]
