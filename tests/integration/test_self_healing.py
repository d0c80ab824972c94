"""Self-healing in one process: `--resume auto` (start, continue, finished), the run folder's writer lock, loss-spike
skip and rollback (planted with DLX_FAULT_SPIKE), the verdict's straggler line."""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

import pytest

from dlx import faults
from dlx.errors import UserError
from dlx.metrics.verdict import bottleneck_verdict
from dlx.train.launch import launch
from dlx.train.rundir.checkpoint import list_checkpoints, read_checkpoint
from dlx.train.rundir.runlock import LOCK_FILE, RunLock
from train_helpers import TINY, losses, make_dataset

pytestmark = pytest.mark.usefixtures("in_process_training")


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    return make_dataset(tmp_path_factory.mktemp("heal") / "data")


def recipe(dataset: Path, steps: int, *extra: str) -> list[str]:
    return [*TINY, "--data.path", str(dataset), "--train.max_steps", str(steps), "--checkpoint.every", "3", *extra]


BOOKKEEPING = ("start", "checkpoint")
"""Events every run writes (its start, each checkpoint); the tests here look at the others."""


def events(run_dir: Path) -> list[dict]:
    lines = (run_dir / "events.jsonl").read_text().splitlines()
    return [e for e in map(json.loads, lines) if e["event"] not in BOOKKEEPING]


def test_resume_auto_starts_continues_and_trains_nothing_when_finished(dataset, tmp_path, capsys):
    run_dir, flat = tmp_path / "run", ["--train.schedule", "constant", "--train.warmup_ratio", "0"]  # lr: any length
    assert launch(None, recipe(dataset, 4, *flat), run_dir, "auto") == 0  # no run there: a new one
    assert "resuming" not in capsys.readouterr().out
    assert launch(None, recipe(dataset, 6, *flat), run_dir, "auto") == 0  # a run there: resumed from step 3
    assert "resuming from" in capsys.readouterr().out
    straight = tmp_path / "straight"
    assert launch(None, recipe(dataset, 6, *flat), straight, False) == 0
    assert losses(run_dir) == losses(straight)  # the step-4 record of the first leg was replaced by the resume's
    before = (run_dir / "metrics.jsonl").read_text()
    assert launch(None, recipe(dataset, 6, *flat), run_dir, "auto") == 0
    assert "already finished at step 6 of 6: trained nothing" in capsys.readouterr().out
    assert (run_dir / "metrics.jsonl").read_text() == before


def test_resume_auto_and_overrides_take_both_spellings_on_the_command_line(dataset, tmp_path, capsys, monkeypatch):
    """`--resume=auto --run-dir=DIR --train.max_steps=4` starts the run; `--resume auto --run-dir DIR
    --train.max_steps 6` continues it (through the console command's own argument handling, in this process)."""
    from dlx.cli.app import main

    run_dir, flat = tmp_path / "run", [*TINY, "--data.path", str(dataset), "--checkpoint.every", "3"]
    for args, last_step in (
        (["--resume=auto", f"--run-dir={run_dir}", "--train.max_steps=4"], 4),
        (["--resume", "auto", "--run-dir", str(run_dir), "--train.max_steps", "6"], 6),
    ):
        monkeypatch.setattr("sys.argv", ["dlx", "pretrain", *flat, *args])
        with pytest.raises(SystemExit) as exit_:
            main()
        out, err = capsys.readouterr()
        assert exit_.value.code == 0, err
        assert ("resuming from" in out) == (last_step == 6), out  # the first starts the run, the second continues it
        assert max(losses(run_dir)) == last_step


def test_resume_auto_refuses_a_file_and_another_recipe(dataset, tmp_path):
    a_file = tmp_path / "file"
    a_file.write_text("x")
    with pytest.raises(UserError, match="is a file, not a folder"):
        launch(None, recipe(dataset, 2), a_file, "auto")
    run_dir = tmp_path / "run"
    assert launch(None, recipe(dataset, 2), run_dir, "auto") == 0
    with pytest.raises(UserError, match=r"model\.dim is 32 but the run was started with 64"):
        launch(None, [*recipe(dataset, 2), "--model.dim", "32"], run_dir, "auto")


