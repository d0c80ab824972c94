"""The peak MFU divides by: GPU entries matched by whole model name, and a CPU's theoretical peak from its cpuinfo."""

from __future__ import annotations

import pytest
import torch

from dlx.metrics import cpu_peak
from dlx.metrics.cpu_peak import theoretical_peak, vector_units
from dlx.metrics.meter import peak_for
from dlx.metrics.peak import GPUS, find_gpu, gpu_peak, mfu_warning

# What torch.cuda.get_device_name() returns on each card (NVIDIA's driver names; ROCm's marketing names).
DEVICE_NAMES = {
    "NVIDIA H100 80GB HBM3": "H100 SXM",
    "NVIDIA H100 PCIe": "H100 PCIe",
    "NVIDIA H100 NVL": "H100 NVL",
    "NVIDIA H200": "H200 SXM",
    "NVIDIA H200 NVL": "H200 NVL",
    "NVIDIA H20": "H20",
    "NVIDIA B200": "B200",
    "NVIDIA A100-SXM4-80GB": "A100 SXM",
    "NVIDIA A100-SXM4-40GB": "A100 SXM",
    "NVIDIA A100-PCIE-40GB": "A100 PCIe",
    "NVIDIA A100 80GB PCIe": "A100 PCIe",
    "NVIDIA A10": "A10",
    "NVIDIA L4": "L4",
    "NVIDIA L40": "L40",
    "NVIDIA L40S": "L40S",
    "NVIDIA RTX A6000": "A6000",
    "NVIDIA GeForce RTX 3090": "3090",
    "NVIDIA GeForce RTX 4090": "4090",
    "Tesla V100-SXM2-16GB": "V100 SXM",
    "Tesla V100-SXM2-32GB": "V100 SXM",
    "Tesla V100-PCIE-32GB": "V100 PCIe",
    "AMD Instinct MI300X": "MI300X",
    "AMD Instinct MI300X VF": "MI300X",
}
# Other parts whose names contain a table entry's: each must get no peak rather than the wrong one.
OTHER_PARTS = [
    "NVIDIA A10G",
    "NVIDIA GeForce RTX 3090 Ti",
    "NVIDIA GeForce RTX 4090 Laptop GPU",
    "NVIDIA GeForce RTX 4090 D",
    "NVIDIA RTX 6000 Ada Generation",
    "NVIDIA GH200 480GB",
    "Tesla V100S-PCIE-32GB",
    "Tesla T4",
    "NVIDIA L40S-PCIE NVL",
]


@pytest.mark.parametrize(("device_name", "entry"), DEVICE_NAMES.items())
def test_each_real_device_name_finds_its_own_entry(device_name, entry) -> None:
    spec = find_gpu(device_name)
    assert spec is not None and spec.name == entry


@pytest.mark.parametrize("device_name", OTHER_PARTS)
def test_other_parts_get_no_peak(device_name) -> None:
    assert find_gpu(device_name) is None
    peak = gpu_peak(device_name, "bf16")
    assert peak.tflops is None and "not in dlx's peak table" in peak.source


def test_peak_for_a_cuda_device_reads_its_name(monkeypatch) -> None:
    """Through the device module, as a run on a GPU does (the name query is the only CUDA call)."""
    from dlx import device

    monkeypatch.setattr(device, "device_name", lambda d: "NVIDIA L40S")
    assert peak_for(torch.device("cuda", 0), "bf16").tflops == 362.05
    assert peak_for(torch.device("cuda", 0), "fp32").tflops == 91.6  # plain fp32 unless TF32 is allowed
    before = torch.backends.cuda.matmul.allow_tf32
    try:
        torch.backends.cuda.matmul.allow_tf32 = True
        assert peak_for(torch.device("cuda", 0), "fp32").tflops == 183.0
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before


def test_substrings_no_longer_match_and_variants_differ() -> None:
    """The old substring table gave an L40S the L4's 121 TFLOPS (MFU ~3x too high) and an H100 NVL the SXM figure."""
    assert gpu_peak("NVIDIA L40S", "bf16").tflops == 362.05
    assert gpu_peak("NVIDIA L40", "bf16").tflops == 181.05
    assert gpu_peak("NVIDIA L4", "bf16").tflops == 121.0
    assert gpu_peak("NVIDIA H100 NVL", "bf16").tflops == 835.5
    assert gpu_peak("NVIDIA H100 80GB HBM3", "bf16").tflops == 989.4


def test_what_users_type_for_dlx_plan() -> None:
    for typed, entry in {"H100": "H100 SXM", "h100 pcie": "H100 PCIe", "RTX 4090": "4090", "mi300x": "MI300X"}.items():
        assert find_gpu(typed).name == entry  # type: ignore[union-attr]
    assert [find_gpu(spec.name) for spec in GPUS] == list(GPUS)  # every entry's own name finds it


def test_dtype_keys_tf32_and_missing_tensor_cores() -> None:
    assert gpu_peak("NVIDIA A100-SXM4-80GB", "fp32").tflops == 19.5
    assert gpu_peak("NVIDIA A100-SXM4-80GB", "fp32", tf32_allowed=True).tflops == 156.0
    peak = gpu_peak("Tesla V100-SXM2-16GB", "bf16")
    assert peak.tflops is None and "no bf16 tensor cores" in peak.source
    assert gpu_peak("NVIDIA L40S", "bf16").source == "datasheet L40S bf16 dense (NVIDIA L40S GPU datasheet)"


def test_every_entry_cites_a_source_and_is_dense() -> None:
    for spec in GPUS:
        assert any(word in spec.source for word in ("datasheet", "data sheet", "whitepaper", "specification"))
        assert spec.tflops["fp32"] < spec.tflops.get("bf16", spec.tflops["fp16"])  # tensor cores beat plain fp32


