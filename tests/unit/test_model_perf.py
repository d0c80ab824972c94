"""The model's fast paths give the answers of the plain ones: GQA through SDPA's enable_gqa against repeated k/v,
one cast per normalised activation under autocast, RoPE in bf16 within its stated tolerance."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from dlx.model import llama, resolve_model_args
from dlx.model.llama import RMSNorm, Transformer
from dlx.model.rope import apply_rope, rope_tables
from train_helpers import single_torch_thread

one_thread = pytest.fixture(autouse=True)(single_torch_thread)


def test_gqa_through_sdpa_equals_repeated_kv_heads(monkeypatch):
    torch.manual_seed(0)
    model = Transformer(resolve_model_args("debug"))  # 4 query heads, 2 kv heads
    repeated = copy.deepcopy(model)
    tokens = torch.randint(0, 512, (2, 24))
    assert llama.SDPA_HAS_GQA  # the installed torch has it
    shared = model(tokens, targets=tokens.roll(-1, 1)).loss
    shared.backward()
    monkeypatch.setattr(llama, "SDPA_HAS_GQA", False)  # the repeat_interleave path
    plain = repeated(tokens, targets=tokens.roll(-1, 1)).loss
    plain.backward()
    assert shared.item() == pytest.approx(plain.item(), abs=1e-6)
    for a, b in zip(model.parameters(), repeated.parameters(), strict=True):
        torch.testing.assert_close(a.grad, b.grad, atol=1e-6, rtol=0)


def test_gqa_decode_with_a_kv_cache_equals_repeated_kv_heads(monkeypatch):
    torch.manual_seed(0)
    model = Transformer(resolve_model_args("debug"))
    prompt = torch.randint(0, 512, (1, 6))
    shared = model.generate(prompt, 5, temperature=0.0)
    monkeypatch.setattr(llama, "SDPA_HAS_GQA", False)
    assert torch.equal(shared, model.generate(prompt, 5, temperature=0.0))


@pytest.mark.parametrize(
    ("device", "dtype", "masked", "major", "kernel", "expected"),
    [
        ("cpu", torch.float32, False, None, None, True),  # CPU flash and math kernels take enable_gqa
        ("cpu", torch.float32, True, None, None, True),
        ("cpu", torch.float32, False, None, "efficient", True),  # a CPU has no memory-efficient kernel
        ("cuda", torch.bfloat16, False, 9, None, True),  # H100/H200: flash
        ("cuda", torch.float16, False, 8, None, True),
        ("cuda", torch.bfloat16, False, 9, "flash", True),  # train.attention's named kernels
        ("cuda", torch.bfloat16, False, 9, "cudnn", True),
        ("cuda", torch.bfloat16, False, 9, "math", True),
        ("cuda", torch.bfloat16, False, 9, "efficient", False),  # the memory-efficient kernel refuses enable_gqa
        ("cuda", torch.float32, False, 9, None, False),  # fp32: the memory-efficient kernel, which does not take it
        ("cuda", torch.bfloat16, True, 9, None, False),  # a mask: no flash
        ("cuda", torch.float16, False, 7, None, False),  # V100: no flash
    ],
)
def test_gqa_is_used_only_where_the_fast_kernel_keeps_it(monkeypatch, device, dtype, masked, major, kernel, expected):
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: SimpleNamespace(major=major))
    q = SimpleNamespace(device=torch.device(device, 0) if device == "cuda" else torch.device(device), dtype=dtype)
    assert llama._sdpa_shares_kv_heads(q, masked, kernel) is expected


def test_each_layer_tells_sdpa_the_applied_kernel_and_repeating_kv_heads_changes_nothing(monkeypatch):
    """`use_attention` reaches every layer's `causal_attention`; where the kernel makes it repeat kv heads (CUDA
    efficient, here forced on a CPU) the model computes what it does sharing them inside SDPA."""
    torch.manual_seed(0)
    model = Transformer(resolve_model_args("debug"))
    assert model.args.n_heads > model.args.kv_heads  # grouped-query attention
    tokens = torch.randint(0, 512, (2, 16))
    with torch.no_grad():
        shared = model(tokens)
    asked = []

    def as_on_cuda_bf16(q, masked, kernel=None):
        asked.append(kernel)
        return kernel != "efficient"

    monkeypatch.setattr(llama, "_sdpa_shares_kv_heads", as_on_cuda_bf16)
    model.use_attention("efficient")
    assert (model.causal_kernel, asked) == ("sdpa", [])
    with torch.no_grad():
        repeated = model(tokens)
    assert asked == ["efficient"] * model.args.n_layers
    torch.testing.assert_close(repeated, shared, atol=1e-6, rtol=0)
    model.use_attention("flex")
    assert model.causal_kernel == "flex"
    assert {layer.attention.sdpa_kernel for layer in model.layers} == {None}
    model.use_attention(None)
    assert model.causal_kernel == "sdpa"


class CastCounter(TorchDispatchMode):
    """Counts fp32 -> bf16 copies of activations shaped like the residual stream (B, T, dim)."""

    def __init__(self, shape: tuple[int, ...]) -> None:
        super().__init__()
        self.shape, self.casts = shape, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func is torch.ops.aten._to_copy.default and tuple(args[0].shape) == self.shape:
            self.casts += args[0].dtype == torch.float32 and out.dtype == torch.bfloat16
        return out


def test_each_norm_casts_its_output_once_under_autocast():
    args = resolve_model_args("debug")
    block = llama.TransformerBlock(args)
    x = torch.randn(2, 16, args.dim)
    cos, sin = (t[:16].bfloat16() for t in rope_tables(args))
    with CastCounter((2, 16, args.dim)) as counter, torch.autocast("cpu", dtype=torch.bfloat16):
        block(x, cos, sin)
    assert counter.casts == 2  # attention_norm and ffn_norm; wq/wk/wv and w1/w3 would have cast 3 + 2 times


def test_rmsnorm_equals_the_fp32_formula_and_emits_the_compute_dtype():
    torch.manual_seed(0)
    norm = RMSNorm(64, eps=1e-5)
    torch.nn.init.normal_(norm.weight)
    x = torch.randn(3, 5, 64)
    expected = x * torch.rsqrt(x.square().mean(-1, keepdim=True) + 1e-5) * norm.weight
    torch.testing.assert_close(norm(x), expected, atol=1e-6, rtol=1e-6)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = norm(x)
    assert out.dtype == torch.bfloat16 and torch.equal(out, expected.bfloat16())


def test_rope_in_bf16_is_within_two_bf16_eps_of_the_largest_element():
    args = resolve_model_args("llama3.2-1b", max_seq_len=2048)
    cos, sin = rope_tables(args)
    x = (torch.randn(2, 2048, 4, args.head_dim, generator=torch.Generator().manual_seed(0)) * 3).bfloat16()
    rounded = apply_rope(x.float(), cos, sin).bfloat16().float()  # the fp32 rotation, rounded once
    in_bf16 = apply_rope(x, cos.bfloat16(), sin.bfloat16()).float()
    largest = x.float().abs().amax(-1, keepdim=True)  # per head vector
    eps = torch.finfo(torch.bfloat16).eps  # 2⁻⁷
    assert ((in_bf16 - rounded).abs() <= 2 * eps * largest).all()
    assert F.cosine_similarity(in_bf16.flatten(), rounded.flatten(), dim=0) > 0.9999
