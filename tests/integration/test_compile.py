"""Compile without surprises: every block is one graph (a graph break is an error), nothing recompiles after the first
step, and the flex_attention document mask keeps one graph across batches; the same with train.float8 (both recipes)
and with a train.attention kernel applied. Dynamo decides graph breaks and recompiles before any backend runs, so the
tests compile with the `eager` backend: seconds instead of minutes of C++ compilation, the same guards. Where what
AOTAutograd traces matters (torchao's float8 tensor subclasses, the SDPA kernel fixed at trace time), `aot_eager`
keeps the aten graphs that Inductor would receive; a slow test runs Inductor itself on tensorwise float8."""

from __future__ import annotations

import functools
import json

import pytest
import torch
import torch.nn.functional as F
from test_float8 import RUN as FLOAT8_RUN
from test_float8 import SHAPE as FLOAT8_SHAPE
from torch._dynamo.backends.common import aot_autograd
from torch._dynamo.utils import counters
from torch._functorch.aot_autograd import make_boxed_func

import dlx.model.document_mask as document_mask
from dlx.device import prefer_sdpa_kernel
from dlx.model import resolve_model_args
from dlx.model.attention_kernels import AttentionChoice
from dlx.model.llama import Transformer
from dlx.parallel.config import ParallelConfig
from dlx.parallel.distributed import DistEnv
from dlx.parallel.float8 import apply_float8
from dlx.parallel.wrap import parallelize
from dlx.train.observers.attention import AttentionObserver
from train_helpers import losses, single_torch_thread, train_quietly

TORCH_COMPILE = torch.compile
"""torch.compile itself, which the fixtures below give a backend."""
one_thread = pytest.fixture(autouse=True)(single_torch_thread)


@pytest.fixture(autouse=True)
def eager_backend(monkeypatch):
    """torch.compile (and nn.Module.compile, which calls it) with the eager backend, from a fresh Dynamo."""
    monkeypatch.setattr(torch, "compile", functools.partial(TORCH_COMPILE, backend="eager"))
    torch._dynamo.reset()
    counters.clear()
    yield
    torch._dynamo.reset()


def compiled_model(checkpointing: str, compile: bool = True, float8: str | None = None) -> Transformer:
    """The debug model in bf16 as `parallelize` wraps it; with `float8` (a recipe) the float8 test's tiny shape
    converted first, as `dlx.train.build.model` does."""
    torch.manual_seed(0)
    model = Transformer(resolve_model_args("debug", **(FLOAT8_SHAPE if float8 else {})))
    if float8:
        apply_float8(model, float8, torch.device("cpu"))
    config = ParallelConfig(activation_checkpointing=checkpointing)
    return parallelize(model, config, compile, torch.device("cpu"), DistEnv(), "bf16")


