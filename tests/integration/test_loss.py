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
from dlx.model.loss import IGNORE_INDEX, OutputLoss, accumulate_fp32, balanced_chunk
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


def one_layer_pair(vocab: int, seq_len: int) -> tuple[Transformer, Transformer]:
    """(chunked in 2 chunks, whole logits): one debug layer at a real vocabulary."""
    torch.manual_seed(0)
    args = resolve_model_args("debug", vocab_size=vocab, n_layers=1, max_seq_len=seq_len)
    chunked = Transformer(args)
    chunked.loss_fn = OutputLoss(chunk_logits=vocab * seq_len // 2)
    reference = copy.deepcopy(chunked)
    reference.loss_fn = OutputLoss(chunked=False)
    return chunked, reference


def relative_grad_errors(a: Transformer, b: Transformer) -> dict[str, float]:
    return {
        name: ((x.grad - y.grad).norm() / y.grad.norm()).item()
        for (name, x), y in zip(a.named_parameters(), b.parameters(), strict=True)
    }


def test_fp16_chunked_gradients_equal_whole_logits_ones_for_every_parameter():
    """Vocab 32,768 and 1,024 tokens: each softmax gradient element is about p / N ≈ 3e-8, under fp16's smallest
    subnormal (6e-8). Cast to fp16 before the loss scale arrives, it flushed to zero: the final norm's gradient was
    2.1 times off, the embedding's 0.5 % (measured with the previous loss; at 4,096 tokens 0.73 and 0.9 %, but the
    whole-logits reference alone then takes 10 s on one CPU thread). The loss is scaled by 2¹⁰, as a GradScaler does
    (its default 2¹⁶ overflows the reference's fp16 attention gradient at this shape; the scaler would back off)."""
    vocab, seq_len, loss_scale = 32768, 1024, 2.0**10
    chunked, reference = one_layer_pair(vocab, seq_len)
    generator = torch.Generator().manual_seed(2)
    inputs, targets = (torch.randint(0, vocab, (1, seq_len), generator=generator) for _ in range(2))
    for model in (chunked, reference):
        with torch.autocast("cpu", dtype=torch.float16):
            loss = model(inputs, targets=targets).loss
        (loss * loss_scale).backward()
    errors = relative_grad_errors(chunked, reference)
    assert len(errors) == 12 and max(errors.values()) <= 2e-3, errors  # measured ≤ 6e-4: fp16 rounding


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_the_gradient_lift_changes_no_bit_in_bf16_or_fp32(monkeypatch, dtype):
    """The lift is a power of two: the gradients are those of the plain 1/N scaling, bit for bit."""
    inputs, targets = batch(ignored=3)  # 57 counted tokens: lifted by 64
    grads = []
    for lift in (True, False):
        if not lift:
            monkeypatch.setattr("dlx.model.loss.gradient_lift", lambda counted: torch.ones_like(counted))
        model, _ = models(tie=False, chunk_tokens=7)
        with torch.autocast("cpu", dtype=dtype, enabled=dtype != torch.float32):
            model(inputs, targets=targets, z_loss=1e-3).loss.backward()
        grads.append([p.grad for p in model.parameters()])
    assert all(torch.equal(a, b) for a, b in zip(*grads, strict=True))


def test_bf16_shares_add_into_fp32_as_the_device_allows():
    """accumulate_fp32 adds a @ b into an fp32 total. On a CPU (whose addmm takes no fp32 accumulator for bf16
    inputs) the bf16 product, its GEMM accumulated in fp32 and rounded once, is added: exactly the separate product
    and add, within bf16's rounding of each product element (2⁻⁸ relative) of the exact sum; what CUDA's one GEMM
    into fp32 (`out_dtype`) would add is the exact sum to fp32. fp16 takes the product in fp32; fp32 is one addmm."""
    generator = torch.Generator().manual_seed(3)
    a, b = torch.randn(512, 40, generator=generator), torch.randn(40, 64, generator=generator)
    total = torch.randn(512, 64, generator=generator)
    fused, separate = total.clone(), total.clone()
    accumulate_fp32(fused, a.bfloat16(), b.bfloat16())
    product = a.bfloat16() @ b.bfloat16()
    separate.add_(product)
    exact = total + a.bfloat16().double() @ b.bfloat16().double()
    assert torch.equal(fused, separate)
    assert ((fused.double() - exact).abs() <= 2**-8 * product.double().abs() + 1e-5).all()
    half, half_exact = total.clone(), total + a.half().double() @ b.half().double()
    accumulate_fp32(half, a.half(), b.half())
    assert (half.double() - half_exact).abs().max() <= 1e-4  # fp32 sums of exact products
    fp32_fused, fp32_plain = total.clone(), total.clone()
    accumulate_fp32(fp32_fused, a, b)
    fp32_plain.addmm_(a, b)
    assert torch.equal(fp32_fused, fp32_plain)


def test_the_output_weight_gradient_adds_up_in_fp32_when_the_weight_arrives_narrow():
    """FSDP2 hands the loss its unsharded bf16 weight; the chunks' shares still add up in fp32 and are rounded once
    (by autograd, to the weight's dtype): equal to the gradient of the same values held in fp32, rounded to bf16."""
    generator = torch.Generator().manual_seed(4)
    hidden = torch.randn(1, 60, 64, generator=generator).bfloat16()
    targets = torch.randint(0, VOCAB, (1, 60), generator=generator)
    values = (0.02 * torch.randn(VOCAB, 64, generator=generator)).bfloat16()
    grads = []
    for dtype in (torch.bfloat16, torch.float32):
        output = torch.nn.Linear(64, VOCAB, bias=False)
        output.weight = torch.nn.Parameter(values.to(dtype))
        OutputLoss(chunk_logits=7 * VOCAB)(hidden, output, targets, 0.0).loss.backward()
        grads.append(output.weight.grad)
    narrow, wide = grads
    assert narrow.dtype == torch.bfloat16 and wide.dtype == torch.float32
    assert torch.equal(narrow, wide.bfloat16())


def test_chunks_are_as_equal_as_can_be_so_the_compiled_math_sees_one_shape():
    assert balanced_chunk(16384, 2**28 // 128256) == 2048  # llama3.2-1b, micro-batch 8 × 2048: 8 equal chunks
    for n_tokens in range(1, 200):
        for most in (1, 3, 7, 64):
            chunk = balanced_chunk(n_tokens, most)
            assert chunk <= most and -(-n_tokens // chunk) == -(-n_tokens // most)  # no more chunks than needed


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_the_chunk_gradient_is_bit_for_bit_the_out_of_place_one_and_fp32_reuses_the_logits(dtype):
    """The log-softmax written over the fp32 logits (or over their fp32 copy under autocast) changes no bit of the
    losses or the gradient against log_softmax(dtype=float32) out of place; in fp32 the gradient is the logits'
    own storage, so one fp32 chunk is alive at a time, not two."""
    from dlx.model.loss import chunk_loss_and_grad

    torch.manual_seed(0)
    logits = (torch.randn(37, 301) * 4).to(dtype)
    targets = torch.randint(0, 301, (37,))
    targets[:3] = IGNORE_INDEX
    z_loss, scale = 1e-3, torch.tensor(64.0 / 34)
    # the former out-of-place math, on a copy
    log_probs = torch.log_softmax(logits, dim=-1, dtype=torch.float32)
    counted, safe = targets != IGNORE_INDEX, targets.clamp(min=0)[:, None]
    picked = log_probs.gather(1, safe).squeeze(1)
    lse = logits.gather(1, safe).squeeze(1).float() - picked
    row_scale = torch.where(counted, scale * (1 + 2 * z_loss * lse), 0.0)
    expected = log_probs.exp().mul_(row_scale[:, None])
    expected.scatter_add_(1, safe, torch.where(counted, -scale, 0.0)[:, None])
    expected_ce, expected_z = torch.where(counted, -picked, 0.0).sum(), torch.where(counted, lse.square(), 0.0).sum()

    storage = logits.data_ptr()
    ce, z, grad = chunk_loss_and_grad(logits, targets, z_loss, scale)
    assert torch.equal(ce, expected_ce) and torch.equal(z, expected_z)
    assert grad.dtype == dtype and torch.equal(grad, expected.to(dtype))
    assert (grad.data_ptr() == storage) == (dtype == torch.float32)
