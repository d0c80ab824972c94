"""train.float8: refused in one line before step 1 where it cannot run (no torchao, a device without float8 matmuls,
a precision or layout it does not combine with); the layer choice where torchao is installed."""

from __future__ import annotations

import sys
import types

import pytest
import torch

from dlx import device as dev
from dlx.errors import UserError
from dlx.model import resolve_model_args
from dlx.model.llama import Transformer
from dlx.parallel import float8
from dlx.train.recipe import load_recipe
from dlx.train.trainer import pretrain
from train_helpers import TINY

FLOAT8 = [*TINY, "--train.max_steps", "1", "--train.float8", "true"]


@pytest.fixture
def torchao_importable(monkeypatch):
    """An importable `torchao.float8`, so that the checks after the installation check are reached."""
    package, module = types.ModuleType("torchao"), types.ModuleType("torchao.float8")
    package.float8 = module
    monkeypatch.setitem(sys.modules, "torchao", package)
    monkeypatch.setitem(sys.modules, "torchao.float8", module)


@pytest.mark.parametrize(
    ("overrides", "why"),
    [
        (["--train.precision", "fp32"], "precision fp32"),
        (["--train.precision", "fp16"], "precision fp16"),
        (["--parallel.strategy", "deepspeed", "--train.precision", "bf16"], "deepspeed"),
        (["--parallel.tp", "2", "--train.precision", "bf16", "--model.n_kv_heads", "2"], "tp 2"),
    ],
)
def test_float8_with_a_precision_or_layout_it_does_not_take_is_one_line(overrides, why):
    with pytest.raises(UserError) as refused:
        load_recipe(None, [*FLOAT8, *overrides])
    assert str(refused.value) == (
        "recipe: train.float8 runs with train.precision bf16 (or auto), parallel.strategy none, ddp or fsdp and "
        "parallel.tp 1; set train.float8 false or change those"
    ), why


def test_without_torchao_it_is_one_line_before_anything_is_written(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "torchao", None)  # import torchao raises ImportError
    with pytest.raises(
        UserError, match=r"^train.float8 needs torchao, which is not installed: pip install 'dlx\[float8\]'$"
    ):
        pretrain(load_recipe(None, [*FLOAT8, "--train.precision", "bf16"]), "t", tmp_path / "run")
    assert not (tmp_path / "run").exists()


@pytest.mark.usefixtures("torchao_importable")
def test_on_a_cpu_it_is_one_line_before_step_one(tmp_path):
    with pytest.raises(UserError) as refused:
        pretrain(load_recipe(None, [*FLOAT8, "--train.precision", "bf16"]), "t", tmp_path / "run")
    assert str(refused.value) == (
        "train.float8: cpu has no float8 matmuls; set train.float8 false (bf16 trains everywhere)"
    )
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_gpus_before_compute_capability_8_9_have_no_float8(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device: "NVIDIA A100-SXM4-80GB")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device: (8, 0))
    assert dev.float8_capability(torch.device("cuda", 0)) == (
        "NVIDIA A100-SXM4-80GB is compute capability 8.0; float8 needs 8.9 or later"
    )
    for capability in ((8, 9), (9, 0), (10, 0)):
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device, c=capability: c)
        assert dev.float8_capability(torch.device("cuda", 0)) is None


def test_torchao_chooses_the_layers_and_never_the_output_head(monkeypatch):
    """With torchao installed: its filter on llama3.2-1b's shapes (on the meta device: nothing is allocated)."""
    pytest.importorskip("torchao.float8")
    monkeypatch.setattr(float8, "check_float8_device", lambda device: None)
    with torch.device("meta"):
        model = Transformer(resolve_model_args("llama3.2-1b", n_layers=1))
    tensorwise = float8.apply_float8(model, "tensorwise", torch.device("meta"))
    assert sorted(tensorwise) == sorted(
        f"layers.0.{n}"
        for n in ("attention.wq", "attention.wo", "feed_forward.w1", "feed_forward.w2", "feed_forward.w3")
    )
    with torch.device("meta"):
        model = Transformer(resolve_model_args("llama3.2-1b", n_layers=1))
    assert sorted(float8.apply_float8(model, "rowwise", torch.device("meta"))) == [
        "layers.0.feed_forward.w1",
        "layers.0.feed_forward.w3",
    ]
