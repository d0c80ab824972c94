"""Corpus → token shards: `prepare_dataset` (what `dlx prepare` runs on one machine), `prepare_task` and
`merge_tasks` (the same split across machines), and `load_tokenizer` (for decoding).

Modules, in the order data flows: `inputs` (files, folders, globs → files in order, streamed), `units` (files → work
units; `frames` finds where a .zst can be cut), `readers` (units → documents), `scan` (counting what is read; the first
pass: bad input, val threshold, tokenizer sample), `tokenizer` (load or train), `encoders` (the tiktoken fast path, HF
fallback), `worker` (a unit → a part, in a worker process of `dlx.data.pool`), `parts` (a part's files and
routing them to train/val), `writer` (fixed-size shards), `encode` (second pass, commits, resume), `outdir` (the --out
folder's state, lock and manifest writes), `progress` (the bar), `pipeline` (prepare_dataset itself), `taskdir` (the
plan and task folders of a split run), `tasks` (one task), `merge` (the merge).
"""

from dlx.data.prepare.merge import merge_tasks
from dlx.data.prepare.options import DEFAULT_SHARD_TOKENS, DEFAULT_VAL_FRACTION
from dlx.data.prepare.pipeline import prepare_dataset
from dlx.data.prepare.tasks import prepare_task
from dlx.data.prepare.tokenizer import load_tokenizer

__all__ = [
    "DEFAULT_SHARD_TOKENS",
    "DEFAULT_VAL_FRACTION",
    "load_tokenizer",
    "merge_tasks",
    "prepare_dataset",
    "prepare_task",
]
