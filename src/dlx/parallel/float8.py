"""float8 training through torchao (`train.float8`): the blocks' linear layers compute their matmuls in float8 with
dynamic scales, the weights and optimizer stay as they were (fp32 master weights, bf16 autocast around them).

Applied to the model before any other wrapping (tensor parallelism, checkpointing, compile, FSDP2), as torchtitan
does. `Float8Linear` is a subclass of `nn.Linear` with the same parameters, so state dicts, checkpoints and
`dlx export-hf` keep plain `weight` names: a float8 run's weights load into a bf16 model or transformers as they are.

Which layers (`layer_filter`): never the output head (its logits feed the loss, where float8's error lands directly on
the softmax), and only dimensions divisible by 16 (float8 GEMM kernels need them). On CUDA, torchao's own filter
(`_auto_filter_for_recipe`) also skips layers so small that the cast costs more than the float8 matmul saves
(thresholds torchao measured on H100): on llama3.2-1b (dim 2048, ffn 8192, kv 512) tensorwise converts every block
linear but wk and wv, rowwise only w1 and w3; on the debug model, none. Elsewhere (a CPU) float8 is never faster, so
speed thresholds mean nothing there and every eligible layer converts: the run checks float8's numerics on the most
layers it can.

Under fsdp with tensorwise (`gathers_in_float8`), FSDP2 all-gathers the converted weights in float8, half bf16's
bytes, and the FSDP strategy precomputes every weight's scale in one all-reduce after each optimizer step (torchao's
`enable_fsdp_float8_all_gather` and `precompute_float8_dynamic_scale_for_fsdp`, as torchtitan uses them).

Where float8 runs: CUDA compute capability 8.9 or later, and any device where `torch._scaled_mm` has a float8 kernel
(`dlx.device.float8_capability`): torch ≥ 2.11 has one for the CPU, oneDNN's reference kernel, correct and some 100×
slower than bf16. What the CPU tests (tests/integration/test_float8.py) check: a small model with every block linear in
float8, both recipes, in one process and under ddp and fsdp on 2-rank gloo, ends 30 steps within 2 % of bf16's loss at
the same seed (measured: within 0.05 %); fsdp's float8 all-gather stays within 0.5 % of a bf16 all-gather at every step;
a resumed run (also fsdp's, with precomputed scales) repeats the uninterrupted run's losses bit for bit; export-hf
writes plain weights that transformers loads with dlx's logits. Compiled (train.compile,
tests/integration/test_compile.py), both recipes trace into each block's one graph with no graph break and no recompile
after step 1, in one process and under fsdp with the float8 all-gather; the aten graphs call a float8 matmul for each
converted layer's forward and both its gradients; the losses are eager float8's bit for bit through AOTAutograd and
within 2e-4 through Inductor's CPU code. Not checked on a CPU: speed, and torchao's CUDA kernels (cuBLAS tensorwise,
CUTLASS rowwise).

Recipes (torchao's names): `tensorwise` scales each tensor by one factor (cuBLAS float8 GEMM, the faster),
`rowwise` one factor per row (CUTLASS kernel, the more accurate).

MFU of a float8 run is reported against the bf16 dense peak, as for a bf16 run: the FLOPs are the same count of
multiply-adds, so float8 MFU ÷ bf16 MFU is the speed-up at equal work. (torchtitan reports no MFU for float8; against
the float8 peak, twice bf16's, the figure would halve and hide the gain.)
"""

from __future__ import annotations

import dataclasses
import logging
import sys
from collections.abc import Callable

import torch
from torch import nn

from dlx import device as dev
from dlx.errors import UserError

FLOAT8_RECIPES = ("tensorwise", "rowwise")
SKIPPED_LAYERS = ["output"]
"""Module names left in bf16 whatever their shape."""
INSTALL_HINT = "pip install 'dlx[float8]'"


def check_float8_installed() -> None:
    """Before anything is written: train.float8 without torchao is one line."""
    torchao_log = logging.getLogger("torchao")
    level = torchao_log.level
    if torch.version.cuda is None:  # a CPU-only torch: torchao's CUDA kernels cannot load, and it warns for each file
        torchao_log.setLevel(logging.ERROR)
    try:
        import torchao.float8  # noqa: F401
    except ImportError:
        raise UserError(f"train.float8 needs torchao, which is not installed: {INSTALL_HINT}") from None
    finally:
        torchao_log.setLevel(level)