def test_a_second_writer_is_refused_and_a_dead_holders_lock_taken_over(dataset, tmp_path):
    run_dir = tmp_path / "run"
    assert launch(None, recipe(dataset, 2), run_dir, "auto") == 0
    assert (run_dir / LOCK_FILE).read_text() == "", "released at the end of the run"
    held = RunLock(run_dir)
    held.acquire()  # a live writer (this process, through another open file)
    try:
        with pytest.raises(UserError, match=f"being trained by pid {os.getpid()} on {socket.gethostname()}"):
            launch(None, recipe(dataset, 4), run_dir, "auto")
    finally:
        held.release()
    dead = {"pid": 2**22 + 1, "host": socket.gethostname(), "started": 0, "alive": time.time()}
    (run_dir / LOCK_FILE).write_text(json.dumps(dead))  # a SIGKILLed holder's line: its flock died with it
    assert launch(None, recipe(dataset, 4), run_dir, "auto") == 0
    elsewhere = {**dead, "host": "another-host"}  # a holder on another machine that refreshed just now
    (run_dir / LOCK_FILE).write_text(json.dumps(elsewhere))
    with pytest.raises(UserError, match="on another-host"):
        launch(None, recipe(dataset, 5), run_dir, "auto")
    (run_dir / LOCK_FILE).write_text(json.dumps({**elsewhere, "alive": time.time() - 600}))  # stale: taken over
    assert launch(None, recipe(dataset, 5), run_dir, "auto") == 0


SPIKY = ["--train.spike_window", "8", "--train.spike_sigma", "6", "--log.every", "1"]


@pytest.fixture
def plant(monkeypatch):
    def at(spec: str) -> None:
        monkeypatch.setenv(faults.SPIKE_ENV, spec)
        monkeypatch.setattr(faults, "_arrivals", {})

    return at


def test_spike_skip_leaves_the_update_out_and_consumes_the_batch(dataset, tmp_path, plant):
    clean, skipped = tmp_path / "clean", tmp_path / "skipped"
    assert launch(None, recipe(dataset, 14, *SPIKY, "--train.spike_policy", "skip"), clean, False) == 0
    plant("12x20")
    assert launch(None, recipe(dataset, 14, *SPIKY, "--train.spike_policy", "skip"), skipped, False) == 0
    spikes = [e for e in events(skipped) if e["event"] == "loss_spike"]
    assert [e["step"] for e in spikes] == [12]
    assert spikes[0]["loss"] == pytest.approx(20 * losses(clean)[12], rel=1e-6)
    assert losses(skipped)[11] == losses(clean)[11]
    records = [json.loads(line) for line in (skipped / "metrics.jsonl").read_text().splitlines()]
    assert records[11]["grad_norm"] is None  # no update at step 12
    assert losses(skipped)[14] == pytest.approx(losses(clean)[14], rel=0.02)
    state = read_checkpoint(list_checkpoints(skipped)[0]).state
    assert state.loader["consumed"] == read_checkpoint(list_checkpoints(clean)[0]).state.loader["consumed"]


def test_no_judgement_before_the_window_is_full(dataset, tmp_path, plant):
    plant("3x100")
    run_dir = tmp_path / "run"
    assert launch(None, recipe(dataset, 5, *SPIKY, "--train.spike_policy", "skip"), run_dir, False) == 0
    assert events(run_dir) == [], "no spike judged, nothing else to report"


def test_spike_rollback_skips_exactly_the_spiking_windows(dataset, tmp_path, plant):
    clean, rolled = tmp_path / "clean", tmp_path / "rolled"
    rollback = [*SPIKY, "--train.spike_policy", "rollback", "--train.spike_patience", "2"]
    rollback += ["--checkpoint.keep_last", "4"]
    assert launch(None, recipe(dataset, 16, *rollback), clean, False) == 0
    plant("11,12x20")
    assert launch(None, recipe(dataset, 16, *rollback), rolled, False) == 0
    back = [e for e in events(rolled) if e["event"] == "rollback"]
    assert len(back) == 1 and back[0]["to_step"] == 9 and back[0]["skipped_steps"] == [11, 12]
    folders = sorted(p.name for p in (rolled / "checkpoints").iterdir())  # the set-aside step 12 counts toward
    assert folders == ["step-00000009", "step-00000012", "step-00000015", "step-00000016"]  # keep_last: gone first
    assert losses(rolled)[10] == losses(clean)[10]  # step 10 replayed on its own batch
    clean_state = read_checkpoint(list_checkpoints(clean)[0]).state
    state = read_checkpoint(list_checkpoints(rolled)[0]).state
    assert state.step == 16 and state.loader["consumed"] == clean_state.loader["consumed"] + 2 * 2  # 2 steps × 2 seqs
    tail = [13, 14, 15, 16]  # other batches from step 11 on: compare the level, not one batch's loss
    mean_rolled, mean_clean = (sum(losses(run)[s] for s in tail) / len(tail) for run in (rolled, clean))
    assert mean_rolled == pytest.approx(mean_clean, rel=0.05)


def test_the_verdict_names_a_straggler_rank():
    def record(slowest_s: float) -> dict:
        return {
            "step_s": 1.0,
            "tokens_per_s": 100.0,
            "forward_s": 0.5,
            "backward_s": 0.4,
            "rank_step_s_max": slowest_s,
            "rank_step_s_min": 0.5,
            "rank_step_s_median": 0.5 * (0.5 + slowest_s),
            "slowest_rank": 1,
        }

    assert "rank 1 takes 1.23x the median" in str(bottleneck_verdict([record(0.8)] * 5))
    assert bottleneck_verdict([record(0.55)] * 5).straggler is None


