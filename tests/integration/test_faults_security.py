"""Fault matrix, security: a checkpoint is data. Pickles planted in every file a load path reads (DCP's `.metadata`,
DCP's non-tensor entries, train_state.pt, model.safetensors, DeepSpeed's state files) and in files other frameworks
would read are refused or never opened, through every command that reads a checkpoint (`--resume`, `dlx generate`,
`dlx eval`, `dlx export-hf`, `model.init_from`), and the payload never runs (it would write a marker file)."""

from __future__ import annotations

import json
import pickle
import shutil
from pathlib import Path

import pytest
import torch

from dlx.errors import UserError
from dlx.model.io import load_model
from dlx.parallel import dcp
from dlx.train.rundir.checkpoint import (
    DamagedCheckpoint,
    find_resumable,
    list_checkpoints,
    load_checkpoint_model,
    read_checkpoint,
)
from dlx.train.rundir.trained import resolve_trained
from train_helpers import TINY, train_quietly

pytestmark = [pytest.mark.faults]


class Payload:
    """Unpickled, it writes `marker`: the proof that a load ran code."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.write_text, (self.marker, "ran"))


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("security") / "run"
    return train_quietly([*TINY, "--train.max_steps", "2", "--checkpoint.every", "1", "--eval.every", "0"], run_dir)


@pytest.fixture
def run_dir(trained, tmp_path) -> Path:
    return Path(shutil.copytree(trained, tmp_path / "run"))


def record(checkpoint: Path, **changes) -> None:
    """trainer_state.json rewritten as a planter would: the planted files' sizes recorded, hashes dropped."""
    state = json.loads((checkpoint / "trainer_state.json").read_text())
    files = {str(f.relative_to(checkpoint)): f.stat().st_size for f in sorted(checkpoint.rglob("*")) if f.is_file()}
    files.pop("trainer_state.json")
    state.update(files=files, **changes)
    state.pop("sha256", None)
    (checkpoint / "trainer_state.json").write_text(json.dumps(state))


def plant_dcp_metadata(checkpoint: Path, marker: Path) -> None:
    """The checkpoint turned into a DCP one (no model.safetensors) whose `.metadata` is a planted pickle."""
    (checkpoint / "model.safetensors").unlink()
    (checkpoint / "dcp").mkdir()
    (checkpoint / "dcp" / ".metadata").write_bytes(pickle.dumps(Payload(marker)))
    record(checkpoint, format="dcp", full_weights=False)


def test_planted_dcp_metadata_runs_nothing_on_any_load_path(run_dir, tmp_path):
    marker = tmp_path / "ran"
    newest, previous = list_checkpoints(run_dir)[:2]
    plant_dcp_metadata(newest, marker)
    with pytest.raises(DamagedCheckpoint, match=r"\.metadata refused: it names pathlib\.Path\.write_text"):
        read_checkpoint(newest)  # --resume, --resume auto
    notes = []
    assert find_resumable(run_dir, say=notes.append).path == previous  # and `dlx generate RUN`
    assert "is damaged" in notes[0] and "refused" in notes[0]
    with pytest.raises(UserError, match=r"\.metadata refused: it names pathlib\.Path\.write_text"):
        load_checkpoint_model(newest)  # dlx generate, dlx eval, dlx export-hf CHECKPOINT
    with pytest.raises(UserError, match=r"metadata cannot be read .*refused"):
        resolve_trained(newest, "model.init_from").check()  # model.init_from
    assert not marker.exists(), "a planted pickle ran"


def test_export_hf_refuses_a_planted_dcp_metadata_in_one_line(run_dir, tmp_path, capsys, monkeypatch):
    """Through the console command's own argument handling and error line, in this process."""
    from dlx.cli.app import main

    marker = tmp_path / "ran"
    newest = list_checkpoints(run_dir)[0]
    plant_dcp_metadata(newest, marker)
    monkeypatch.setattr("sys.argv", ["dlx", "export-hf", str(newest), str(tmp_path / "hf")])
    with pytest.raises(SystemExit) as exit_:
        main()
    out, err = capsys.readouterr()
    lines = [line for line in (out + err).splitlines() if line.strip()]
    assert exit_.value.code == 2 and len(lines) == 1, lines
    assert lines[0].startswith("error: ") and "refused: it names pathlib.Path.write_text" in lines[0]
    assert not marker.exists() and not (tmp_path / "hf").exists()


def tiny_state() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.25)
    model(torch.randn(2, 4)).sum().backward()
    optimizer.step()
    return model, optimizer


