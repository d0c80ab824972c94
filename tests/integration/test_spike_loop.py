"""train.spike_policy rollback on a run that keeps spiking: skips accumulate over rollbacks (no skipped data is read
again), the number of rollbacks is bounded (then one line), the rollback event names the loader positions it
skipped, metrics.jsonl marks the abandoned branch and the skipped updates, and set-aside checkpoints count toward
checkpoint.keep_last. Spikes are planted with DLX_FAULT_SPIKE (dlx.faults)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from dlx import faults
from dlx.errors import UserError
from dlx.train.launch import launch
from dlx.train.rundir.checkpoint import list_checkpoints, read_checkpoint

pytestmark = pytest.mark.usefixtures("in_process_training")

SMALL = [
    "--model.preset", "debug", "--model.dim", "32", "--model.n_layers", "1", "--model.vocab_size", "64",
    "--model.n_heads", "2", "--model.n_kv_heads", "1",
    "--data.path", "synthetic", "--data.seq_len", "16", "--data.micro_batch_size", "2",
    "--train.precision", "fp32", "--train.lr", "3e-3", "--train.max_steps", "16",
    "--train.spike_policy", "rollback", "--train.spike_window", "8", "--train.spike_sigma", "6",
    "--train.spike_patience", "2", "--log.every", "1", "--log.progress", "false",
]  # fmt: skip


@pytest.fixture
def plant(monkeypatch):
    def at(spec: str) -> None:
        monkeypatch.setenv(faults.SPIKE_ENV, spec)
        monkeypatch.setattr(faults, "_arrivals", {})

    return at


def records(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def events(run_dir: Path, kind: str) -> list[dict]:
    lines = (run_dir / "events.jsonl").read_text().splitlines()
    return [e for e in map(json.loads, lines) if e["event"] == kind]


def position(sequences: int) -> dict:
    return {"kind": "synthetic", "sequences": sequences}


def test_skips_accumulate_over_rollbacks_to_the_same_checkpoint(tmp_path, plant):
    only_step_9 = ["--checkpoint.every", "9"]  # steps 9 and 16: both rollbacks go back to step 9
    clean, rolled = tmp_path / "clean", tmp_path / "rolled"
    assert launch(None, [*SMALL, *only_step_9], clean, False) == 0
    plant("11,12,13,14x20")  # 11, 12 spike; after the first rollback 13, 14 (11 and 12 once only)
    assert launch(None, [*SMALL, *only_step_9], rolled, False) == 0
    first, second = events(rolled, "rollback")
    assert (first["skipped_steps"], second["skipped_steps"]) == ([11, 12], [13, 14])
    assert first["to_step"] == second["to_step"] == 9
    assert first["skipped_loader"] == {"from": position(20), "to": position(24)}  # 2 sequences a step
    assert second["skipped_loader"] == {"from": position(28), "to": position(32)}  # the first skip stays skipped
    kept = {r["step"]: r for r in records(rolled) if not r.get("abandoned")}
    clean_losses = {r["step"]: r["loss"] for r in records(clean)}
    assert kept[10]["loss"] == clean_losses[10]  # step 10 on its own batch, from the same weights
    assert kept[11]["loss"] != clean_losses[11]  # step 11 does not read step 11's skipped batch again
    assert sorted(kept) == list(range(1, 17))
    abandoned = [(r["step"], r.get("skipped_updates")) for r in records(rolled) if r.get("abandoned")]
    assert abandoned == [(10, None), (11, [11]), (12, [12]), (10, None), (11, None), (12, None), (13, [13]), (14, [14])]
    state = read_checkpoint(list_checkpoints(rolled)[0]).state
    assert state.loader == position((16 + 4) * 2)
    assert state.observers["spikes"]["counts"] == {"spikes": 4, "skipped": 4, "rollbacks": 2}


def test_a_run_that_keeps_spiking_stops_after_the_allowed_rollbacks(tmp_path, plant):
    plant("11,12x20*")  # every time the run reaches them
    run_dir = tmp_path / "run"
    loop = [*SMALL, "--checkpoint.every", "3", "--checkpoint.keep_last", "2", "--train.spike_max_rollbacks", "3"]
    with pytest.raises(UserError) as stopped:
        launch(None, loop, run_dir, False)
    message = str(stopped.value)
    assert "\n" not in message and "after 3 rollbacks (train.spike_max_rollbacks)" in message
    back = events(run_dir, "rollback")
    assert [e["rollbacks"] for e in back] == [1, 2, 3] and {e["to_step"] for e in back} == {9}
    folders = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    assert folders == ["step-00000009", "step-00000012"]  # keep_last 2 counts the set-aside ones: they went first

    shutil.rmtree(run_dir / "checkpoints" / "step-00000012")  # resumed from the checkpoint saved before the rollbacks
    plant("11,12x20*")
    with pytest.raises(UserError, match=r"after 3 rollbacks \(train.spike_max_rollbacks\)"):
        launch(None, loop, run_dir, True)  # the run's own history counts, not the older checkpoint's
    assert len(events(run_dir, "rollback")) == 3  # no fourth rollback on a restart


STAGED = ["--train.max_steps", "20", "--checkpoint.every", "9", "--data.stages", json.dumps([{"until": 10}, {}])]
"""Stage 0: steps 1-10, stage 1: 11-20; checkpoints at 9 and 18."""


def test_a_staged_run_rolls_back_within_a_stage_and_keeps_its_boundaries(tmp_path, plant):
    clean, rolled = tmp_path / "clean", tmp_path / "rolled"
    assert launch(None, [*SMALL, *STAGED], clean, False) == 0
    plant("12,13x20")  # in stage 1; the newest checkpoint before them (9) is in stage 0
    assert launch(None, [*SMALL, *STAGED], rolled, False) == 0
    (rollback,) = events(rolled, "rollback")
    assert (rollback["skipped_steps"], rollback["to_step"]) == ([12, 13], 9)
    kept = {r["step"]: r for r in records(rolled) if not r.get("abandoned")}
    clean_records = {r["step"]: r for r in records(clean)}
    assert sorted(kept) == list(range(1, 21))
    assert {s: r["stage"] for s, r in kept.items()} == {s: r["stage"] for s, r in clean_records.items()}
    assert {s: r["stage"] for s, r in kept.items()} == {s: int(s > 10) for s in range(1, 21)}  # boundary unmoved
    for step in (10, 11):  # replayed across the boundary on their own batches
        assert kept[step]["loss"] == clean_records[step]["loss"]
    assert kept[12]["loss"] != clean_records[12]["loss"]  # step 12 reads what followed step 13's skipped batch
    state = read_checkpoint(list_checkpoints(rolled)[0]).state.loader
    assert (state["step"], state["stage"]) == (20, 1)
    assert state["loader"] == position((10 + 2) * 2)  # stage 1's source: its 10 steps and the 2 skipped


def test_spikes_straddling_a_stage_boundary_are_skipped_not_rolled_back(tmp_path, plant, capsys):
    plant("10,11x20")  # step 10 in stage 0, step 11 in stage 1
    assert launch(None, [*SMALL, *STAGED], tmp_path / "run", False) == 0
    said = capsys.readouterr()
    assert events(tmp_path / "run", "rollback") == []
    message = "spikes at steps 10-11: no rollback, they cross the boundary of data.stages[1] (step 11); going on"
    assert message in said.out + said.err
    skipped = {r["step"]: r.get("skipped_updates") for r in records(tmp_path / "run")}
    assert (skipped[10], skipped[11]) == ([10], [11]) and sorted(skipped) == list(range(1, 21))