def train_steps(model: torch.nn.Module, steps: int) -> list[float]:
    """`steps` optimizer steps on random batches (the same at every call); a recompile after the first is an error."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    generator = torch.Generator().manual_seed(1)
    vocab = model.output.out_features
    losses = []
    for step in range(steps):
        tokens = torch.randint(0, vocab, (2, 33), generator=generator)
        with torch._dynamo.config.patch(error_on_recompile=step > 0), torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(tokens[:, :-1], targets=tokens[:, 1:], z_loss=1e-4).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


def keep_aten_graphs(monkeypatch) -> list[str]:
    """torch.compile with `aot_eager` that also keeps the code of every forward and backward graph it runs."""
    graphs: list[str] = []

    def keep(graph: torch.fx.GraphModule, example_inputs) -> object:
        graphs.append(graph.code)
        return make_boxed_func(graph)

    backend = aot_autograd(fw_compiler=keep, bw_compiler=keep)
    monkeypatch.setattr(torch, "compile", functools.partial(TORCH_COMPILE, backend=backend))
    return graphs


def calls(graphs: list[str], op: str) -> int:
    return sum(code.count(f"torch.ops.aten.{op}.default(") for code in graphs)


@pytest.mark.parametrize("checkpointing", ["none", "full"])
def test_training_steps_compile_once_without_graph_breaks(checkpointing):
    train_steps(compiled_model(checkpointing), 3)
    assert dict(counters["graph_break"]) == {}
    assert counters["stats"]["unique_graphs"] >= 2  # the blocks' graph and the loss math's: both compiled


def test_a_graph_break_in_a_block_is_an_error(monkeypatch):
    """fullgraph=True: what would split a block into eager pieces stops the run instead."""
    model = compiled_model("none")

    def silu_that_prints(x: torch.Tensor) -> torch.Tensor:
        print("a side effect Dynamo cannot put in a graph")
        return torch.sigmoid(x) * x

    monkeypatch.setattr("dlx.model.llama.F.silu", silu_that_prints)
    with pytest.raises(torch._dynamo.exc.Unsupported):
        model(torch.zeros(1, 8, dtype=torch.long))


def test_the_flex_document_mask_compiles_once_across_batches(monkeypatch):
    """Each batch brings a new BlockMask over new document ids (a new mask closure): the compiled blocks keep their
    one graph. CPU flex_attention has no backward, so forward only."""
    monkeypatch.setattr(document_mask, "uses_flex", lambda device: True)
    model = compiled_model("none")
    generator = torch.Generator().manual_seed(2)
    for step in range(3):
        tokens = torch.randint(0, 512, (2, 129), generator=generator)
        ids = torch.randint(0, 3, (2, 128), generator=generator).sort(dim=1).values
        ids -= ids[:, :1].clone()  # ids count from 0 along each row
        with torch._dynamo.config.patch(error_on_recompile=step > 0), torch.no_grad():
            parts = model(tokens[:, :-1], targets=tokens[:, 1:], document_ids=ids)
        assert torch.isfinite(parts.loss)
    assert dict(counters["graph_break"]) == {}


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_float8_training_steps_compile_once_without_graph_breaks(recipe, monkeypatch):
    """torchao's float8 tensors trace into the blocks' one graph: every converted linear's matmuls are float8 matmuls
    in the aten graphs (7 linears: 7 forward, 14 backward), and the losses are eager float8's, bit for bit."""
    eager = train_steps(compiled_model("none", compile=False, float8=recipe), 4)
    graphs = keep_aten_graphs(monkeypatch)
    compiled = train_steps(compiled_model("none", float8=recipe), 4)
    assert dict(counters["graph_break"]) == {}
    assert counters["stats"]["unique_graphs"] == 2
    assert calls(graphs, "_scaled_mm") == 7 + 14
    assert compiled == eager


INDUCTOR_TOLERANCE = 2e-4
"""Inductor's float8 losses against eager's, relative, at every step: Inductor fuses the scaling and casting around
each float8 matmul and rounds differently (measured over these 4 steps: at most 3.8e-5 tensorwise, 2.9e-5 rowwise)."""


@pytest.mark.slow  # Inductor's C++ compilation of the tiny model's graphs: 30-55 s cold, under 10 s from its cache
@pytest.mark.parametrize("recipe", ["tensorwise"])  # the GPU run's; rowwise passes too (about 40 s more)
def test_inductor_compiles_float8_training_on_a_cpu(recipe, monkeypatch):
    eager = train_steps(compiled_model("none", compile=False, float8=recipe), 4)
    monkeypatch.setattr(torch, "compile", TORCH_COMPILE)  # the default backend, Inductor
    compiled = train_steps(compiled_model("none", float8=recipe), 4)
    assert dict(counters["graph_break"]) == {}
    gaps = [abs(c / e - 1) for c, e in zip(compiled, eager, strict=True)]
    assert max(gaps) <= INDUCTOR_TOLERANCE, (compiled, eager)


@pytest.mark.parametrize(
    ("recipe", "attention", "eval_every", "graphs"), [("tensorwise", "math", 0, 2), ("rowwise", "default", 2, 3)]
)
def test_a_compiled_float8_run_compiles_each_graph_once(recipe, attention, eval_every, graphs, tmp_path):
    """`dlx pretrain` with train.compile, train.float8 and train.attention, 4 steps of 2 micro-batches: no graph
    break, the blocks' graph and the loss's compiled at step 1 and reused after. An evaluation runs without grad,
    which Dynamo guards: the first one compiles the blocks' no-grad graph, the later ones reuse it."""
    overrides = ["--train.float8", "true", "--train.float8_recipe", recipe, "--train.attention", attention]
    overrides += ["--train.compile", "true", "--train.max_steps", "4", "--checkpoint.every", "0"]
    run = train_quietly([*FLOAT8_RUN, *overrides, "--eval.every", str(eval_every)], tmp_path)
    assert sorted(losses(run)) == [1, 2, 3, 4]
    evaluated = (run / "eval.jsonl").read_text().splitlines() if eval_every else []
    assert [json.loads(line)["step"] for line in evaluated] == ([2, 4] if eval_every else [])
    assert dict(counters["graph_break"]) == {}
    assert counters["stats"]["unique_graphs"] == graphs


