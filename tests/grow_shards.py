"""torchrun entry point for tests/integration/test_vocab_growth.py: a grown vocabulary loaded shard-wise into a model
FSDP2 sharded on the meta device (each rank fills its own rows of the grown embedding and head), gathered and compared
with one process's grown load. argv: the Hugging Face folder, the extended tokenizer.json, the vocabulary size, the
report."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.fsdp import fully_shard

from dlx.model.hf import read_hf_args
from dlx.model.io import empty_model
from dlx.model.llama import Transformer
from dlx.train.build.model import load_initial_weights
from dlx.train.rundir.trained import resolve_trained


def main(hf_dir: str, tokenizer: str, vocab_size: str, report: str) -> None:
    dist.init_process_group("gloo")
    source = resolve_trained(hf_dir, "model.init_from")
    args = read_hf_args(hf_dir).model_copy(update={"vocab_size": int(vocab_size)})
    with torch.device("meta"):
        model = Transformer(args)
    for block in model.layers:
        fully_shard(block)
    fully_shard(model)
    model.to_empty(device="cpu")
    model.init_rope("cpu")
    load_initial_weights(model, source, Path(tokenizer))
    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if dist.get_rank() == 0:
        whole = empty_model(args, "cpu", torch.float32)
        load_initial_weights(whole, source, Path(tokenizer))
        expected = whole.state_dict()
        difference = max((full[name] - expected[name]).abs().max().item() for name in expected)
        with open(report, "w") as f:
            json.dump({"difference": difference, "rows": full["tok_embeddings.weight"].shape[0]}, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:5])
