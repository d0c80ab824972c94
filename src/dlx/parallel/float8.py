"""float8 training through torchao (`train.float8`): the blocks' linear layers compute their matmuls in float8 with
dynamic scales, the weights and optimizer stay as they were (fp32 master weights, bf16 autocast around them).

Applied to the model before any other wrapping (tensor parallelism, checkpointing, compile, FSDP2), as torchtitan
does. Which layers: torchao's own filter for the recipe (`_auto_filter_for_recipe`): dimensions divisible by 16, and
none so small that the cast costs more than the float8 matmul saves (thresholds torchao measured on H100); the output
head is never converted (its logits feed the loss, where float8's error lands directly on the softmax).

Recipes (torchao's names): `tensorwise` scales each tensor by one factor (cuBLAS float8 GEMM, the faster),
`rowwise` one factor per row (CUTLASS kernel, the more accurate). On llama3.2-1b (dim 2048, ffn 8192, kv 512)
tensorwise converts every block linear but wk and wv, rowwise only w1 and w3.

MFU of a float8 run is reported against the bf16 dense peak, as for a bf16 run: the FLOPs are the same count of
multiply-adds, so float8 MFU ÷ bf16 MFU is the speed-up at equal work. (torchtitan reports no MFU for float8; against
the float8 peak, twice bf16's, the figure would halve and hide the gain.)
"""

from __future__ import annotations

import torch
from torch import nn

from dlx import device as dev
from dlx.errors import UserError

FLOAT8_RECIPES = ("tensorwise", "rowwise")
SKIPPED_LAYERS = ["output"]
"""Module names torchao's filter leaves in bf16 whatever their shape."""
INSTALL_HINT = "pip install 'dlx[float8]'"


def check_float8_installed() -> None:
    """Before anything is written: train.float8 without torchao is one line."""
    try:
        import torchao.float8  # noqa: F401
    except ImportError:
        raise UserError(f"train.float8 needs torchao, which is not installed: {INSTALL_HINT}") from None


def check_float8_device(device: torch.device) -> None:
    """Before step 1: a device without float8 matmuls is one line."""
    problem = dev.float8_capability(device)
    if problem:
        raise UserError(f"train.float8: {problem}; set train.float8 false (bf16 trains everywhere)")


def apply_float8(model: nn.Module, recipe: str, device: torch.device) -> list[str]:
    """Swap the chosen linear layers for torchao's Float8Linear, in place; returns their names."""
    check_float8_device(device)
    check_float8_installed()
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training
    from torchao.float8.float8_linear_utils import _auto_filter_for_recipe

    chosen = _auto_filter_for_recipe(recipe, filter_fqns=SKIPPED_LAYERS)
    converted: list[str] = []

    def keep(module: nn.Module, name: str) -> bool:
        if chosen(module, name):
            converted.append(name)
            return True
        return False

    convert_to_float8_training(model, module_filter_fn=keep, config=Float8LinearConfig.from_recipe_name(recipe))
    return converted
