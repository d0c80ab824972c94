"""The Llama-3 model: shape (`ModelArgs`), presets, the module itself, parameter statistics and HF conversion."""

from dlx.model.args import ModelArgs, RopeScaling
from dlx.model.llama import Transformer
from dlx.model.presets import PRESETS, resolve_model_args

__all__ = ["PRESETS", "ModelArgs", "RopeScaling", "Transformer", "resolve_model_args"]
