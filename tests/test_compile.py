"""Compile without surprises: every block is one graph (a graph break is an error), nothing recompiles after the first
step, and the flex_attention document mask keeps one graph across batches. Dynamo decides graph breaks and
recompiles before any backend runs, so the tests compile with the `eager` backend: seconds instead of minutes of
C++ compilation, the same guards."""

from __future__ import annotations

import functools

import pytest
import torch
from torch._dynamo.utils import counters

import dlx.model.document_mask as document_mask
from dlx.model import resolve_model_args
from dlx.model.llama import Transformer
from dlx.parallel.config import ParallelConfig
from dlx.parallel.distributed import DistEnv
from dlx.parallel.wrap import parallelize
from train_helpers import single_torch_thread

one_thread = pytest.fixture(autouse=True)(single_torch_thread)


@pytest.fixture(autouse=True)
def eager_backend(monkeypatch):
    """torch.compile (and nn.Module.compile, which calls it) with the eager backend, from a fresh Dynamo."""
    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend="eager"))
    torch._dynamo.reset()
    counters.clear()
    yield
    torch._dynamo.reset()


def compiled_model(checkpointing: str) -> Transformer:
    torch.manual_seed(0)
    model = Transformer(resolve_model_args("debug"))
    config = ParallelConfig(activation_checkpointing=checkpointing)
    return parallelize(model, config, True, torch.device("cpu"), DistEnv(), "bf16")


@pytest.mark.parametrize("checkpointing", ["none", "full"])
def test_training_steps_compile_once_without_graph_breaks(checkpointing):
    model = compiled_model(checkpointing)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    generator = torch.Generator().manual_seed(1)
    for step in range(3):
        tokens = torch.randint(0, 512, (2, 33), generator=generator)
        with torch._dynamo.config.patch(error_on_recompile=step > 0), torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(tokens[:, :-1], targets=tokens[:, 1:], z_loss=1e-4).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    assert dict(counters["graph_break"]) == {}
    assert counters["stats"]["unique_graphs"] >= 2  # the blocks' graph and the loss math's: both compiled


def test_a_graph_break_in_a_block_is_an_error(monkeypatch):
    """fullgraph=True: what would split a block into eager pieces stops the run instead."""
    model = compiled_model("none")

    def silu_that_prints(x: torch.Tensor) -> torch.Tensor:
        print("a side effect Dynamo cannot put in a graph")
        return torch.sigmoid(x) * x

    monkeypatch.setattr("dlx.model.llama.F.silu", silu_that_prints)
    with pytest.raises(torch._dynamo.exc.Unsupported):
        model(torch.zeros(1, 8, dtype=torch.long))


def test_the_flex_document_mask_compiles_once_across_batches(monkeypatch):
    """Each batch brings a new BlockMask over new document ids (a new mask closure): the compiled blocks keep their
    one graph. CPU flex_attention has no backward, so forward only."""
    monkeypatch.setattr(document_mask, "uses_flex", lambda device: True)
    model = compiled_model("none")
    generator = torch.Generator().manual_seed(2)
    for step in range(3):
        tokens = torch.randint(0, 512, (2, 129), generator=generator)
        ids = torch.randint(0, 3, (2, 128), generator=generator).sort(dim=1).values
        ids -= ids[:, :1].clone()  # ids count from 0 along each row
        with torch._dynamo.config.patch(error_on_recompile=step > 0), torch.no_grad():
            parts = model(tokens[:, :-1], targets=tokens[:, 1:], document_ids=ids)
        assert torch.isfinite(parts.loss)
    assert dict(counters["graph_break"]) == {}
