"""train.attention: the key, the choice (auto's fastest from timings, a named kernel that must run the shape, the CPU's
own kernel), that an applied choice changes what runs and is undone at close, flex's causal path, the header line."""

from __future__ import annotations

import typing

import pytest
import torch
from torch.profiler import profile

from dlx import device as dev
from dlx.errors import UserError
from dlx.model.args import ModelArgs
from dlx.model.attention_kernels import (
    CONTENDERS,
    SETTINGS,
    AttentionChoice,
    AttentionShape,
    choose_attention,
    cpu_sdpa_kernel,
    fastest,
)
from dlx.model.llama import Transformer
from dlx.train.config import TrainSection, build_config
from dlx.train.launch import launch
from dlx.train.observers.attention import AttentionObserver, attention_shape, choose_run_attention
from train_helpers import TINY

pytestmark = pytest.mark.usefixtures("in_process_training")

SHAPE = AttentionShape(8, 32, 8, 2048, 64)
CPU, CUDA = torch.device("cpu"), torch.device("cuda")  # a torch.device, no CUDA call: the timer is injected


def sdpa_flags() -> tuple[bool, ...]:
    cuda = torch.backends.cuda
    enabled = cuda.flash_sdp_enabled(), cuda.mem_efficient_sdp_enabled(), cuda.math_sdp_enabled()
    return (*enabled, cuda.cudnn_sdp_enabled(), *torch._C._get_sdp_priority_order())


def config(**train):
    return build_config({"model": {"preset": "debug"}, "data": {"seq_len": 16}, "train": {"max_steps": 1, **train}})


def ran(model: Transformer) -> list[str]:
    """The aten SDPA kernels a forward of `model` ran (as torch.profiler records them)."""
    with torch.no_grad(), profile() as prof:
        model(torch.zeros(1, 16, dtype=torch.long))
    return sorted({e.key for e in prof.key_averages() if e.key.startswith("aten::_scaled_dot_product")})


def test_train_attention_takes_each_setting_and_refuses_others():
    assert typing.get_args(TrainSection.model_fields["attention"].annotation) == SETTINGS
    assert config().train.attention == "auto"
    assert config(attention="cudnn").train.attention == "cudnn"
    with pytest.raises(UserError) as error:
        config(attention="fa3")
    assert str(error.value) == (
        "recipe: train.attention: input should be 'auto', 'default', 'cudnn', 'flash', 'efficient', 'math' or 'flex' "
        "(got 'fa3')"
    )


def test_the_shape_is_one_ranks_attention_call_in_the_compute_dtype():
    shape = attention_shape(config(), micro_batch=2, tp=2, precision="bf16")
    assert shape == AttentionShape(2, 2, 1, 16, 16, torch.bfloat16)  # debug: 4 heads, 2 kv heads, head_dim 16


def test_auto_takes_the_fastest_timed_kernel_and_the_header_states_them_all():
    timings = {"cudnn": 1.2, "flash": 1.0, "efficient": None, "flex": 1.4}
    choice = choose_attention("auto", SHAPE, CUDA, timer=timings.get)
    assert (choice.kernel, choice.ms) == ("flash", timings)
    assert choice.header == (
        "attention: flash, the fastest fwd+bwd at (B, H, H_kv, T, D) = (8, 32, 8, 2048, 64) in bfloat16: cudnn "
        "1.20 ms, flash 1.00 ms, efficient refused, flex 1.40 ms (train.attention auto)"
    )


def test_auto_refuses_when_every_kernel_refuses_and_a_named_one_that_refuses():
    with pytest.raises(UserError) as error:
        fastest(dict.fromkeys(CONTENDERS), SHAPE, CPU)  # auto's pick from the timings (device named in the line)
    assert str(error.value) == (
        "train.attention auto: none of cudnn, flash, efficient, flex ran forward and backward at (B, H, H_kv, T, D) "
        f"= (8, 32, 8, 2048, 64) in bfloat16 on {dev.device_name(CPU)}; set train.attention default (PyTorch's own "
        "choice, math as the last resort)"
    )
    with pytest.raises(UserError) as error:
        choose_attention("cudnn", SHAPE, CPU)  # measured for real: a CPU has no cuDNN kernel
    assert str(error.value) == (
        "train.attention cudnn: the cudnn kernel does not run forward and backward at (B, H, H_kv, T, D) = "
        f"(8, 32, 8, 2048, 64) in bfloat16 on {dev.device_name(CPU)}; set train.attention auto (or default)"
    )


def test_auto_on_a_cpu_applies_nothing_and_names_the_kernel_sdpa_runs():
    before = sdpa_flags()
    choice = choose_run_attention(config(), attention_shape(config(), 2, 1, "fp32"), CPU)
    model = Transformer(ModelArgs(**config().model.args.model_dump()))
    observer = AttentionObserver(choice, False, CPU).apply(model)
    assert (choice.kernel, sdpa_flags(), model.causal_kernel) == (None, before, "sdpa")
    assert observer.header() == [
        "attention: CPU, no other kernel to choose from; SDPA runs scaled_dot_product_flash_attention_for_cpu "
        "(train.attention auto)"
    ]
    assert AttentionObserver(choice, True, CPU).header() == [
        f"{observer.header()[0]}; data.document_mask: SDPA with each batch's boolean mask, the same choice"
    ]


