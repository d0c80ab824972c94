"""torchrun's entry point for tests/integration/test_parallel.py: `dlx` without report.md's plots (seconds of matplotlib
per run), and, when DLX_TEST_FAIL_RANK and DLX_TEST_FAIL_STEP are set, one rank that fails in a given step as a crashing
rank would (a RuntimeError in its forward/backward); with DLX_TEST_FLOAT8_GATHER=0, FSDP2 all-gathers float8 layers'
weights in bf16, as before torchao's float8 all-gather (tests/integration/test_float8.py compares the two); with
DLX_TEST_COMPILE_COUNTS set to a folder, torch.compile uses the `eager` backend and each rank writes Dynamo's
graph-break and graph counts there as it exits (RANK.json, for tests/integration/test_compile.py)."""

from __future__ import annotations

import atexit
import functools
import json
import os
import sys
from pathlib import Path

from dlx.cli.app import main
from dlx.train.loop import finish, trainer


def fail_in_step(step: int, rank: str) -> None:
    accumulate = trainer.accumulate_gradients
    calls = []

    def failing(*args, **kwargs):
        calls.append(None)
        if len(calls) == step:
            raise RuntimeError(f"injected failure on rank {rank} in step {step}")
        return accumulate(*args, **kwargs)

    trainer.accumulate_gradients = failing


def count_compilation(folder: Path) -> None:
    import torch
    from torch._dynamo.utils import counters

    torch.compile = functools.partial(torch.compile, backend="eager")

    def write() -> None:
        counts = {"graph_break": dict(counters["graph_break"]), "unique_graphs": counters["stats"]["unique_graphs"]}
        (folder / f"{os.environ['RANK']}.json").write_text(json.dumps(counts))

    atexit.register(write)


if __name__ == "__main__":
    finish.write_report = lambda *args, **kwargs: None
    fail_rank = os.environ.get("DLX_TEST_FAIL_RANK")
    if fail_rank is not None and os.environ.get("RANK") == fail_rank:
        fail_in_step(int(os.environ["DLX_TEST_FAIL_STEP"]), fail_rank)
    if os.environ.get("DLX_TEST_FLOAT8_GATHER") == "0":
        from dlx.train.build import model as model_build

        model_build.gathers_in_float8 = lambda recipe, strategy: False
    if os.environ.get("DLX_TEST_COMPILE_COUNTS"):
        count_compilation(Path(os.environ["DLX_TEST_COMPILE_COUNTS"]))
    sys.argv[0] = "dlx"
    main()
