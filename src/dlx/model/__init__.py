"""The Llama-3 model: shape (`ModelArgs`), presets, the module itself, parameter statistics and HF conversion.

`Transformer` is imported on first use: a recipe's shape is checked (`dlx.model.args`) before torch is loaded."""

from typing import Any

from dlx.model.args import ModelArgs, RopeScaling
from dlx.model.presets import PRESETS, resolve_model_args

__all__ = ["PRESETS", "ModelArgs", "RopeScaling", "Transformer", "resolve_model_args"]


def __getattr__(name: str) -> Any:
    if name == "Transformer":
        from dlx.model.llama import Transformer

        return Transformer
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
