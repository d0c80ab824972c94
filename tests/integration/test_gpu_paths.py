"""CUDA-only paths checked on a CPU: restoring GPU random states on fewer GPUs, synthetic batches made on the device,
Dynamo reset between bench points, the peak-memory counter reset per record, the allocator setting for sweeps, and
the fixed costs `dlx bench` reports. Device queries are replaced where a CPU cannot answer them."""

from __future__ import annotations

import mmap
import os

import pytest
import torch

from dlx import device as dev
from dlx.bench import measure
from dlx.bench.points import BenchPoint, BenchSetup
from dlx.data.source import LoaderSettings
from dlx.data.synthetic import SyntheticLoader
from dlx.metrics.meter import ThroughputMeter
from dlx.metrics.peak import Peak
from dlx.model import resolve_model_args
from dlx.train.rundir import checkpoint as ckpt
from train_helpers import single_torch_thread

one_thread = pytest.fixture(autouse=True)(single_torch_thread)


class FakeCuda:
    """What torch.cuda would say on a machine with `count` GPUs: set_rng_state calls are recorded."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, count: int) -> None:
        self.restored: list[int] = []
        monkeypatch.setattr(torch.cuda, "is_available", lambda: count > 0)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
        monkeypatch.setattr(torch.cuda, "set_rng_state", lambda state, device: self.restored.append(device))


def cpu_rng_state(cuda_states: int) -> dict:
    state = ckpt.rng_state()
    state["cuda"] = [torch.zeros(16, dtype=torch.uint8) for _ in range(cuda_states)]
    return state


def test_rng_restore_with_fewer_gpus_restores_what_fits_and_says_so(monkeypatch):
    fake, notes = FakeCuda(monkeypatch, count=1), []
    ckpt.set_rng_state(cpu_rng_state(cuda_states=2), say=notes.append)
    assert fake.restored == [0]
    assert notes == [
        "resume: the checkpoint holds the random generator states of 2 GPU(s) and 1 are visible here: restored 1; "
        "any other GPU keeps its state seeded from train.seed"
    ]


def test_rng_restore_with_as_many_gpus_is_silent_and_with_none_says_so(monkeypatch):
    fake, notes = FakeCuda(monkeypatch, count=2), []
    ckpt.set_rng_state(cpu_rng_state(cuda_states=2), say=notes.append)
    assert fake.restored == [0, 1] and notes == []
    fake = FakeCuda(monkeypatch, count=0)
    ckpt.set_rng_state(cpu_rng_state(cuda_states=2), say=notes.append)
    assert fake.restored == [] and "2 GPU(s) and 0 are visible here: restored 0" in notes[0]
    ckpt.set_rng_state(cpu_rng_state(cuda_states=0), say=notes.append)  # a CPU checkpoint: nothing to say
    assert len(notes) == 1


def synthetic(vocab_size: int, seq_len: int, micro_batch_size: int, **settings) -> SyntheticLoader:
    return SyntheticLoader(vocab_size, LoaderSettings(seq_len=seq_len, micro_batch_size=micro_batch_size, **settings))


def test_synthetic_batches_are_made_on_the_device():
    """On the meta device every op must run there: one host tensor in the way would raise."""
    inputs, targets = next(synthetic(512, 16, 4, seed=3, device="meta"))
    assert inputs.device.type == targets.device.type == "meta"
    assert inputs.shape == targets.shape == (4, 16) and inputs.dtype == torch.int64


def test_synthetic_sequences_depend_only_on_seed_and_index():
    one = synthetic(512, 16, 4, seed=3)
    inputs, targets = next(one)
    assert torch.equal(inputs[:, 1:], targets[:, :-1])  # targets are the inputs shifted by one
    ranks = [next(synthetic(512, 16, 2, seed=3, rank=r, world_size=2))[0] for r in (0, 1)]
    assert torch.equal(torch.cat(ranks), inputs)  # two ranks see one process's batch
    resumed = synthetic(512, 16, 4, seed=3)
    resumed.load_state_dict(one.state_dict())
    assert torch.equal(next(resumed)[0], next(one)[0])
    assert not torch.equal(next(synthetic(512, 16, 4, seed=4))[0], inputs)
    continued = (inputs[:, 1:] == inputs[:, :-1] + 1).float().mean().item()
    assert 0.4 < continued < 0.7  # half the tokens continue the previous one (+ a few fresh draws that happen to)
    assert inputs.min() >= 0 and inputs.max() < 512


def test_synthetic_tokens_follow_the_zipf_like_distribution():
    tokens = torch.cat([next(synthetic(64, 512, 8, seed=s))[0].flatten() for s in range(4)])
    counts = torch.bincount(tokens, minlength=64).float()
    assert counts[:8].sum() > counts[-8:].sum() * 3  # small ids are drawn far more often


def test_each_compiled_bench_point_starts_from_a_fresh_dynamo(monkeypatch):
    events: list[str] = []
    monkeypatch.setattr(torch._dynamo, "reset", lambda: events.append("reset"))
    monkeypatch.setattr("dlx.parallel.wrap.apply_compile", lambda model: events.append("compile"))
    for compiled in (True, False):
        setup = BenchSetup("debug", torch.device("cpu"), compile=compiled, steps=1, warmup=0)
        for seq_len in (16, 32):
            measure.measure_point(setup, BenchPoint(seq_len, 1, 1, "fp32"))
    # compiled: a fresh Dynamo, the compile, and Dynamo reset again for the warm restart (the compile cache's first
    # step, `measure.warm_restart`); compile off: no reset
    assert events == ["reset", "compile", "reset"] * 2


def test_the_meter_reports_each_windows_own_peak_through_the_device_module(monkeypatch):
    """The CUDA calls behind dev.peak_memory_gb and dev.reset_peak_memory, faked: an allocator peak that the reset
    brings back to what is allocated now."""
    allocator = {"allocated": 1e9, "peak": 1e9}
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device: allocator["peak"])
    monkeypatch.setattr(
        torch.cuda, "reset_peak_memory_stats", lambda device: allocator.update(peak=allocator["allocated"])
    )
    cuda = torch.device("cuda", 0)
    meter = ThroughputMeter(resolve_model_args("debug"), 16, cuda, "bf16", peak=Peak(100.0, "test"))
    timings = {"step_s": 1.0}
    allocator["peak"] = 5e9  # window 1: a large step
    first = meter.record(step=1, loss=1.0, lr=None, grad_norm=None, tokens=16, timings=timings)
    allocator["peak"] = max(allocator["peak"], 2e9)  # window 2: smaller steps
    second = meter.record(step=2, loss=1.0, lr=None, grad_norm=None, tokens=16, timings=timings)
    assert (first["peak_mem_gb"], second["peak_mem_gb"]) == (5.0, 2.0)
    assert allocator["peak"] == 1e9  # reset after the second record too


def test_the_cpu_peak_is_reset_per_record_too():
    if not os.access("/proc/self/clear_refs", os.W_OK):
        pytest.skip("the CPU peak can only be reset on Linux with a writable /proc/self/clear_refs")
    cpu = torch.device("cpu")
    meter = ThroughputMeter(resolve_model_args("debug"), 16, cpu, "fp32", peak=Peak(1.0, "test"))
    block = mmap.mmap(-1, 100_000_000)  # 0.1 GB of its own pages (a torch block could reuse the heap's kept ones)
    for offset in range(0, len(block), mmap.PAGESIZE):
        block[offset] = 1  # touched
    block.close()
    first = meter.record(step=1, loss=1.0, lr=None, grad_norm=None, tokens=16, timings={"step_s": 1.0})
    second = meter.record(step=2, loss=1.0, lr=None, grad_norm=None, tokens=16, timings={"step_s": 1.0})
    assert second["peak_mem_gb"] < first["peak_mem_gb"] - 0.05


def test_sweeps_prefer_expandable_segments_unless_the_user_chose(monkeypatch):
    for name in dev.ALLOC_CONF_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    assert dev.prefer_expandable_segments() == "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"
    assert os.environ["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:512")
    assert dev.prefer_expandable_segments() == "PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:512"
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF")
    monkeypatch.setenv("PYTORCH_ALLOC_CONF", "expandable_segments:False")
    assert dev.prefer_expandable_segments() == "PYTORCH_ALLOC_CONF=expandable_segments:False"
    assert "PYTORCH_CUDA_ALLOC_CONF" not in os.environ


def test_bench_points_report_the_fixed_costs_share():
    setup = BenchSetup("debug", torch.device("cpu"), steps=2, warmup=1)
    bf16 = measure.measure_point(setup, BenchPoint(16, 2, 2, "bf16"))
    fp32 = measure.measure_point(setup, BenchPoint(16, 2, 1, "fp32"))
    assert 0 < bf16["optimizer_pct"] < 100 and 0 < bf16["weight_cast_pct"] < 100
    assert bf16["optimizer_pct"] == pytest.approx(100 * bf16["optimizer_s"] / bf16["step_s"])
    assert fp32["weight_cast_pct"] == 0.0  # nothing is cast in fp32


def test_pretrain_prefers_expandable_segments_as_bench_does(monkeypatch, tmp_path):
    from dlx.train.loop.trainer import pretrain
    from dlx.train.recipe import load_recipe
    from train_helpers import TINY

    for name in dev.ALLOC_CONF_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    pretrain(load_recipe(None, [*TINY, "--train.max_steps", "1"]), "t", tmp_path / "run")
    assert os.environ["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"


def test_an_explicit_gpu_under_torchrun_is_one_line_before_any_group(monkeypatch, tmp_path):
    from dlx.errors import UserError
    from dlx.train.loop.trainer import pretrain
    from dlx.train.recipe import load_recipe
    from train_helpers import TINY

    for name, value in {"RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2", "TORCHELASTIC_RUN_ID": "x"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: pytest.fail("no GPU may be touched"))
    config = load_recipe(None, [*TINY, "--train.max_steps", "1", "--train.device", "cuda:1"])
    with pytest.raises(UserError) as refused:
        pretrain(config, "t", tmp_path / "run")
    assert str(refused.value) == (
        "train.device cuda:1 under torchrun would put all 2 ranks on one GPU; set train.device cuda (or auto): each "
        "rank takes the GPU of its LOCAL_RANK"
    )
    assert not (tmp_path / "run").exists()
    with pytest.raises(UserError, match=r"^--device cuda:0 under torchrun"):
        dev.training_device("cuda:0", 0, 2, "--device")


def test_each_rank_saves_and_restores_its_own_gpu_random_state(monkeypatch, tmp_path):
    """Two ranks' generator states, each with a CUDA state of its own, gathered into rank 0's train_state.pt
    (the gather faked); on resume each rank restores its own, and a checkpoint without them gives rank 0's."""
    from types import SimpleNamespace

    states = [cpu_rng_state(cuda_states=1) for _ in range(2)]
    for rank, state in enumerate(states):
        state["cuda"][0].fill_(rank + 1)
    monkeypatch.setattr(ckpt, "gather_to_main", lambda state: states)
    strategy = SimpleNamespace(
        full_weights=lambda: None,
        save_sharded=lambda tmp, background: None,
        env=SimpleNamespace(is_main=True),
        model=SimpleNamespace(args=resolve_model_args("debug")),
        optimizer_state=lambda: {},
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(torch.optim.SGD([torch.zeros(1)], lr=1.0), lambda step: 1.0)
    ckpt._write_parts(tmp_path, strategy, scheduler, None, full_weights=False, background=False)
    saved = torch.load(tmp_path / ckpt.OPTIMIZER_STATE_FILE, weights_only=True)
    assert [int(s["cuda"][0][0]) for s in saved["rng_ranks"]] == [1, 2] and int(saved["rng"]["cuda"][0][0]) == 1
    restored: list[int] = []
    FakeCuda(monkeypatch, count=1)
    monkeypatch.setattr(torch.cuda, "set_rng_state", lambda state, device: restored.append(int(state[0])))
    for rank in (0, 1):
        ckpt.set_rng_state(ckpt.own_rng_state(saved, rank))
    ckpt.set_rng_state(ckpt.own_rng_state({"rng": saved["rng"]}, 1))  # written before every rank's were kept
    assert restored == [1, 2, 1]
