"""torchrun entry point for tests/integration/test_init_from_parallel.py: the initial weights loaded shard-wise into a
model that FSDP2 sharded on the meta device (each rank allocates and reads only its own rows), then gathered and
compared with one process's load. Writes a JSON report to argv[2]; argv[1] is the Hugging Face folder."""

from __future__ import annotations

import json
import sys

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.fsdp import fully_shard

from dlx.model.hf import load_hf, read_hf_args
from dlx.model.llama import Transformer
from dlx.train.build.model import load_initial_weights
from dlx.train.rundir.trained import resolve_trained


def main(hf_dir: str, report: str) -> None:
    dist.init_process_group("gloo")
    source = resolve_trained(hf_dir, "model.init_from")
    with torch.device("meta"):
        model = Transformer(read_hf_args(hf_dir))
    for block in model.layers:
        fully_shard(block)
    fully_shard(model)
    model.to_empty(device="cpu")
    model.init_rope("cpu")
    load_initial_weights(model, source)
    local = sum(p.to_local().numel() for p in model.parameters())
    total = sum(p.numel() for p in model.parameters())
    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if dist.get_rank() == 0:
        expected = load_hf(hf_dir).state_dict()
        difference = max((full[name] - expected[name]).abs().max().item() for name in expected)
        result = {"difference": difference, "names_match": sorted(full) == sorted(expected)}
        result.update(local_share=local / total)
        with open(report, "w") as f:
            json.dump(result, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
