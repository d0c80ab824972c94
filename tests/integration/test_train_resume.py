"""Checkpoints and --resume: bit-identical losses on CPU fp32, fall-back past a damaged checkpoint, keep_last."""

from __future__ import annotations

import json
import pickle
import shutil

import pytest

from dlx.errors import UserError
from dlx.model.io import load_model
from dlx.train.loop.trainer import pretrain
from dlx.train.recipe import load_recipe
from dlx.train.rundir.checkpoint import DamagedCheckpoint, list_checkpoints, read_checkpoint
from train_helpers import TINY, losses, make_dataset

STEPS = ["--train.max_steps", "8", "--checkpoint.every", "4", "--train.grad_accum", "2"]

pytestmark = pytest.mark.usefixtures("in_process_training")


def run(run_dir, *extra, resume=False):
    return pretrain(load_recipe(None, [*TINY, *STEPS, *extra]), "t", run_dir, resume=resume)


def resume_from_step_4(full, copy):
    """A copy of a finished run that keeps only its step-4 checkpoint and the records up to it, then resumed."""
    shutil.copytree(full, copy)
    shutil.rmtree(copy / "checkpoints" / "step-00000008")
    return copy


def test_resume_is_bit_identical_on_synthetic_data(tmp_path):
    run(tmp_path / "full")
    resumed = resume_from_step_4(tmp_path / "full", tmp_path / "resumed")
    result = run(resumed, resume=True)
    assert result.step == 8
    assert losses(resumed) == losses(tmp_path / "full")  # exact float equality, every step 1..8
    assert [r["step"] for r in result.records] == list(range(1, 9))  # the report covers the whole run


def test_resume_is_bit_identical_with_the_token_loader(tmp_path):
    data = make_dataset(tmp_path / "data")
    extra = ["--data.path", str(data), "--data.num_workers", "1", "--eval.every", "4", "--eval.batches", "2"]
    run(tmp_path / "full", *extra)
    resumed = resume_from_step_4(tmp_path / "full", tmp_path / "resumed")
    run(resumed, *extra, resume=True)
    assert losses(resumed) == losses(tmp_path / "full")
    assert (resumed / "tokenizer.json").is_file()


def test_a_truncated_newest_checkpoint_falls_back_to_the_previous_one(tmp_path, capsys):
    run(tmp_path / "full")
    damaged = tmp_path / "damaged"
    shutil.copytree(tmp_path / "full", damaged)
    weights = damaged / "checkpoints" / "step-00000008" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    result = run(damaged, resume=True)
    err = capsys.readouterr().err
    assert "step-00000008 is damaged" in err and "falling back" in err
    assert result.step == 8 and losses(damaged) == losses(tmp_path / "full")
    assert (damaged / "checkpoints" / "step-00000008.damaged" / "model.safetensors").stat().st_size == 1000


@pytest.mark.filterwarnings("ignore:Detected pickle protocol")
def test_a_pickled_payload_is_refused_without_running_it(tmp_path, capsys):
    run(tmp_path / "full")
    marker = tmp_path / "pwned"

    class Payload:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    newest = list_checkpoints(tmp_path / "full")[0]
    planted = pickle.dumps({"optimizer": Payload()})
    (newest / "train_state.pt").write_bytes(planted)
    state = json.loads((newest / "trainer_state.json").read_text())
    state["files"]["train_state.pt"] = len(planted)  # so that only the loading can catch it
    (newest / "trainer_state.json").write_text(json.dumps(state))
    with pytest.raises(DamagedCheckpoint, match=r"weights_only"):
        read_checkpoint(newest)
    assert not marker.exists()
    run(tmp_path / "full", resume=True)  # falls back to step 4 and trains to 8 again
    assert "train_state.pt refused by torch.load(weights_only=True)" in capsys.readouterr().err
    assert not marker.exists()


def test_checkpoint_layout_keep_last_and_model_folder(tmp_path):
    run(tmp_path / "r", "--checkpoint.every", "2", "--checkpoint.keep_last", "2")
    names = [p.name for p in list_checkpoints(tmp_path / "r")]
    assert names == ["step-00000008", "step-00000006"]
    files = {p.name for p in (tmp_path / "r" / "checkpoints" / "step-00000008").iterdir()}
    assert files == {"model.safetensors", "model_args.json", "train_state.pt", "trainer_state.json"}
    assert load_model(tmp_path / "r" / "checkpoints" / "step-00000008").args.dim == 64
    assert not list((tmp_path / "r" / "checkpoints").glob(".*"))  # no temporary folders left


def test_resume_refuses_a_different_run(tmp_path):
    run(tmp_path / "r")
    with pytest.raises(UserError, match=r"train\.lr is 0\.001 but the run was started with 0\.003"):
        run(tmp_path / "r", "--train.lr", "1e-3", resume=True)
    with pytest.raises(UserError, match="already exists and holds a run; add --resume"):
        run(tmp_path / "r")


def test_a_failed_save_is_one_line_and_leaves_the_previous_checkpoint(tmp_path, monkeypatch):
    import errno

    from dlx.train.rundir import checkpoint

    real, calls = checkpoint.write_weight_dict, {"n": 0}

    def write_weight_dict(state, args, folder):
        calls["n"] += 1
        if calls["n"] == 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        real(state, args, folder)

    monkeypatch.setattr(checkpoint, "write_weight_dict", write_weight_dict)
    with pytest.raises(UserError, match=r"cannot save checkpoint step-00000008: No space left on device; the prev"):
        run(tmp_path / "r")
    assert [p.name for p in list_checkpoints(tmp_path / "r")] == ["step-00000004"]
    assert not list((tmp_path / "r" / "checkpoints").glob(".*"))
    read_checkpoint(tmp_path / "r" / "checkpoints" / "step-00000004")