def test_a_named_kernel_changes_what_runs_until_the_run_closes():
    model = Transformer(config().model.args)
    assert ran(model) == ["aten::_scaled_dot_product_flash_attention_for_cpu"]
    before = sdpa_flags()
    choice = choose_run_attention(config(attention="math"), attention_shape(config(), 2, 1, "fp32"), CPU)
    observer = AttentionObserver(choice, False, CPU).apply(model)
    assert ran(model) == ["aten::_scaled_dot_product_attention_math"]
    assert {layer.attention.sdpa_kernel for layer in model.layers} == {"math"}  # each layer knows (`causal_attention`)
    assert cpu_sdpa_kernel("math") == "scaled_dot_product_attention_math"  # what the header names is what ran
    assert observer.header()[0].startswith("attention: math (train.attention), fwd+bwd ") and observer.header()[
        0
    ].endswith(" ms at (B, H, H_kv, T, D) = (2, 4, 2, 16, 16) in float32; SDPA runs scaled_dot_product_attention_math")
    observer.close()
    assert sdpa_flags() == before
    assert ran(model) == ["aten::_scaled_dot_product_flash_attention_for_cpu"]


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
def test_flex_forward_equals_sdpa_on_a_cpu_and_training_with_it_is_refused():
    model = Transformer(config().model.args)
    tokens = torch.randint(0, model.args.vocab_size, (2, 16))
    with torch.no_grad():
        expected = model(tokens)
        model.causal_kernel = "flex"
        with profile() as prof:
            got = model(tokens)
    assert not [e.key for e in prof.key_averages() if e.key.startswith("aten::_scaled_dot_product")]
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    with pytest.raises(UserError) as error:
        choose_run_attention(config(attention="flex"), SHAPE, CPU)
    assert str(error.value) == (
        f"train.attention flex trains on CUDA only (flex_attention has no backward on cpu in torch "
        f"{torch.__version__.split('+')[0]}); set train.attention auto"
    )


def test_under_document_masks_on_cuda_the_header_says_flex_runs_every_batch():
    masked = config(attention="auto")
    choice = choose_run_attention(
        masked.model_copy(update={"data": masked.data.model_copy(update={"document_mask": True})}),
        SHAPE,
        CUDA,
        timer=lambda name: pytest.fail("nothing to time"),
    )
    assert AttentionObserver(choice, True, CUDA).header() == [
        "attention: flex_attention with each batch's document block mask (data.document_mask); train.attention auto "
        "has nothing to choose"
    ]
    named = AttentionChoice("cudnn", "cudnn", {"cudnn": 1.5}, SHAPE)
    assert AttentionObserver(named, True, CUDA).header() == [
        "attention: flex_attention with each batch's document block mask (data.document_mask); train.attention cudnn "
        "applies to generation only (eval.sample_every): cudnn (train.attention), fwd+bwd 1.50 ms at (B, H, H_kv, T, "
        "D) = (8, 32, 8, 2048, 64) in bfloat16"
    ]


def test_a_run_states_its_choice_in_the_header_and_restores_the_flags(tmp_path, capsys):
    before = sdpa_flags()
    argv = [*TINY, "--train.max_steps", "1", "--train.attention", "math"]
    assert launch(None, argv, tmp_path / "run", resume=False) == 0
    header = [line for line in capsys.readouterr().out.splitlines() if line.startswith("attention:")]
    assert len(header) == 1 and header[0].startswith("attention: math (train.attention), fwd+bwd ")
    assert header[0].endswith("in float32; SDPA runs scaled_dot_product_attention_math")
    assert sdpa_flags() == before


ATEN = {
    "cudnn": "aten::_scaled_dot_product_cudnn_attention",
    "flash": "aten::_scaled_dot_product_flash_attention",
    "efficient": "aten::_scaled_dot_product_efficient_attention",
}


@pytest.mark.skipif(dev.resolve_device("auto").type != "cuda", reason="times CUDA kernels")
def test_on_cuda_auto_times_every_contender_and_the_model_then_runs_its_pick():
    cuda = dev.resolve_device("cuda")
    model = Transformer(config().model.args).to(cuda)
    choice = choose_run_attention(config(), attention_shape(config(), 2, 1, "bf16"), cuda)
    assert list(choice.ms) == list(CONTENDERS) and choice.kernel in CONTENDERS
    assert choice.ms["efficient"] is not None  # grouped-query: kv heads repeated for it, not refused (enable_gqa)
    observer = AttentionObserver(choice, False, cuda).apply(model)
    try:
        with torch.no_grad(), dev.autocast(cuda, "bf16"), profile() as prof:
            model(torch.zeros(2, 16, dtype=torch.long, device=cuda))
    finally:
        observer.close()
    sdpa = {e.key for e in prof.key_averages() if e.key.startswith("aten::_scaled_dot_product")}
    assert sdpa == ({ATEN[choice.kernel]} if choice.kernel in ATEN else set())
