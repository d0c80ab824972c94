"""The chunked loss (dlx.model.loss): equal to the whole-logits cross-entropy the model computed before, gradients
included; the z-loss beside it; evaluation without gradients; and never a whole-batch logits tensor."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from dlx.model import resolve_model_args
from dlx.model.llama import Transformer
from dlx.model.loss import IGNORE_INDEX, OutputLoss
from train_helpers import single_torch_thread

one_thread = pytest.fixture(autouse=True)(single_torch_thread)
VOCAB = 512


def models(tie: bool, chunk_tokens: int) -> tuple[Transformer, Transformer]:
    """(chunked, reference): the same weights; the chunked one with `chunk_tokens` tokens per chunk."""
    torch.manual_seed(0)
    chunked = Transformer(resolve_model_args("debug", tie_embeddings=tie))
    chunked.loss_fn = OutputLoss(chunk_logits=chunk_tokens * VOCAB)
    reference = copy.deepcopy(chunked)
    reference.loss_fn = OutputLoss(chunked=False)
    return chunked, reference


def batch(ignored: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    inputs = torch.randint(0, VOCAB, (3, 20), generator=generator)
    targets = torch.randint(0, VOCAB, (3, 20), generator=generator)
    targets[0, :ignored] = IGNORE_INDEX
    return inputs, targets


def todays_loss(model: Transformer, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The loss before the chunked path: whole logits, upcast, F.cross_entropy."""
    return F.cross_entropy(model(inputs).flatten(0, 1).float(), targets.flatten())


def max_grad_difference(a: Transformer, b: Transformer) -> float:
    return max((x.grad - y.grad).abs().max().item() for x, y in zip(a.parameters(), b.parameters(), strict=True))


@pytest.mark.parametrize("tie", [False, True])
@pytest.mark.parametrize("chunk_tokens", [7, 60, 4096])  # 9 chunks with a short last one; exactly one; one partial
def test_chunked_loss_and_gradients_equal_todays_loss(tie, chunk_tokens):
    chunked, reference = models(tie, chunk_tokens)
    inputs, targets = batch()
    parts = chunked(inputs, targets=targets)
    parts.loss.backward()
    expected = todays_loss(reference, inputs, targets)
    expected.backward()
    assert abs(parts.loss.item() - expected.item()) <= 1e-5
    assert parts.cross_entropy.item() == pytest.approx(expected.item(), abs=1e-5)
    assert max_grad_difference(chunked, reference) <= 1e-5


def test_z_loss_and_ignored_targets_match_the_whole_logits_form():
    chunked, reference = models(tie=False, chunk_tokens=7)
    inputs, targets = batch(ignored=5)
    got = chunked(inputs, targets=targets, z_loss=1e-2)
    want = reference(inputs, targets=targets, z_loss=1e-2)
    got.loss.backward()
    want.loss.backward()
    logits = reference(inputs).flatten(0, 1).float()[5:]  # the 5 ignored tokens are the first of the flat batch
    lse = torch.logsumexp(logits, dim=-1)
    assert got.z_loss.item() == pytest.approx(lse.square().mean().item(), rel=1e-6)
    assert got.loss.item() == pytest.approx(got.cross_entropy.item() + 1e-2 * got.z_loss.item(), rel=1e-6)
    for name in ("loss", "cross_entropy", "z_loss"):
        assert abs(getattr(got, name).item() - getattr(want, name).item()) <= 1e-5, name
    assert max_grad_difference(chunked, reference) <= 1e-5
    assert not got.cross_entropy.requires_grad and not got.z_loss.requires_grad  # logged apart, not differentiated


def test_bf16_autocast_stays_within_bf16_rounding_of_todays_loss():
    chunked, reference = models(tie=False, chunk_tokens=7)
    inputs, targets = batch()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = chunked(inputs, targets=targets).loss
        want = todays_loss(reference, inputs, targets)
    got.backward()
    want.backward()
    assert got.item() == pytest.approx(want.item(), rel=2e-3)
    largest = max(p.grad.abs().max().item() for p in reference.parameters())
    assert max_grad_difference(chunked, reference) <= 2e-2 * largest


def test_evaluation_without_gradients_gives_the_same_values():
    chunked, _ = models(tie=False, chunk_tokens=7)
    inputs, targets = batch(ignored=3)
    with_grad = chunked(inputs, targets=targets, z_loss=1e-3)
    with torch.no_grad():
        without = chunked(inputs, targets=targets, z_loss=1e-3)
    assert not without.loss.requires_grad
    for name in ("loss", "cross_entropy", "z_loss"):
        assert getattr(without, name).item() == pytest.approx(getattr(with_grad, name).item(), abs=1e-6)


class LargestVocabTensor(TorchDispatchMode):
    """Records the element count of the largest tensor with a vocabulary-sized last dimension any op returns."""

    def __init__(self) -> None:
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for tensor in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(tensor, torch.Tensor) and tensor.ndim and tensor.shape[-1] == VOCAB:
                self.largest = max(self.largest, tensor.numel())
        return out


def test_no_op_makes_a_whole_batch_logits_tensor():
    chunked, _ = models(tie=False, chunk_tokens=7)
    inputs = torch.randint(0, VOCAB, (4, 100))  # whole logits: 400 × 512 = 204,800 elements
    with LargestVocabTensor() as tracker:
        chunked(inputs, targets=inputs.roll(-1, dims=1)).loss.backward()
    assert tracker.largest == 64 * VOCAB  # the output weight's transpose (dim × vocab); a chunk is 7 × 512


@pytest.mark.slow
def test_compiled_chunk_math_equals_eager():
    chunked, _ = models(tie=True, chunk_tokens=7)
    compiled = copy.deepcopy(chunked)
    compiled.loss_fn.compile()
    inputs, targets = batch(ignored=2)
    for model in (compiled, chunked):
        model(inputs, targets=targets, z_loss=1e-3).loss.backward()
    assert max_grad_difference(compiled, chunked) <= 1e-5
