"""The NVML path with a fake `pynvml` module: these tests check dlx's parsing, averaging and plumbing (records, console
line, `dlx bench`), not NVML itself or a GPU, which this machine does not have."""

from __future__ import annotations

import json
import sys
import time
import types

import pytest
import torch

from dlx import device as dev
from dlx.metrics import gpu_monitor
from dlx.metrics.gpu_monitor import GPM_METRICS, NoGpuCounters, NvmlCounters, open_gpu_counters

pytestmark = pytest.mark.usefixtures("in_process_training")

GPM_VALUES = {"sm_active_pct": 88.0, "tensor_active_pct": 31.5, "fp32_active_pct": 4.25, "fp16_active_pct": 0.5}
"""What the fake GPM reports; DRAM_BW_UTIL answers with an error code (the column becomes null)."""


class FakeNvml(types.ModuleType):
    """pynvml's names that dlx uses, answering from scripts and logging the calls."""

    class NVMLError(Exception):
        pass

    NVML_SUCCESS = 0
    NVML_GPM_METRICS_GET_VERSION = 1

    def __init__(self, utilization: list[tuple[int, int]], gpm: bool = True) -> None:
        super().__init__("pynvml")
        self.script, self.reads, self.gpm, self.calls = list(utilization), [], gpm, []
        for slot, name in enumerate(GPM_METRICS.values()):
            setattr(self, name, 100 + slot)

    def nvmlInit(self):
        self.calls.append("init")

    def nvmlShutdown(self):
        self.calls.append("shutdown")

    def nvmlDeviceGetHandleByIndex(self, index):
        return f"gpu{index}"

    def nvmlDeviceGetUtilizationRates(self, handle):
        gpu, memory = self.script[len(self.reads) % len(self.script)]
        self.reads.append((gpu, memory))
        return types.SimpleNamespace(gpu=gpu, memory=memory)

    def nvmlGpmQueryDeviceSupport(self, handle):
        return types.SimpleNamespace(isSupportedDevice=int(self.gpm))

    def nvmlGpmSampleAlloc(self):
        return types.SimpleNamespace(taken=[])

    def nvmlGpmSampleGet(self, handle, sample):
        sample.taken.append(len(self.calls))
        self.calls.append("sample")

    def nvmlGpmSampleFree(self, sample):
        self.calls.append("free")

    def c_nvmlGpmMetricsGet_t(self):
        metrics = [types.SimpleNamespace(metricId=0, value=0.0, nvmlReturn=-1) for _ in range(8)]
        return types.SimpleNamespace(version=0, numMetrics=0, sample1=None, sample2=None, metrics=metrics)

    def nvmlGpmMetricsGet(self, request):
        assert request.version == 1 and request.sample1 is not request.sample2
        self.calls.append(("metrics", request.sample1.taken[-1], request.sample2.taken[-1]))
        by_id = {getattr(self, constant): key for key, constant in GPM_METRICS.items()}
        for metric in request.metrics[: request.numMetrics]:
            key = by_id[metric.metricId]
            metric.nvmlReturn, metric.value = (0, GPM_VALUES[key]) if key in GPM_VALUES else (3, 0.0)


def test_utilisation_is_the_mean_of_the_reads_and_gpm_covers_the_window():
    fake = FakeNvml([(90, 40), (100, 50), (70, 33)])
    counters = NvmlCounters(fake, 0, interval_s=0.001)
    while len(fake.reads) < 5:  # the thread sleeps between reads; wait for a few
        time.sleep(0.001)
    counters._stop.set()  # stop reading, so that every read is in this window
    counters._thread.join()
    reads = list(fake.reads)
    window = counters.window()
    assert window["gpu_util_pct"] == sum(g for g, _ in reads) / len(reads)
    assert window["mem_util_pct"] == sum(m for _, m in reads) / len(reads)
    assert {k: window[k] for k in GPM_VALUES} == GPM_VALUES and window["dram_active_pct"] is None
    second = counters.window()  # no read since: one read now, and GPM from the end of the first window
    assert (second["gpu_util_pct"], second["mem_util_pct"]) == tuple(map(float, fake.reads[-1]))
    gpm_calls = [c for c in fake.calls if c[0] == "metrics"]
    assert gpm_calls[1][1] == gpm_calls[0][2]  # the first window's closing sample opens the second
    counters.close()
    assert fake.calls[-3:] == ["free", "free", "shutdown"]
    assert "every 0.001 s" in counters.describe() and "GPM per record" in counters.describe()