FLASH = ["_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_flash_attention_for_cpu_backward"]
MATH = ["_safe_softmax", "_softmax_backward_data"]  # SDPA's math kernel as AOTAutograd decomposes it


@pytest.mark.parametrize(("kernel", "runs", "not_run"), [("math", MATH, FLASH), (None, FLASH, MATH)])
def test_a_train_attention_kernel_is_fixed_in_the_blocks_graph_without_breaks(kernel, runs, not_run, monkeypatch):
    """train.attention math, or default (None: PyTorch's own choice, flash on a CPU), applied before step 1 outside
    the compiled blocks: the aten graphs call that kernel, once forward and once backward, and not the other; one
    graph, no recompile."""
    graphs = keep_aten_graphs(monkeypatch)
    model = compiled_model("none")
    observer = AttentionObserver(AttentionChoice(kernel, kernel or "default"), False, torch.device("cpu"))
    try:
        observer.apply(model)
        train_steps(model, 3)
    finally:
        observer.close()
    assert dict(counters["graph_break"]) == {}
    assert counters["stats"]["unique_graphs"] == 2
    assert [calls(graphs, op) for op in runs + not_run] == [1, 1, 0, 0]


def test_prefer_sdpa_kernel_inside_a_compiled_region_would_break_it():
    """Why dlx applies the kernel outside the compiled blocks (`AttentionObserver.apply`): inside, its compile-cache
    tag (torch.compiler.config.patch) is a function Dynamo will not trace. sdpa_kernel(set_priority=True) itself
    traces in this torch (pytorch#149725, fixed by pytorch#160684)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def with_priority(q: torch.Tensor) -> torch.Tensor:
        with sdpa_kernel([SDPBackend.MATH], set_priority=True):
            return F.scaled_dot_product_attention(q, q, q, is_causal=True)

    def with_dlx_kernel(q: torch.Tensor) -> torch.Tensor:
        with prefer_sdpa_kernel("math"):
            return F.scaled_dot_product_attention(q, q, q, is_causal=True)

    q = torch.randn(1, 2, 8, 16)
    assert torch.equal(torch.compile(with_priority, fullgraph=True)(q), with_priority(q))
    with pytest.raises(torch._dynamo.exc.Unsupported, match=r"ConfigModule\.patch"):
        torch.compile(with_dlx_kernel, fullgraph=True)(q)


@pytest.mark.slow  # a 2-rank torchrun of 4 steps: 16-25 s
@pytest.mark.distributed
def test_fsdp_gathering_float8_weights_compiles_each_graph_once_on_every_rank(tmp_path):
    """The GPU run's layout: fsdp, tensorwise float8 with FSDP2 all-gathering the weights in float8, compiled blocks,
    evaluating every 2 steps. Each rank (counting in tests/parallel_entry.py): no graph break, 3 graphs as in one
    process (training's 2, the first evaluation's no-grad one)."""
    from test_parallel import torchrun

    (tmp_path / "counts").mkdir()
    overrides = ["--train.float8", "true", "--train.float8_recipe", "tensorwise", "--parallel.strategy", "fsdp"]
    overrides += ["--train.compile", "true", "--train.max_steps", "4", "--checkpoint.every", "0", "--eval.every", "2"]
    argv = ["pretrain", *FLOAT8_RUN, *overrides, "--run-dir", str(tmp_path / "run")]
    result, _ = torchrun(argv, tmp_path, DLX_TEST_COMPILE_COUNTS=str(tmp_path / "counts"))
    assert result.returncode == 0, result.stderr[-6000:]
    assert "their weights all-gathered in float8 by FSDP2" in result.stdout
    assert sorted(losses(tmp_path / "run")) == [1, 2, 3, 4]
    counts = [json.loads((tmp_path / "counts" / f"{rank}.json").read_text()) for rank in (0, 1)]
    assert counts == [{"graph_break": {}, "unique_graphs": 3}] * 2
