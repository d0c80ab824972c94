"""The training loss from the last hidden states: next-token cross-entropy and the z-loss, without whole-batch logits.

`OutputLoss` (one per model, `Transformer.loss_fn`) has two ways to get there, chosen in one place (`chunked`):

- chunked (the default): the output projection and the loss run over chunks of at most `chunk_logits` logits. Per
  chunk: the logits in the compute dtype (bf16 under autocast), their log-softmax and loss in fp32 and, when gradients
  are needed, d loss / d logits, turned at once into the chunk's share of the gradients of the hidden states and of the
  output weight. Only one chunk's logits ever exist; backward multiplies the stored gradients by the incoming scale, so
  no logit is computed twice. At seq 2048 × micro-batch 16 × 128,256 vocab the whole-batch logits would be 4.2e9
  elements (past 2³¹, where PyTorch kernels have overflowed) and 42 GB with their fp32 copy and gradient; a chunk is
  at most 2²⁸ elements (1 GiB in fp32).
- whole logits: `output(hidden)` for the whole batch, then `F.cross_entropy` in fp32; the tests use it as the
  reference. (Tensor parallelism takes the vocabulary-sharded logits of `model(tokens)` instead and computes the loss
  on the shards: dlx.train.build.objective.training_loss.)

Both return `LossParts`: the loss to differentiate (cross-entropy + z_loss · z), and the two terms apart for logging.
The z-loss (PaLM, OLMo) is the mean over tokens of logsumexp(logits)²: it pulls the softmax normaliser towards 1.
Targets equal to `IGNORE_INDEX` count in neither mean, as in `F.cross_entropy`.

Gradient per token of (ce + c · z) with respect to its logits, N counted tokens, p = softmax, y = one-hot target:
    (p − y) / N + 2c · lse · p / N  =  p · (1 + 2c · lse) / N − y / N
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

IGNORE_INDEX = -100
"""Targets with this value are not counted (F.cross_entropy's default)."""
CHUNK_LOGITS = 2**28
"""Logits per chunk at most: 1 GiB in fp32 (2,093 tokens at a 128,256 vocabulary, 32,768 at 8,192)."""


class LossParts(NamedTuple):
    loss: torch.Tensor
    """cross_entropy + z_loss coefficient · z_loss: the scalar to call backward on."""
    cross_entropy: torch.Tensor
    """Mean next-token cross-entropy (detached): the loss that perplexity and evaluation report."""
    z_loss: torch.Tensor
    """Mean logsumexp² (detached), before the coefficient; computed even when the coefficient is 0."""


def chunk_loss(logits: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Σ cross-entropy and Σ logsumexp² (fp32 scalars) of logits (n, V) against targets (n,). Overwrites fp32 logits
    (with their log-softmax, `_log_softmax_terms`)."""
    ce_sum, z_sum, _, _ = _log_softmax_terms(logits, targets)
    return ce_sum, z_sum


def chunk_loss_and_grad(
    logits: torch.Tensor, targets: torch.Tensor, z_loss: float, scale: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`chunk_loss`, and d((Σ ce + z_loss · Σ lse²) · scale) / d logits (n, V) in the logits' dtype (computed in fp32,
    one cast at the end: `scale` must keep its elements inside that dtype's range, see `gradient_lift`). The softmax
    is made in place of the fp32 log-softmax, itself made in place of the fp32 logits (`_log_softmax_terms`): one fp32
    chunk at a time in eager; fp32 `logits` are overwritten (they become the returned gradient)."""
    ce_sum, z_sum, log_probs, lse = _log_softmax_terms(logits, targets)
    counted = targets != IGNORE_INDEX
    row_scale = torch.where(counted, scale * (1 + 2 * z_loss * lse), 0.0)  # (n,)
    grad = log_probs.exp_().mul_(row_scale[:, None])  # p · (1 + 2c · lse) / N
    grad.scatter_add_(1, targets.clamp(min=0)[:, None], torch.where(counted, -scale, 0.0)[:, None])  # − y / N
    return ce_sum, z_sum, grad.to(logits.dtype)


def _log_softmax_terms(
    logits: torch.Tensor, targets: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Σ ce, Σ lse², the fp32 log-softmax (n, V) and the log-sum-exp (n,). One fused log-softmax kernel, as
    F.cross_entropy uses; the log-sum-exp is read off the target's column (lse = logit − log p), not recomputed.

    In eager the log-softmax is written over the fp32 logits: over `logits` themselves in fp32 (which it overwrites),
    over their fp32 copy under autocast. That copy is the one log_softmax(dtype=float32) makes anyway, a cast then the
    same kernel, so the values are bit for bit those of the out-of-place call, with one fp32 chunk fewer alive.
    Except CUDA's fp16, whose log_softmax reads fp16 and writes fp32 in one kernel (no copy to write over), and
    compiled code, where inductor plans the buffers."""
    counted = targets != IGNORE_INDEX
    safe_targets = targets.clamp(min=0)[:, None]  # (n, 1)
    target_logit = logits.gather(1, safe_targets).squeeze(1).float()  # read before the logits are overwritten
    if torch.compiler.is_compiling() or (logits.is_cuda and logits.dtype == torch.float16):
        log_probs = torch.log_softmax(logits, dim=-1, dtype=torch.float32)  # (n, V)
    else:
        log_probs = logits.float()  # the logits themselves when they are fp32
        torch.log_softmax(log_probs, dim=-1, out=log_probs)
    picked = log_probs.gather(1, safe_targets).squeeze(1)  # log p(target)
    lse = target_logit - picked  # (n,)
    ce_sum = torch.where(counted, -picked, 0.0).sum()
    z_sum = torch.where(counted, lse.square(), 0.0).sum()
    return ce_sum, z_sum, log_probs, lse


class _ChunkedLinearCrossEntropy(torch.autograd.Function):
    """hidden (N, D) in the compute dtype, weight (V, D), targets (N,) -> (loss, cross_entropy, z_loss)."""

    @staticmethod
    def forward(ctx, hidden, weight, targets, z_loss, chunk_tokens, math):  # type: ignore[override]
        weight_c = weight.to(hidden.dtype)  # one cast of the output weight per forward, as autocast caches it
        counted = (targets != IGNORE_INDEX).sum().clamp(min=1).float()  # on the device
        scale, lift = 1.0 / counted, gradient_lift(counted)
        grad_hidden = torch.empty_like(hidden)
        # fp32 whatever the weight's dtype (FSDP2 hands its unsharded bf16 copy): chunks add up without rounding
        grad_weight = torch.zeros_like(weight, dtype=torch.float32) if ctx.needs_input_grad[1] else None
        ce_sum = z_sum = hidden.new_zeros((), dtype=torch.float32)
        with torch.autocast(hidden.device.type, enabled=False):  # the dtypes below are chosen, not autocast's
            for start in range(0, hidden.shape[0], chunk_tokens):
                h = hidden[start : start + chunk_tokens]  # (n, D)
                logits = h @ weight_c.t()  # (n, V)
                ce, z, grad_logits = math(logits, targets[start : start + chunk_tokens], z_loss, scale * lift)
                del logits
                ce_sum, z_sum = ce_sum + ce, z_sum + z
                torch.mm(grad_logits, weight_c, out=grad_hidden[start : start + chunk_tokens])  # (n, D)
                if grad_weight is not None:
                    accumulate_fp32(grad_weight, grad_logits.t(), h)  # (V, D)
                del grad_logits  # else alive while the next chunk's logits are made: two chunks at the peak
        ctx.save_for_backward(grad_hidden, grad_weight, lift)
        ce, z = ce_sum * scale, z_sum * scale
        ctx.mark_non_differentiable(ce, z)
        return ce + z_loss * z, ce, z

    @staticmethod
    def backward(ctx, grad_loss, _grad_ce, _grad_z):  # type: ignore[override]
        grad_hidden, grad_weight, lift = ctx.saved_tensors  # backward runs once: scaled in place
        unlift = grad_loss.float() / lift  # a power of two times the incoming scale: exact
        grad_hidden = grad_hidden.mul_(unlift)
        if grad_weight is not None:
            grad_weight = grad_weight.mul_(unlift)  # autograd casts it to the weight's dtype when that is narrower
        return grad_hidden, grad_weight, None, None, None, None


def gradient_lift(counted: torch.Tensor) -> torch.Tensor:
    """The power of two nearest the counted tokens N. The per-chunk gradient is made as d(mean loss)/d logits × lift,
    elements of order 1 rather than ≤ 1/N, before its cast to the compute dtype: in fp16 the plain 1/N-sized values
    (7e-9 at vocab 32k, N 4k) flush to zero before the loss scaler's factor arrives in backward. Multiplying by a
    power of two changes no mantissa, so bf16 and fp32 gradients are bit for bit what they are without it."""
    return torch.exp2(torch.log2(counted).round())


def accumulate_fp32(total: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    """total (fp32) += a @ b, one GEMM that accumulates into total. a and b in a narrower compute dtype: on CUDA
    cuBLAS multiplies them and adds into fp32 (`addmm` with `out_dtype`), no narrow product is stored and no second
    pass adds it. Where this torch refuses an fp32 accumulator (a CPU's `addmm` has no `out_dtype`), a bf16 product
    (its GEMM accumulates in fp32, rounded once at the end) then the add: bf16's range holds any product, and on a CPU
    with bf16 matmuls the bf16 GEMM runs 4× faster than casting both inputs for an fp32 one (BENCHMARKS.md, Peers).
    fp16's range may not hold the product, so fp16 takes it in fp32, as elsewhere: the same sums, the inputs exact."""
    if a.dtype == total.dtype:
        total.addmm_(a, b)
    elif total.device.type == "cuda" and cuda_addmm_into_fp32(total.device):
        torch.addmm(total, a, b, out_dtype=total.dtype, out=total)
    elif a.dtype == torch.bfloat16:
        total.add_(a @ b)
    else:
        total.addmm_(a.float(), b.float())


@functools.cache
def cuda_addmm_into_fp32(device: torch.device) -> bool:
    """Whether this torch's CUDA `addmm` adds bf16 products into an fp32 tensor in place (`out_dtype`; some versions
    require the added tensor in the inputs' dtype). Tried once per device on 16 × 16 ones."""
    total = torch.zeros(16, 16, device=device)
    ones = torch.ones(16, 16, device=device, dtype=torch.bfloat16)
    try:
        torch.addmm(total, ones, ones, out_dtype=torch.float32, out=total)
    except (RuntimeError, TypeError):
        return False
    return bool((total == 16).all())


def chunked_loss_no_grad(
    hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, z_loss: float, chunk_tokens: int
) -> LossParts:
    """The chunked loss where no gradient is needed (evaluation): the same chunks, no gradient math."""
    weight_c = weight.to(hidden.dtype)
    ce_sum = z_sum = hidden.new_zeros((), dtype=torch.float32)
    with torch.autocast(hidden.device.type, enabled=False):
        for start in range(0, hidden.shape[0], chunk_tokens):
            logits = hidden[start : start + chunk_tokens] @ weight_c.t()  # (n, V)
            ce, z = chunk_loss(logits, targets[start : start + chunk_tokens])
            ce_sum, z_sum = ce_sum + ce, z_sum + z
            del logits  # before the next chunk's are made: one chunk alive
    scale = 1.0 / (targets != IGNORE_INDEX).sum().clamp(min=1).float()
    ce, z = ce_sum * scale, z_sum * scale
    return LossParts(ce + z_loss * z, ce, z)


def whole_logits_loss(logits: torch.Tensor, targets: torch.Tensor, z_loss: float) -> LossParts:
    """The loss from logits (..., V) of the whole batch, in fp32: `F.cross_entropy` and the z-loss beside it."""
    x = logits.flatten(0, -2).float()  # (N, V)
    flat_targets = targets.flatten()
    ce = F.cross_entropy(x, flat_targets, ignore_index=IGNORE_INDEX)
    counted = flat_targets != IGNORE_INDEX
    lse = torch.logsumexp(x, dim=-1)
    z = torch.where(counted, lse.square(), 0.0).sum() / counted.sum().clamp(min=1)
    return LossParts(ce + z_loss * z, ce.detach(), z.detach())


def balanced_chunk(n_tokens: int, most: int) -> int:
    """Tokens per chunk: as few chunks as `most` allows, as equal as can be, so that where they divide n_tokens (16,384
    tokens at a 128,256 vocabulary: 8 chunks of 2,048) every chunk has one shape and the compiled chunk math compiles
    once, with no shorter last chunk to recompile for."""
    n_chunks = -(-n_tokens // most)
    return -(-n_tokens // n_chunks)


class OutputLoss:
    """How a model turns its last hidden states into the loss; `Transformer.loss_fn`, set from outside
    (`torch.compile` of the blocks also compiles the chunk math)."""

    def __init__(self, chunked: bool = True, chunk_logits: int = CHUNK_LOGITS) -> None:
        self.chunked = chunked
        """True: chunk by chunk, no whole-batch logits. False: the whole logits through the output module."""
        self.chunk_logits = chunk_logits
        """At most this many logits per chunk (chunk tokens = chunk_logits // vocab, at least 1)."""
        self.math: Callable = chunk_loss_and_grad
        """The per-chunk loss and gradient: `chunk_loss_and_grad`, or its torch.compile'd form."""

    def compile(self) -> None:
        """Fuse the per-chunk fp32 math (upcast, log-sum-exp, softmax, gradient, downcast) into few kernels."""
        self.math = torch.compile(chunk_loss_and_grad, dynamic=False)

    def __call__(self, hidden: torch.Tensor, output: nn.Linear, targets: torch.Tensor, z_loss: float) -> LossParts:
        """hidden (B, T, D) after the final norm, targets (B, T)."""
        if not self.chunked:
            return whole_logits_loss(output(hidden), targets, z_loss)
        flat_hidden, flat_targets = hidden.flatten(0, 1), targets.flatten()  # (N, D), (N,)
        chunk_tokens = balanced_chunk(flat_targets.shape[0], max(1, self.chunk_logits // output.weight.shape[0]))
        if torch.is_grad_enabled() and (hidden.requires_grad or output.weight.requires_grad):
            return LossParts(
                *_ChunkedLinearCrossEntropy.apply(
                    flat_hidden, output.weight, flat_targets, z_loss, chunk_tokens, self.math
                )
            )
        return chunked_loss_no_grad(flat_hidden, output.weight, flat_targets, z_loss, chunk_tokens)