def test_the_rank_behind_is_named_and_a_rank_failing_on_its_own_keeps_its_error():
    from dlx.parallel.heartbeat import ranks_behind

    now = 1000.0
    beat = {"step": 7, "phase": "loss all-reduce", "time": now - 1, "pid": 1, "host": "h"}
    level = {0: beat, 1: beat, 2: beat}
    assert ranks_behind(level, {0: now, 1: now - 9, 2: now}, 0, now) == [1]  # stopped: its tick went stale
    lagging = {**level, 2: {**beat, "phase": "forward and backward"}}
    assert ranks_behind(lagging, {0: now, 1: now, 2: now}, 0, now) == [2]  # live, but still in step 7's backward
    assert ranks_behind(lagging, {0: now, 1: now, 2: now}, 2, now) == [2]  # rank 2's own error: explain keeps it
    assert ranks_behind(lagging, {0: now, 1: now, 2: now}, 0, now, timed_out=False) == []  # not a hang: too soon


def test_a_rank_failing_on_its_own_keeps_its_error_and_its_peer_names_it(capfd):
    """The race seen under load: rank 1 raises its own error in step 2's forward while rank 0 has not yet beaten
    past step 1's loss all-reduce. Rank 1 must not blame rank 0 ("did not arrive"); rank 0's failed collective names
    rank 1's original error, which rank 1 also printed before leaving the group."""
    import torch.distributed as dist

    from dlx.parallel.heartbeat import Heartbeat, RankLost

    store = dist.HashStore()
    ranks = [Heartbeat(store, rank, 2, timeout_s=600.0) for rank in (0, 1)]
    try:
        ranks[0].beat(1, "loss all-reduce")
        ranks[1].beat(2, "forward and backward")
        own = RuntimeError("injected failure on rank 1 in step 2")
        assert ranks[1].explain(own) is own
        ranks[1].announce_failure(own)
        announced = "error: rank 1 failed at step 2, forward and backward: RuntimeError: injected failure on rank 1 in "
        assert capfd.readouterr().err.startswith(announced + "step 2 (pid ")
        lost = ranks[0].explain(RuntimeError("Connection closed by peer"))
        assert isinstance(lost, RankLost)
        assert str(lost).startswith(
            "a collective failed on rank 0 at step 1, loss all-reduce because rank 1 failed at step 2, forward and "
            "backward: RuntimeError: injected failure on rank 1 in step 2 (pid "
        )
        assert str(lost).endswith("(then this rank's collective: RuntimeError: Connection closed by peer)")
        assert ranks[0].explain(ValueError("not a collective")).args == ("not a collective",)
    finally:
        for heartbeat in ranks:
            heartbeat.close()


@pytest.mark.parametrize("spelling", [["--resume", "auto"], ["--resume=auto"]])
def test_cli_resume_auto_needs_a_run_dir(tmp_path, spelling):
    from train_helpers import run_cli

    proc = run_cli(["pretrain", *spelling, "--train.max_steps", "2"], tmp_path)
    assert proc.returncode == 2 and proc.stderr.strip() == (
        "error: --resume auto needs --run-dir DIR: the folder every restart of the job starts or continues"
    )
    assert not list(tmp_path.iterdir())


def test_a_resumed_run_judges_spikes_at_once(dataset, tmp_path, plant):
    run_dir, skip = tmp_path / "run", [*SPIKY, "--train.spike_policy", "skip"]
    assert launch(None, recipe(dataset, 9, *skip), run_dir, False) == 0  # window of 8 full at the step-9 checkpoint
    assert len(read_checkpoint(list_checkpoints(run_dir)[0]).state.observers["spikes"]["window"]) == 8
    plant("10x20")
    assert launch(None, recipe(dataset, 11, *skip), run_dir, "auto") == 0
    assert [(e["event"], e["step"]) for e in events(run_dir)] == [("resume", 9), ("loss_spike", 10)]


def test_rollback_rewarms_the_learning_rate(dataset, tmp_path, plant):
    rollback = [*SPIKY, "--train.spike_policy", "rollback", "--train.spike_patience", "2"]
    rollback += ["--train.spike_rewarmup", "4"]
    flat = ["--train.schedule", "constant", "--train.warmup_ratio", "0", "--checkpoint.keep_last", "4"]
    plant("11,12x20")
    run_dir = tmp_path / "run"
    assert launch(None, recipe(dataset, 16, *rollback, *flat), run_dir, False) == 0
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    after = [r["lr"] for r in records[12:]]  # steps 10.. after the rollback to step 9
    assert after == pytest.approx([3e-3 * k / 4 for k in (1, 2, 3, 4)] + [3e-3] * 3)
