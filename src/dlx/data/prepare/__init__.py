"""Corpus → token shards: `prepare_dataset` (what `dlx prepare` runs) and `load_tokenizer` (for decoding).

Modules, in the order data flows: `inputs` (files, folders, globs → ordered files), `units` (files → work units),
`readers` and `parquet` (units → documents), `scan` (first pass: counts, bad input, val threshold, tokenizer sample),
`tokenizer` (load or train), `encoders` (the tiktoken fast path, HF fallback), `worker` (per-unit work in a worker
process of `dlx.data.pool`), `writer` (fixed-size shards), `encode` (second pass, commits, resume),
`outdir` (the --out folder's state and lock), `progress` (the bar), `pipeline` (prepare_dataset itself).
"""

from dlx.data.prepare.options import DEFAULT_SHARD_TOKENS, DEFAULT_VAL_FRACTION
from dlx.data.prepare.pipeline import prepare_dataset
from dlx.data.prepare.tokenizer import load_tokenizer

__all__ = ["DEFAULT_SHARD_TOKENS", "DEFAULT_VAL_FRACTION", "load_tokenizer", "prepare_dataset"]