def check_float8_device(device: torch.device) -> None:
    """Before step 1: a device without float8 matmuls is one line."""
    problem = dev.float8_capability(device)
    if problem:
        raise UserError(f"train.float8: {problem}; set train.float8 false (bf16 trains everywhere)")


def layer_filter(recipe: str, device: torch.device) -> Callable[[nn.Module, str], bool]:
    """Which linear layers convert (see the module docstring): torchao's filter on CUDA, its shape rule elsewhere."""
    if device.type == "cuda":
        from torchao.float8.float8_linear_utils import _auto_filter_for_recipe

        return _auto_filter_for_recipe(recipe, filter_fqns=SKIPPED_LAYERS)

    def eligible(module: nn.Module, name: str) -> bool:
        if not isinstance(module, nn.Linear) or any(skipped in name for skipped in SKIPPED_LAYERS):
            return False
        return all(size % 16 == 0 for size in module.weight.shape)

    return eligible


def gathers_in_float8(recipe: str, strategy: str) -> bool:
    """Whether FSDP2 all-gathers the converted weights in float8 (half bf16's bytes on the wire): tensorwise under
    fsdp, the only recipe torchao's float8 all-gather takes (one scale per weight, agreed before the gather)."""
    return strategy == "fsdp" and recipe == "tensorwise"


def apply_float8(model: nn.Module, recipe: str, device: torch.device, gather_in_float8: bool = False) -> list[str]:
    """Swap the chosen linear layers for torchao's Float8Linear, in place; returns their names. `gather_in_float8`:
    their weights become torchao's float8-cast tensors, which FSDP2 all-gathers in float8 (`gathers_in_float8`)."""
    check_float8_device(device)
    check_float8_installed()
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    chosen = layer_filter(recipe, device)
    converted: list[str] = []

    def keep(module: nn.Module, name: str) -> bool:
        if chosen(module, name):
            converted.append(name)
            return True
        return False

    config = Float8LinearConfig.from_recipe_name(recipe)
    config = dataclasses.replace(config, enable_fsdp_float8_all_gather=gather_in_float8)
    convert_to_float8_training(model, module_filter_fn=keep, config=config)
    return converted


def weights_gathered_in_float8(model: nn.Module) -> bool:
    """Whether the model holds weights FSDP2 all-gathers in float8: torchao's float8-cast tensors (inside FSDP2's
    DTensors once sharded), which `apply_float8(gather_in_float8=True)` made and materialisation kept."""
    fsdp_utils = sys.modules.get("torchao.float8.fsdp_utils")  # imported by apply_float8; a run without it has none
    if fsdp_utils is None:
        return False
    weights = (getattr(m.weight, "_local_tensor", m.weight) for m in model.modules() if isinstance(m, nn.Linear))
    return any(isinstance(w, fsdp_utils.WeightWithDynamicFloat8CastTensor) for w in weights)


def precompute_float8_scales(model: nn.Module) -> None:
    """After each optimizer step, with weights gathered in float8: every weight's scale from one all-reduce of their
    maxima, instead of one all-reduce per weight inside the next all-gather (torchao's recommended use)."""
    from torchao.float8 import precompute_float8_dynamic_scale_for_fsdp

    precompute_float8_dynamic_scale_for_fsdp(model)


def float8_header(model: nn.Module, recipe: str, device: torch.device) -> list[str]:
    """The run header's float8 line: how many linear layers compute in float8, and on a CPU that it is not faster."""
    from torchao import __version__
    from torchao.float8.float8_linear import Float8Linear

    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    converted = sum(isinstance(m, Float8Linear) for m in linears)
    line = f"float8 ({recipe}, torchao {__version__}): {converted} of {len(linears)} linear layers"
    if weights_gathered_in_float8(model):
        line += ", their weights all-gathered in float8 by FSDP2"
    if device.type == "cpu":
        line += "; on a CPU float8 checks numerics, not speed (oneDNN's reference float8 matmul, far slower than bf16)"
    return [line]
