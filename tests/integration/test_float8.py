"""train.float8 on the CPU (torch's float8 matmul there is oneDNN's reference kernel: correct, slow): a model with
every block linear in float8 trains within 2 % of bf16's loss at the same seed, both recipes, in one process and under
ddp and fsdp on 2-rank gloo (fsdp tensorwise all-gathers its weights in float8); it resumes bit-identically and exports
plain Hugging Face weights. Refused in one line before step 1 where it cannot run (no torchao, a device without float8
matmuls, a precision or layout it does not combine with).

The model: the debug preset cut to dim 32, 1 layer, 2 heads, 1 KV head (head dim 16, ffn 96), vocabulary 128: every
block linear has dimensions divisible by 16 and converts, and a float8 step takes about 0.1 s (the reference kernel
costs some 30 M multiply-adds a second)."""

from __future__ import annotations

import shutil
import sys
import types

import pytest
import torch
from safetensors.torch import load_file

from dlx import device as dev
from dlx.errors import UserError
from dlx.model import resolve_model_args
from dlx.model.llama import Transformer
from dlx.parallel import float8
from dlx.train.launch import launch
from dlx.train.loop.trainer import pretrain
from dlx.train.recipe import load_recipe
from train_helpers import TINY, losses, train_quietly

pytestmark = pytest.mark.usefixtures("in_process_training")

FLOAT8 = [*TINY, "--train.max_steps", "1", "--train.float8", "true"]
SHAPE = {"dim": 32, "n_layers": 1, "n_heads": 2, "n_kv_heads": 1, "vocab_size": 128}
RUN = [
    "--model.preset",
    "debug",
    *(item for key, value in SHAPE.items() for item in (f"--model.{key}", str(value))),
    "--data.seq_len",
    "16",
    "--data.micro_batch_size",
    "2",
    "--train.global_batch_size",
    "4",
    "--train.precision",
    "bf16",
    "--train.lr",
    "3e-3",
    "--train.max_steps",
    "30",
    "--eval.every",
    "0",
    "--checkpoint.every",
    "10",
    "--checkpoint.keep_last",
    "3",
    "--log.every",
    "1",
    "--log.progress",
    "false",
]
"""Global batch 4: gradient accumulation 2 in one process, 1 on each of 2 ranks. Checkpoints at steps 10, 20, 30."""
RECIPES = {
    "bf16": [],
    "tensorwise": ["--train.float8", "true", "--train.float8_recipe", "tensorwise"],
    "rowwise": ["--train.float8", "true", "--train.float8_recipe", "rowwise"],
}
BLOCK_LINEARS = [f"layers.0.attention.{n}" for n in ("wq", "wk", "wv", "wo")]
BLOCK_LINEARS += [f"layers.0.feed_forward.{n}" for n in ("w1", "w2", "w3")]
LOSS_TOLERANCE = 0.02
"""float8's loss against bf16's at the last step, relative: the GPU target (benchmarks/gpu/next_contact.py)."""
GATHER_TOLERANCE = 0.005
"""FSDP2 gathering weights in float8 against gathering them in bf16, relative, at every step: the one difference is
the cast fp32 → float8 instead of fp32 → bf16 → float8 (measured: at most 0.11 %)."""


def relative_gap(got: dict[int, float], expected: dict[int, float], step: int) -> float:
    return abs(got[step] / expected[step] - 1)


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    """Run folders of the one-process runs, by recipe (bf16 for none), made on first use."""
    runs = {}

    def get(recipe: str):
        if recipe not in runs:
            runs[recipe] = train_quietly([*RUN, *RECIPES[recipe]], tmp_path_factory.mktemp(recipe) / "run")
        return runs[recipe]

    return get


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    """(run folder, torchrun's result) of the 2-rank runs, by (strategy, recipe, gather in float8), on first use."""
    from test_parallel import torchrun

    runs = {}

    def get(strategy: str, recipe: str, gather: bool = True):
        key = strategy, recipe, gather
        if key not in runs:
            run_dir = tmp_path_factory.mktemp(f"{strategy}-{recipe}") / "run"
            argv = ["pretrain", *RUN, *RECIPES[recipe], "--parallel.strategy", strategy, "--run-dir", str(run_dir)]
            result, _ = torchrun(argv, run_dir.parent, DLX_TEST_FLOAT8_GATHER="1" if gather else "0")
            assert result.returncode == 0, result.stderr[-6000:]
            runs[key] = run_dir, result
        return runs[key]

    return get


def header_line(recipe: str, gathered: bool) -> str:
    from torchao import __version__

    gather = ", their weights all-gathered in float8 by FSDP2" if gathered else ""
    return (
        f"float8 ({recipe}, torchao {__version__}): 7 of 8 linear layers{gather}; on a CPU float8 checks numerics, not "
        "speed (oneDNN's reference float8 matmul, far slower than bf16)"
    )


