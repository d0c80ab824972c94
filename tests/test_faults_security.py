"""Fault matrix, security: checkpoints are read through safetensors and torch.load(weights_only=True) only, and
pickled payloads planted in a checkpoint folder are refused (or never read) without running.

test_train_resume.py plants one in train_state.pt and resumes past it; here, every file a user might expect dlx to
read, and a scan of the source for every way Python can unpickle."""

from __future__ import annotations

import ast
import json
import pickle
from pathlib import Path

import pytest

import dlx
from dlx.model.io import load_model
from dlx.train.checkpoint import DamagedCheckpoint, find_resumable, list_checkpoints, read_checkpoint
from dlx.train.recipe import load_recipe
from dlx.train.trainer import pretrain
from train_helpers import TINY

pytestmark = [pytest.mark.faults, pytest.mark.usefixtures("in_process_training")]

SOURCE = Path(dlx.__file__).parent
UNPICKLERS = {
    ("pickle", "load"),
    ("pickle", "loads"),
    ("pickle", "Unpickler"),
    ("dill", "load"),
    ("joblib", "load"),
    ("torch", "load"),
    ("yaml", "load"),
    ("yaml", "unsafe_load"),
    ("np", "load"),
    ("numpy", "load"),
}


def _dotted(node: ast.AST) -> tuple[str, str] | None:
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
        return node.value.id, node.attr
    return None


def _is_safe(call: ast.Call, name: tuple[str, str]) -> bool:
    keywords = {k.arg: k.value for k in call.keywords}
    if name == ("torch", "load"):
        return isinstance(keywords.get("weights_only"), ast.Constant) and keywords["weights_only"].value is True
    if name[1] == "load" and name[0] in ("np", "numpy"):
        return "allow_pickle" not in keywords or getattr(keywords["allow_pickle"], "value", True) is False
    return False


def test_the_source_unpickles_nothing():
    """Every torch.load says weights_only=True; no pickle, dill, joblib, unsafe YAML or pickling numpy load."""
    found = []
    for path in sorted(SOURCE.rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module in ("pickle", "dill", "joblib", "cloudpickle"):
                found.append(f"{path.relative_to(SOURCE)}:{node.lineno}: from {node.module} import ...")
            if isinstance(node, ast.Call) and (name := _dotted(node.func)) in UNPICKLERS and not _is_safe(node, name):
                found.append(f"{path.relative_to(SOURCE)}:{node.lineno}: {'.'.join(name)}(...)")
    assert not found, found


class Payload:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.write_text, (self.marker, "ran"))


@pytest.mark.filterwarnings("ignore:Detected pickle protocol")
def test_planted_pickles_are_refused_without_running(tmp_path):
    run_dir = tmp_path / "run"
    pretrain(load_recipe(None, [*TINY, "--train.max_steps", "2", "--checkpoint.every", "1"]), "t", run_dir)
    newest, previous = list_checkpoints(run_dir)[:2]
    marker = tmp_path / "ran"
    payload = pickle.dumps({"state": Payload(marker)})
    for name in ("pytorch_model.bin", "optimizer.pt", "model.pt", "rng_state.pth", "scheduler.pkl"):
        (newest / name).write_bytes(payload)  # files other frameworks read with torch.load: dlx never opens them
    load_model(newest)
    assert read_checkpoint(newest).state.step == 2
    (newest / "model.safetensors").write_bytes(payload)  # in place of the weights, the size recorded updated
    state = json.loads((newest / "trainer_state.json").read_text())
    state["files"]["model.safetensors"] = len(payload)
    (newest / "trainer_state.json").write_text(json.dumps(state))
    with pytest.raises(DamagedCheckpoint, match="unreadable"):
        read_checkpoint(newest)
    with pytest.raises(Exception, match=r"(?i)safetensor|header"):
        load_model(newest)
    assert find_resumable(run_dir, say=lambda message: None).path == previous
    assert not marker.exists(), "a planted pickle ran"