ZEN4 = {
    "vendor_id": "AuthenticAMD",
    "cpu family": "25",
    "model": "17",
    "model name": "AMD EPYC",
    "flags": "fpu sse2 avx fma avx2 avx512f avx512bw avx512_bf16 avx512_vnni",
}
ZEN3 = {"vendor_id": "AuthenticAMD", "cpu family": "25", "model": "1", "flags": "sse2 avx fma avx2"}
SAPPHIRE_RAPIDS = {
    "vendor_id": "GenuineIntel",
    "cpu family": "6",
    "model": "143",
    "flags": "sse2 avx fma avx2 avx512f avx512_bf16 avx512_fp16 amx_bf16 amx_tile",
}


@pytest.mark.parametrize(
    ("info", "fp32", "bf16"),
    [
        (ZEN4, 32, 64),
        (ZEN3, 32, None),
        (SAPPHIRE_RAPIDS, 64, 1024),
        ({"vendor_id": "GenuineIntel", "flags": "avx fma avx2 avx512f"}, 64, None),  # Cascade Lake
        ({"vendor_id": "GenuineIntel", "flags": "avx fma avx2 avx512f avx512_bf16"}, 64, 128),  # Cooper Lake
        ({"vendor_id": "AuthenticAMD", "cpu family": "26", "flags": "avx2 fma avx512f avx512_bf16"}, 64, 128),
        ({"vendor_id": "AuthenticAMD", "cpu family": "23", "model": "49", "flags": "avx fma avx2"}, 32, None),
        ({"vendor_id": "AuthenticAMD", "cpu family": "23", "model": "1", "flags": "avx fma avx2"}, 16, None),
        ({"vendor_id": "GenuineIntel", "flags": "sse2 avx fma avx2"}, 32, None),  # Haswell .. Alder Lake
        ({"vendor_id": "GenuineIntel", "flags": "sse2 avx"}, 16, None),  # Sandy Bridge
        ({"Features": "fp asimd evtstrm sve bf16"}, 32, 128),  # Neoverse V1
    ],
)
def test_flops_per_cycle_rows(info, fp32, bf16) -> None:
    units = vector_units(info)
    assert units is not None and (units.fp32, units.bf16) == (fp32, bf16)


def test_theoretical_peak_formula_and_datasheet_line() -> None:
    peak = theoretical_peak(ZEN4, (2.6, "cpufreq cpuinfo_max_freq"), 2, "fp32", lambda precision: 0.1)
    assert peak.tflops == pytest.approx(2 * 2.6 * 32 / 1e3, rel=1e-12)  # 0.1664 TFLOPS
    assert peak.attainable_tflops == 0.1
    assert peak.source.startswith("CPU theoretical: 2 cores × 2.60 GHz × 32 fp32 FLOPs/cycle [AMD Zen 4")


def test_a_matmul_faster_than_the_reported_clock_allows_raises_the_clock() -> None:
    """A VM reports its nominal 2.6 GHz while the cores boost: 0.392 TFLOPS of bf16 on 2 Zen 4 cores (64 FLOPs/cycle)
    proves at least 392e9 / (2 · 64) = 3.0625 GHz, so the peak is never below what was attained."""
    peak = theoretical_peak(ZEN4, (2.6, "/proc/cpuinfo cpu MHz"), 2, "bf16", lambda precision: 0.392)
    assert peak.tflops == pytest.approx(0.392, rel=1e-12)
    assert "3.06 GHz" in peak.source and "raised from 2.60 GHz" in peak.source


def test_emulated_bf16_has_the_fp32_ceiling_and_is_not_probed() -> None:
    def probe(precision: str) -> float:
        raise AssertionError("an emulated bf16 matmul takes seconds: it must not be probed")

    peak = theoretical_peak(ZEN3, (3.0, "cpufreq"), 4, "bf16", probe)
    assert peak.tflops == pytest.approx(4 * 3.0 * 32 / 1e3, rel=1e-12) and peak.attainable_tflops is None
    assert "32 fp32 (bf16 emulated) FLOPs/cycle" in peak.source


def test_unknown_cpu_or_clock_gives_no_peak() -> None:
    assert theoretical_peak({}, (3.0, "x"), 2, "fp32", lambda p: 1.0).tflops is None
    peak = theoretical_peak(ZEN4, (None, "no clock reported"), 2, "fp32", lambda p: 1.0)
    assert peak.tflops is None and "no clock reported" in peak.source


def test_this_cpu_has_a_theoretical_peak_above_what_it_attains() -> None:
    """On the machine running the tests: the formula's peak is a ceiling for a large matmul, the best case."""
    peak = peak_for(torch.device("cpu"), "fp32")
    assert peak.tflops is not None and peak.source.startswith("CPU theoretical:"), peak.source
    assert peak.attainable_tflops is not None and 0 < peak.attainable_tflops <= peak.tflops
    assert cpu_peak.compute_cores() <= torch.get_num_threads()


def test_the_peak_follows_torchs_thread_count() -> None:
    """The cores are the threads torch computes with: a cached one-thread peak must not serve a two-thread run."""
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = peak_for(torch.device("cpu"), "fp32")
        assert one.source.startswith("CPU theoretical: 1 core × ")
        torch.set_num_threads(2)
        two = peak_for(torch.device("cpu"), "fp32")
        assert two.source.startswith(f"CPU theoretical: {cpu_peak.compute_cores()} core")
    finally:
        torch.set_num_threads(before)


def test_mfu_above_100_percent_is_called_a_bug() -> None:
    assert mfu_warning(1.0) is None and mfu_warning(None) is None
    assert "exceeds 100%, which the peak (a ceiling) rules out" in mfu_warning(1.2)  # type: ignore[operator]