def test_before_hopper_the_gpm_columns_are_null_and_the_header_says_why():
    fake = FakeNvml([(60, 20)], gpm=False)
    counters = NvmlCounters(fake, 0, interval_s=60)
    window = counters.window()
    counters.close()
    assert window == {"gpu_util_pct": 60.0, "mem_util_pct": 20.0, **dict.fromkeys(GPM_METRICS)}
    assert "GPM needs a Hopper or newer GPU" in counters.describe() and "not on PyPI" in counters.describe()


def test_without_a_gpu_or_the_package_the_counters_say_why(monkeypatch):
    assert "cpu run: NVML samples NVIDIA GPUs only" in open_gpu_counters(torch.device("cpu")).describe()
    assert "log.nvml is false" in open_gpu_counters(torch.device("cuda"), enabled=False).describe()
    monkeypatch.setitem(sys.modules, "pynvml", None)
    missing = open_gpu_counters(torch.device("cuda"))
    assert isinstance(missing, NoGpuCounters) and "pip install 'dlx[nvml]'" in missing.describe()
    assert missing.window() == {}


def test_open_gpu_counters_maps_the_cuda_device_to_its_nvml_index(monkeypatch):
    fake = FakeNvml([(75, 25)])
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    monkeypatch.setattr(dev, "nvml_index", lambda device: 3)  # the device query: CUDA_VISIBLE_DEVICES mapping
    counters = open_gpu_counters(torch.device("cuda", 1))
    try:
        assert isinstance(counters, NvmlCounters) and counters.handle == "gpu3"
    finally:
        counters.close()


def fake_counters(monkeypatch, module) -> FakeNvml:
    """`open_gpu_counters` in `module` returns counters on a fake NVML with constant utilisation (87 %, 43 %)."""
    fake = FakeNvml([(87, 43)])
    monkeypatch.setattr(module, "open_gpu_counters", lambda device, enabled=True: NvmlCounters(fake, 0, 0.001))
    return fake


def test_the_counters_reach_the_records_and_the_console_line(tmp_path, monkeypatch, capsys):
    from dlx.train.loop.trainer import pretrain
    from dlx.train.observers import build as observe
    from dlx.train.recipe import load_recipe
    from train_helpers import TINY

    fake = fake_counters(monkeypatch, observe)
    result = pretrain(load_recipe(None, [*TINY, "--train.max_steps", "3"]), "t", tmp_path / "run")
    out = capsys.readouterr().out
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    for record in records:
        assert (record["gpu_util_pct"], record["mem_util_pct"]) == (87.0, 43.0)
        assert record["tensor_active_pct"] == 31.5 and record["dram_active_pct"] is None
    assert "gpu 87% · mem 43% · tensor 32% · dram n/a | mem" in out  # beside the phases, data wait among them
    assert "GPU utilisation: NVML utilization.gpu and .memory every 0.001 s" in out
    assert len(result.records) == 3 and fake.calls[-1] == "shutdown"  # closed with the run


def test_dlx_bench_measures_the_counters_over_the_timed_steps(monkeypatch):
    from dlx.bench import measure
    from dlx.bench.points import BenchPoint, BenchSetup

    fake = fake_counters(monkeypatch, measure)
    record = measure.measure_point(
        BenchSetup("debug", torch.device("cpu"), steps=2, warmup=1), BenchPoint(16, 1, 1, "fp32")
    )
    assert (record["gpu_util_pct"], record["tensor_active_pct"], record["dram_active_pct"]) == (87.0, 31.5, None)
    assert fake.calls[0] == "init" and fake.calls[-1] == "shutdown"


def test_format_columns_shows_only_what_the_record_has():
    assert gpu_monitor.format_columns({"step": 1}) == ""
    assert gpu_monitor.format_columns({"gpu_util_pct": 99.6, "mem_util_pct": None}) == "gpu 100% · mem n/a"


def test_a_refused_read_leaves_the_window_null_and_the_run_going():
    fake = FakeNvml([(50, 10)])
    counters = NvmlCounters(fake, 0, interval_s=60)

    def refuse(handle):
        raise fake.NVMLError("GPU is lost")

    fake.nvmlDeviceGetUtilizationRates = refuse
    assert counters.window() == dict.fromkeys(gpu_monitor.RECORD_KEYS)
    counters.close()
