"""dlx: pretrain Llama-3-style language models from scratch, with honest numbers."""

import logging

__version__ = "0.1.0"


def _without_cpu_build_noise(record: logging.LogRecord) -> bool:
    """False for the lines torchao logs on a CPU-only torch when its CUDA kernels' libraries cannot load (transformers
    and lm-eval import torchao whenever it is installed): there is nothing to load them for. On a CUDA build the
    same line is a real problem and passes."""
    if not record.getMessage().startswith("Failed to load "):
        return True
    import torch  # already imported: torchao imports it first

    return torch.version.cuda is not None


logging.getLogger("torchao").addFilter(_without_cpu_build_noise)
