"""Optimizer groups, the learning-rate schedule, precision choice and gradient accumulation."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from dlx import precision as precision_mod
from dlx.metrics.timing import PhaseTimer
from dlx.model.llama import Transformer
from dlx.model.presets import resolve_model_args
from dlx.parallel.distributed import DistEnv
from dlx.parallel.strategy import Strategy
from dlx.precision import build_precision
from dlx.train.build.optim import LRSchedule, build_optimizer, param_groups
from dlx.train.config import TrainSection
from dlx.train.loop.trainer import accumulate_gradients
from train_helpers import single_torch_thread


@pytest.fixture(autouse=True)
def _one_thread():
    yield from single_torch_thread()


def debug_model(**overrides) -> Transformer:
    torch.manual_seed(0)
    return Transformer(resolve_model_args("debug", **overrides))


def test_norms_and_embedding_are_not_decayed():
    model = debug_model(tie_embeddings=True)
    decay, no_decay = param_groups(model, 0.1)
    names = {id(p): n for n, p in model.named_parameters()}
    assert all(p.ndim == 2 and "tok_embeddings" not in names[id(p)] for p in decay["params"])
    assert {names[id(p)] for p in no_decay["params"]} >= {"tok_embeddings.weight", "norm.weight"}
    assert no_decay["weight_decay"] == 0.0 and decay["weight_decay"] == 0.1
    n_grouped = sum(p.numel() for g in (decay, no_decay) for p in g["params"])
    assert n_grouped == sum(p.numel() for p in model.parameters())  # the tied output projection counted once


def test_optimizer_is_fused_on_cpu():
    optimizer = build_optimizer(debug_model(), TrainSection(), torch.device("cpu"))
    assert optimizer.defaults["fused"] is True


@pytest.mark.parametrize("kind", ["cosine", "linear", "constant"])
def test_schedule_warms_up_then_decays_to_min_lr(kind):
    cfg = TrainSection(lr=1e-3, min_lr=1e-4, warmup_ratio=0.1, schedule=kind)
    schedule = LRSchedule(cfg, total_steps=100)
    factors = [schedule(step) for step in range(100)]
    assert factors[0] == pytest.approx(0.1) and factors[9] == pytest.approx(1.0)
    assert all(a < b for a, b in itertools.pairwise(factors[:10]))
    if kind == "constant":
        assert factors[-1] == 1.0
    else:
        assert factors[-1] == pytest.approx(0.1)  # min_lr / lr at the last step
        assert all(a >= b for a, b in itertools.pairwise(factors[9:]))
    if kind == "cosine":
        assert schedule(10 + 89 // 2) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 44 / 89)))


def test_auto_precision_follows_native_bf16(monkeypatch):
    cpu = torch.device("cpu")
    monkeypatch.setattr(precision_mod.dev, "supports_native_bf16", lambda device: True)
    assert build_precision("auto", cpu).name == "bf16"
    monkeypatch.setattr(precision_mod.dev, "supports_native_bf16", lambda device: False)
    assert build_precision("auto", cpu).name == "fp32"
    assert build_precision("fp16", cpu).scaler is not None and build_precision("bf16", cpu).scaler is None


def test_accumulating_4_micro_batches_of_2_gives_the_gradients_of_one_batch_of_8():
    torch.manual_seed(1)
    tokens = torch.randint(0, 512, (8, 17))
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    precision = build_precision("fp32", torch.device("cpu"))

    def grads(micro: int) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        model = debug_model()
        batches = iter([(inputs[i : i + micro], targets[i : i + micro]) for i in range(0, 8, micro)])
        strategy = Strategy(model, model, torch.optim.SGD(model.parameters(), lr=0.0), precision, 0.0, DistEnv())
        loss = accumulate_gradients(model, batches, 8 // micro, precision, PhaseTimer(torch.device("cpu")), strategy)
        return loss, {n: p.grad.clone() for n, p in model.named_parameters()}

    loss_8, grads_8 = grads(8)
    loss_2, grads_2 = grads(2)
    torch.testing.assert_close(loss_2, loss_8, rtol=1e-6, atol=1e-6)
    for name, grad in grads_8.items():
        torch.testing.assert_close(grads_2[name], grad, rtol=1e-5, atol=1e-7, msg=name)