@pytest.mark.parametrize(
    ("overrides", "why"),
    [
        (["--train.precision", "fp32"], "precision fp32"),
        (["--train.precision", "fp16"], "precision fp16"),
        (["--parallel.strategy", "deepspeed", "--train.precision", "bf16"], "deepspeed"),
        (["--parallel.tp", "2", "--train.precision", "bf16", "--model.n_kv_heads", "2"], "tp 2"),
    ],
)
def test_float8_with_a_precision_or_layout_it_does_not_take_is_one_line(overrides, why):
    with pytest.raises(UserError) as refused:
        load_recipe(None, [*FLOAT8, *overrides])
    assert str(refused.value) == (
        "recipe: train.float8 runs with train.precision bf16 (or auto), parallel.strategy none, ddp or fsdp and "
        "parallel.tp 1; set train.float8 false or change those"
    ), why


def test_without_torchao_it_is_one_line_before_anything_is_written(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "torchao", None)  # import torchao raises ImportError
    with pytest.raises(
        UserError, match=r"^train.float8 needs torchao, which is not installed: pip install 'dlx\[float8\]'$"
    ):
        pretrain(load_recipe(None, [*FLOAT8, "--train.precision", "bf16"]), "t", tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_this_cpu_runs_float8_matmuls():
    assert dev.float8_capability(torch.device("cpu")) is None


@pytest.fixture
def torchao_importable(monkeypatch):
    """An importable `torchao.float8` (torchao itself where installed), so that the device check is reached."""
    if "torchao.float8" not in sys.modules:
        package, module = types.ModuleType("torchao"), types.ModuleType("torchao.float8")
        package.float8 = module
        monkeypatch.setitem(sys.modules, "torchao", package)
        monkeypatch.setitem(sys.modules, "torchao.float8", module)


@pytest.mark.usefixtures("torchao_importable")
def test_a_device_without_float8_matmuls_is_one_line_before_step_one(monkeypatch, tmp_path):
    """A torch build whose `_scaled_mm` has no float8 kernel for the device (older torch on a CPU, MPS)."""

    def no_kernel(*args, **kwargs):
        raise RuntimeError("_scaled_mm_cpu: float8 is not supported\n(a second line of detail)")

    monkeypatch.setattr(torch, "_scaled_mm", no_kernel)
    with pytest.raises(UserError) as refused:
        pretrain(load_recipe(None, [*FLOAT8, "--train.precision", "bf16"]), "t", tmp_path / "run")
    assert str(refused.value) == (
        f"train.float8: cpu has no float8 matmuls in torch {torch.__version__} (torch._scaled_mm: _scaled_mm_cpu: "
        "float8 is not supported); set train.float8 false (bf16 trains everywhere)"
    )
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_gpus_before_compute_capability_8_9_have_no_float8(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device: "NVIDIA A100-SXM4-80GB")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device: (8, 0))
    assert dev.float8_capability(torch.device("cuda", 0)) == (
        "NVIDIA A100-SXM4-80GB is compute capability 8.0; float8 needs 8.9 or later"
    )
    for capability in ((8, 9), (9, 0), (10, 0)):
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device, c=capability: c)
        assert dev.float8_capability(torch.device("cuda", 0)) is None


def test_on_cuda_torchao_chooses_the_layers_and_never_the_output_head(monkeypatch):
    """torchao's filter (H100 speed thresholds) on llama3.2-1b's shapes, on the meta device: nothing is allocated."""
    pytest.importorskip("torchao.float8")
    monkeypatch.setattr(float8, "check_float8_device", lambda device: None)
    cuda = torch.device("cuda", 0)
    with torch.device("meta"):
        model = Transformer(resolve_model_args("llama3.2-1b", n_layers=1))
    tensorwise = float8.apply_float8(model, "tensorwise", cuda)
    assert sorted(tensorwise) == sorted(
        f"layers.0.{n}"
        for n in ("attention.wq", "attention.wo", "feed_forward.w1", "feed_forward.w2", "feed_forward.w3")
    )
    with torch.device("meta"):
        model = Transformer(resolve_model_args("llama3.2-1b", n_layers=1))
    assert sorted(float8.apply_float8(model, "rowwise", cuda)) == [
        "layers.0.feed_forward.w1",
        "layers.0.feed_forward.w3",
    ]
    with torch.device("meta"):
        model = Transformer(resolve_model_args("debug", **SHAPE))
    assert float8.apply_float8(model, "tensorwise", cuda) == []  # too small to gain on a GPU


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_on_a_cpu_every_block_linear_with_dimensions_divisible_by_16_converts(recipe):
    from torchao.float8.float8_linear import Float8Linear

    with torch.device("meta"):
        model = Transformer(resolve_model_args("debug", **SHAPE))
    assert sorted(float8.apply_float8(model, recipe, torch.device("cpu"))) == sorted(BLOCK_LINEARS)
    assert not isinstance(model.output, Float8Linear)
    with torch.device("meta"):
        model = Transformer(resolve_model_args("debug", **{**SHAPE, "dim": 48, "n_heads": 4}))  # wk, wv: 12 × 48
    unconverted = {"layers.0.attention.wk", "layers.0.attention.wv"}
    assert sorted(float8.apply_float8(model, recipe, torch.device("cpu"))) == sorted(set(BLOCK_LINEARS) - unconverted)


