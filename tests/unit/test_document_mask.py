"""Document masking: a packed window with masking computes what its documents compute one by one; off, today's model."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from dlx.data.loader import document_ids
from dlx.model import document_mask as document_mask_module
from dlx.model.document_mask import positions_in_documents
from dlx.model.llama import Transformer
from dlx.model.presets import resolve_model_args
from train_helpers import single_torch_thread

EOS = 3
LENGTHS = (5, 11, 1, 9, 12)
"""Documents of a packed window of 32 tokens: the last runs on past the window's end, as in a real window."""


@pytest.fixture(autouse=True)
def _one_thread():
    yield from single_torch_thread()


@pytest.fixture(scope="module")
def model() -> Transformer:
    torch.manual_seed(0)
    args = resolve_model_args("debug", n_heads=4, n_kv_heads=2, max_seq_len=64)  # grouped-query attention
    return Transformer(args).eval()


def packed_window() -> tuple[torch.Tensor, torch.Tensor]:
    """(inputs, targets) of shape (1, 32): documents of LENGTHS tokens, each ended by EOS, cut at 32 like a window."""
    generator = torch.Generator().manual_seed(1)
    bodies = [torch.randint(4, 512, (n - 1,), generator=generator) for n in LENGTHS]
    documents = [torch.cat([body, torch.tensor([EOS])]) for body in bodies]
    stream = torch.cat(documents)[:33]
    return stream[None, :-1], stream[None, 1:]


def test_document_ids_and_positions_restart_after_each_eos():
    inputs = torch.tensor([[7, EOS, 8, 9, EOS, EOS, 4], [EOS, 5, 6, 7, 8, 9, 9]])
    assert document_ids(inputs, EOS).tolist() == [[0, 0, 1, 1, 1, 2, 3], [0, 1, 1, 1, 1, 1, 1]]
    positions = positions_in_documents(document_ids(inputs, EOS))
    assert positions.tolist() == [[0, 1, 0, 1, 2, 0, 0], [0, 0, 1, 2, 3, 4, 5]]


@torch.no_grad()
def test_packed_loss_equals_the_token_weighted_losses_of_its_documents(model):
    inputs, targets = packed_window()
    packed = F.cross_entropy(model(inputs, document_ids=document_ids(inputs, EOS))[0], targets[0])
    total, start = torch.zeros((), dtype=torch.float64), 0
    for length in LENGTHS:
        end = min(start + length, inputs.shape[1])
        if end > start:
            alone = F.cross_entropy(model(inputs[:, start:end])[0], targets[0, start:end], reduction="sum")
            total += alone.double()
        start = end
    expected = total / inputs.shape[1]
    assert abs(packed.double() - expected).item() <= 1e-5
    unmasked = F.cross_entropy(model(inputs)[0], targets[0])
    assert abs(unmasked.double() - expected).item() > 1e-3  # the mask matters: without it, documents see each other


@torch.no_grad()
def test_one_document_masked_equals_plain_causal_attention(model):
    inputs = torch.randint(4, 512, (2, 32), generator=torch.Generator().manual_seed(2))  # no EOS: one document
    plain = model(inputs)
    masked = model(inputs, document_ids=document_ids(inputs, EOS))
    assert torch.equal(masked, plain)  # the plain causal path, exactly


@torch.no_grad()
def test_flex_attention_path_equals_the_sdpa_path(model, monkeypatch):
    """The CUDA path (flex_attention + BlockMask), run here uncompiled on the CPU, against SDPA with a boolean mask."""
    inputs, _ = packed_window()
    inputs = torch.cat([inputs, inputs.flip(1)])  # two rows with different boundaries
    ids = document_ids(inputs, EOS)
    sdpa = model(inputs, document_ids=ids)
    monkeypatch.setattr(document_mask_module, "uses_flex", lambda device: True)
    # torch warns once per process: another test's uncompiled flex call may have used it up
    monkeypatch.setattr(torch.nn.attention.flex_attention, "_WARNINGS_SHOWN", set())
    assert not isinstance(document_mask_module.document_mask(ids), torch.Tensor)  # a BlockMask
    with pytest.warns(UserWarning, match="without torch.compile"):
        flex = model(inputs, document_ids=ids)
    torch.testing.assert_close(flex, sdpa, rtol=0, atol=1e-5)


def test_gradients_do_not_cross_documents(model):
    inputs, _ = packed_window()
    embeddings = model.tok_embeddings(inputs).detach().requires_grad_(True)
    ids = document_ids(inputs, EOS)
    mask = document_mask_module.document_mask(ids)
    positions = positions_in_documents(ids)
    cos, sin = model.rope_cos[positions], model.rope_sin[positions]
    out = model.layers[0](embeddings, cos, sin, None, 0, mask)
    out[0, LENGTHS[0] + 2].sum().backward()  # a token of the second document
    touched = embeddings.grad[0].abs().sum(dim=-1).nonzero().flatten().tolist()
    assert touched == list(range(LENGTHS[0], LENGTHS[0] + 3))


def test_document_ids_with_a_kv_cache_is_refused(model):
    with pytest.raises(ValueError, match="KV cache"):
        model(torch.zeros(1, 4, dtype=torch.long), caches=[], document_ids=torch.zeros(1, 4, dtype=torch.long))
