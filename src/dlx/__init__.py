"""dlx: pretrain Llama-3-style language models from scratch, with honest numbers."""

__version__ = "0.1.0"