def test_dcp_checkpoints_still_load_through_the_checked_reader(tmp_path):
    model, optimizer = tiny_state()
    dcp.save(model, optimizer, tmp_path / "dcp")
    fresh = torch.nn.Linear(4, 3)
    fresh_optimizer = torch.optim.AdamW(fresh.parameters(), lr=1.0)
    dcp.load(fresh, fresh_optimizer, tmp_path / "dcp")
    assert torch.equal(fresh.weight, model.weight) and torch.equal(fresh.bias, model.bias)
    assert fresh_optimizer.param_groups[0]["lr"] == 0.25  # a non-tensor (bytes) entry, read weights-only
    assert dcp.stored_shapes(tmp_path / "dcp") == {"weight": (3, 4), "bias": (3,)}


def test_planted_dcp_byte_entry_is_refused_without_running(tmp_path):
    model, optimizer = tiny_state()
    marker = tmp_path / "ran"
    state = dcp.training_state(model, optimizer)
    state[dcp.OPTIMIZER_KEY]["param_groups"][0]["lr"] = Payload(marker)  # written by torch.save as a byte entry
    import torch.distributed.checkpoint as torch_dcp

    torch_dcp.save(state, checkpoint_id=tmp_path / "dcp", no_dist=True)
    with pytest.raises(UserError, match=r"param_groups\.0\.lr refused by torch\.load\(weights_only=True\): it names"):
        dcp.load(model, optimizer, tmp_path / "dcp")
    assert not marker.exists(), "a planted pickle ran"


@pytest.mark.filterwarnings("ignore:Detected pickle protocol")
def test_planted_pickles_in_full_checkpoints_are_refused_without_running(run_dir, tmp_path):
    newest, previous = list_checkpoints(run_dir)[:2]
    marker = tmp_path / "ran"
    payload = pickle.dumps({"state": Payload(marker)})
    for name in ("pytorch_model.bin", "optimizer.pt", "model.pt", "rng_state.pth", "scheduler.pkl"):
        (newest / name).write_bytes(payload)  # files other frameworks read with torch.load: dlx never opens them
    load_model(newest)
    assert read_checkpoint(newest).state.step == 2
    (newest / "train_state.pt").write_bytes(payload)
    record(newest)
    with pytest.raises(DamagedCheckpoint, match=r"refused by torch\.load\(weights_only=True\)"):
        read_checkpoint(newest)
    (newest / "model.safetensors").write_bytes(payload)  # in place of the weights, the size recorded updated
    record(newest)
    with pytest.raises(DamagedCheckpoint, match="unreadable"):
        read_checkpoint(newest)
    with pytest.raises(Exception, match=r"(?i)safetensor|header"):
        load_model(newest)
    assert find_resumable(run_dir, say=lambda message: None).path == previous
    assert not marker.exists(), "a planted pickle ran"


def test_deepspeed_state_files_are_read_weights_only(run_dir, tmp_path):
    pytest.importorskip("deepspeed")
    from deepspeed.runtime.checkpoint_engine import TorchCheckpointEngine
    from deepspeed.runtime.fp16.loss_scaler import LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum
    from deepspeed.utils.tensor_fragment import fragment_address

    from dlx.parallel.strategy import deepspeed_weights_only

    engine = type("Engine", (), {})()
    engine.checkpoint_engine = TorchCheckpointEngine()
    state = {"zero_stage": ZeroStageEnum.optimizer_states, "scaler": LossScaler(1.0), "x": torch.ones(2)}
    state["address"] = fragment_address(numel=2, start=0)  # what ZeRO's optimizer files hold besides tensors
    torch.save(state, tmp_path / "zero_pp_rank_0_mp_rank_00_optim_states.pt")
    marker = tmp_path / "ran"
    torch.save({"optimizer_state_dict": Payload(marker)}, tmp_path / "planted.pt")
    with deepspeed_weights_only(engine):
        loaded = engine.checkpoint_engine.load(str(tmp_path / "zero_pp_rank_0_mp_rank_00_optim_states.pt"))
        assert loaded["zero_stage"] == ZeroStageEnum.optimizer_states and torch.equal(loaded["x"], torch.ones(2))
        with pytest.raises(UserError, match=r"planted\.pt refused by torch\.load\(weights_only=True\): it names get"):
            engine.checkpoint_engine.load(str(tmp_path / "planted.pt"))
    assert engine.checkpoint_engine.load.__func__ is TorchCheckpointEngine.load  # DeepSpeed's own method again
    newest, previous = list_checkpoints(run_dir)[:2]  # as a DeepSpeed checkpoint: rank 0 checks before the ranks load
    (newest / "deepspeed" / "state").mkdir(parents=True)
    shutil.copy(tmp_path / "planted.pt", newest / "deepspeed" / "state" / "zero_pp_rank_0_mp_rank_00_optim_states.pt")
    record(newest, format="deepspeed")
    with pytest.raises(DamagedCheckpoint, match=r"optim_states\.pt refused by torch\.load\(weights_only=True\)"):
        read_checkpoint(newest)
    assert find_resumable(run_dir, say=lambda line: None).path == previous
    assert not marker.exists(), "a planted pickle ran"