@pytest.mark.slow  # 3 runs of 30 steps: about 8 s
@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_float8_trains_within_2_percent_of_bf16_in_one_process(recipe, one_process):
    bf16, got = losses(one_process("bf16")), losses(one_process(recipe))
    assert sorted(got) == list(range(1, 31))
    assert relative_gap(got, bf16, 30) <= LOSS_TOLERANCE, (got[30], bf16[30])
    assert got != bf16  # the matmuls did run in float8


@pytest.mark.slow  # 2 runs of 30 steps and a resume: about 6 s
def test_a_float8_run_resumes_bit_identically(one_process, tmp_path):
    uninterrupted = one_process("tensorwise")
    resumed = tmp_path / "resumed"
    shutil.copytree(uninterrupted, resumed)
    shutil.rmtree(resumed / "checkpoints" / "step-00000030")
    assert launch(None, [], resumed, resume=True) == 0
    assert losses(resumed) == losses(uninterrupted)


@pytest.mark.slow  # 2 runs of 30 steps, 2 exports: about 7 s
def test_a_float8_run_exports_the_weights_of_plain_linear_layers(one_process, tmp_path):
    from transformers import AutoModelForCausalLM

    from dlx.cli.model_commands import export_hf
    from dlx.model.io import load_model

    for recipe in ("bf16", "tensorwise"):
        export_hf(one_process(recipe), tmp_path / recipe)
    exported = load_file(tmp_path / "tensorwise" / "model.safetensors")
    assert sorted(exported) == sorted(load_file(tmp_path / "bf16" / "model.safetensors"))
    assert all(type(t) is torch.Tensor and t.dtype == torch.float32 for t in exported.values())
    hf = AutoModelForCausalLM.from_pretrained(tmp_path / "tensorwise", dtype=torch.float32).eval()
    model = load_model(one_process("tensorwise") / "checkpoints" / "step-00000030").eval()
    tokens = torch.randint(0, SHAPE["vocab_size"], (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(hf(tokens).logits, model(tokens), atol=1e-4, rtol=0)


@pytest.mark.slow  # a 2-rank torchrun of 30 steps: about 20 s each
@pytest.mark.distributed
@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_two_ranks_train_float8_within_2_percent_of_bf16(strategy, recipe, two_ranks, one_process):
    """Against one process's bf16 run on the same global batch and seed."""
    run_dir, result = two_ranks(strategy, recipe)
    bf16, got = losses(one_process("bf16")), losses(run_dir)
    assert sorted(got) == list(range(1, 31))
    assert relative_gap(got, bf16, 30) <= LOSS_TOLERANCE, (got[30], bf16[30])
    gathered = strategy == "fsdp" and recipe == "tensorwise"
    assert header_line(recipe, gathered) in result.stdout.splitlines(), result.stdout
    weights = load_file(run_dir / "checkpoints" / "step-00000030" / "model.safetensors")  # gathered to rank 0
    reference = load_file(one_process("bf16") / "checkpoints" / "step-00000030" / "model.safetensors")
    assert {k: v.shape for k, v in weights.items()} == {k: v.shape for k, v in reference.items()}


@pytest.mark.slow  # two 2-rank torchruns of 30 steps (one shared with the test above): about 40 s
@pytest.mark.distributed
def test_fsdp_gathering_weights_in_float8_trains_as_gathering_them_in_bf16(two_ranks):
    float8_gather, bf16_gather = (
        losses(two_ranks("fsdp", "tensorwise")[0]),
        losses(two_ranks("fsdp", "tensorwise", False)[0]),
    )
    assert max(relative_gap(float8_gather, bf16_gather, step) for step in bf16_gather) <= GATHER_TOLERANCE
    assert float8_gather != bf16_gather  # the all-gather did cast differently
    assert header_line("tensorwise", False) in two_ranks("fsdp", "tensorwise", False)[1].stdout.splitlines()


@pytest.mark.slow  # a 2-rank torchrun of 30 steps (shared) and one of 10: about 30 s
@pytest.mark.distributed
def test_fsdp_float8_with_precomputed_scales_resumes_bit_identically(two_ranks, tmp_path):
    """The uninterrupted run's step 21 casts with the scales precomputed after step 20; the resumed run's step 21
    computes them in its first all-gather, from the same weights: the same scales, the same losses."""
    from test_parallel import torchrun

    uninterrupted = two_ranks("fsdp", "tensorwise")[0]
    resumed = tmp_path / "resumed"
    shutil.copytree(uninterrupted, resumed)
    shutil.rmtree(resumed / "checkpoints" / "step-00000030")
    result, _ = torchrun(["pretrain", "--resume", "--run-dir", str(resumed)], tmp_path)
    assert result.returncode == 0, result.stderr[-6000:]
    assert losses(resumed) == losses(uninterrupted)
