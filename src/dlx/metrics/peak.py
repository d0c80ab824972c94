"""Peak dense matmul throughput by device and dtype: the ceiling MFU divides by, so MFU above 100 % is a bug.

GPU figures are the vendors' dense (no sparsity) tensor-core numbers for bf16/fp16 with fp32 accumulation (what
PyTorch uses), and the plain FP32 (non-tensor-core) numbers for fp32, since PyTorch computes fp32 matmuls in fp32
unless TF32 is allowed (then the tf32 entry is used). Datasheets print the sparse figure first; dense is half of it.
A device name matches an entry by whole model name and variant ("L40S" is not "L40" nor "L4"; "H100 NVL" is not
the SXM part); an unknown GPU or variant gets no peak, and MFU is then omitted with the reason, never guessed.

On a CPU the peak is the hardware's theoretical one, cores × clock × FLOPs per cycle (`dlx.metrics.cpu_peak`);
`dlx.metrics.meter.peak_for` picks the one for a device.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Peak:
    tflops: float | None
    """Peak TFLOPS for the device and dtype, or None when unknown."""
    source: str
    """Where the figure comes from (datasheet entry, the CPU formula filled in), or why there is none."""
    attainable_tflops: float | None = None
    """CPU: the best large matmul torch ran in the dtype at start-up (what this machine reached then); else None."""


@dataclass(frozen=True)
class GpuSpec:
    name: str
    """What `dlx plan --gpu` takes and the header prints: model, then variant where the model has several."""
    tflops: dict[str, float]
    """Dense TFLOPS per dtype key: bf16, fp16, tf32 (tensor cores) and fp32 (plain)."""
    source: str
    """The vendor document the figures come from."""

    @property
    def model(self) -> str:
        return self.name.split()[0].upper()

    @property
    def variant(self) -> str:
        """PCIE, NVL, or "" for the default part of the model (SXM where there are several)."""
        parts = self.name.upper().split()
        return parts[1] if len(parts) > 1 and parts[1] != "SXM" else ""


_H100 = "NVIDIA H100 Tensor Core GPU datasheet"
_H200 = "NVIDIA H200 Tensor Core GPU datasheet"
_AMPERE = "NVIDIA Ampere GA102 GPU architecture whitepaper, appendix A"
GPUS: tuple[GpuSpec, ...] = (
    GpuSpec("H100 SXM", {"bf16": 989.4, "fp16": 989.4, "tf32": 494.7, "fp32": 66.9}, f"{_H100}, SXM5"),
    GpuSpec("H100 PCIe", {"bf16": 756.0, "fp16": 756.0, "tf32": 378.0, "fp32": 51.2}, f"{_H100}, PCIe"),
    GpuSpec("H100 NVL", {"bf16": 835.5, "fp16": 835.5, "tf32": 417.5, "fp32": 60.0}, f"{_H100}, NVL (per GPU)"),
    GpuSpec("H200 SXM", {"bf16": 989.4, "fp16": 989.4, "tf32": 494.7, "fp32": 66.9}, f"{_H200}, SXM"),
    GpuSpec("H200 NVL", {"bf16": 835.5, "fp16": 835.5, "tf32": 417.5, "fp32": 60.0}, f"{_H200}, NVL"),
    GpuSpec(
        "H20",
        {"bf16": 148.0, "fp16": 148.0, "tf32": 74.0, "fp32": 44.0},
        "NVIDIA HGX H20 specification as published by server vendors (dense)",
    ),
    GpuSpec(
        "B200",
        {"bf16": 2250.0, "fp16": 2250.0, "tf32": 1100.0, "fp32": 80.0},
        "NVIDIA DGX B200 datasheet, per GPU (8 GPUs: 72 PFLOPS FP8 sparse)",
    ),
    GpuSpec(
        "A100 SXM", {"bf16": 312.0, "fp16": 312.0, "tf32": 156.0, "fp32": 19.5}, "NVIDIA A100 Tensor Core GPU datasheet"
    ),
    GpuSpec(
        "A100 PCIe",
        {"bf16": 312.0, "fp16": 312.0, "tf32": 156.0, "fp32": 19.5},
        "NVIDIA A100 Tensor Core GPU datasheet",
    ),
    GpuSpec("A10", {"bf16": 125.0, "fp16": 125.0, "tf32": 62.5, "fp32": 31.2}, "NVIDIA A10 Tensor Core GPU datasheet"),
    GpuSpec("L4", {"bf16": 121.0, "fp16": 121.0, "tf32": 60.0, "fp32": 30.3}, "NVIDIA L4 Tensor Core GPU datasheet"),
    GpuSpec("L40", {"bf16": 181.05, "fp16": 181.05, "tf32": 90.5, "fp32": 90.5}, "NVIDIA L40 GPU datasheet"),
    GpuSpec("L40S", {"bf16": 362.05, "fp16": 362.05, "tf32": 183.0, "fp32": 91.6}, "NVIDIA L40S GPU datasheet"),
    GpuSpec("A6000", {"bf16": 154.8, "fp16": 154.8, "tf32": 77.4, "fp32": 38.7}, f"{_AMPERE} (RTX A6000)"),
    GpuSpec("3090", {"bf16": 71.0, "fp16": 71.0, "tf32": 35.6, "fp32": 35.6}, f"{_AMPERE} (GeForce RTX 3090)"),
    GpuSpec(
        "4090",
        {"bf16": 165.2, "fp16": 165.2, "tf32": 82.6, "fp32": 82.6},
        "NVIDIA Ada Lovelace GPU architecture whitepaper, appendix A (GeForce RTX 4090, FP32 accumulate)",
    ),
    GpuSpec("V100 SXM", {"fp16": 125.0, "fp32": 15.7}, "NVIDIA Tesla V100 datasheet, SXM2"),
    GpuSpec("V100 PCIe", {"fp16": 112.0, "fp32": 14.0}, "NVIDIA Tesla V100 datasheet, PCIe"),
    GpuSpec(
        "MI300X",
        {"bf16": 1307.4, "fp16": 1307.4, "tf32": 653.7, "fp32": 163.4},
        "AMD Instinct MI300X accelerator data sheet",
    ),
)
"""Dense TFLOPS. GeForce cards accumulate fp16/bf16 in fp32 at half their fp16-accumulate rate: that half is listed."""

_VARIANTS = {"PCIE": "PCIE", "NVL": "NVL", "SXM": "", "SXM2": "", "SXM4": "", "SXM5": ""}
"""Tokens of a device name that tell parts of one model apart; SXM is the default part."""
_NOISE = re.compile(r"^(NVIDIA|GEFORCE|RTX|TESLA|AMD|INSTINCT|VF|\d+GB|HBM\d*E?)$")
"""Tokens that name no part (vendor, brand, memory size, a virtual function). Any other token (Ti, D, Laptop,
Super, Max-Q) marks another part than the table's, which then gets no peak rather than a wrong one."""


def find_gpu(name: str) -> GpuSpec | None:
    """The entry whose model and variant are those of `name` (torch.cuda.get_device_name() or what a user types),
    or None. Tokens are compared whole, so L40S is not L40 and "H100 NVL" is not the SXM part."""
    tokens = [t for t in re.split(r"[\s\-_/]+", name.upper()) if t and not _NOISE.match(t)]
    models = [t for t in tokens if t in {spec.model for spec in GPUS}]
    variants = {_VARIANTS[t] for t in tokens if t in _VARIANTS} - {""}
    if len(models) != 1 or len(variants) > 1 or any(t not in _VARIANTS and t not in models for t in tokens):
        return None
    variant = variants.pop() if variants else ""
    return next((spec for spec in GPUS if spec.model == models[0] and spec.variant == variant), None)


def gpu_peak(device_name: str, precision: str, tf32_allowed: bool = False) -> Peak:
    key = "tf32" if precision == "fp32" and tf32_allowed else precision
    spec = find_gpu(device_name)
    if spec is None:
        return Peak(None, f"'{device_name}' is not in dlx's peak table (dlx.metrics.peak.GPUS); MFU omitted")
    if key not in spec.tflops:
        return Peak(None, f"{spec.name} has no {key} tensor cores in the peak table; MFU omitted")
    return Peak(spec.tflops[key], f"datasheet {spec.name} {key} dense ({spec.source})")


def mfu(achieved_tflops: float, peak: Peak) -> float | None:
    """Model FLOPs utilisation in [0, 1], or None without a peak. Above 1 is reported, never clipped: the peak is a
    ceiling, so above 1 means the peak entry or the FLOPs count is wrong, and `mfu_warning` says so."""
    if peak.tflops is None or peak.tflops <= 0:
        return None
    return max(achieved_tflops, 0.0) / peak.tflops


def mfu_warning(value: float | None) -> str | None:
    if value is not None and value > 1.0:
        return (
            f"MFU {value:.0%} exceeds 100%, which the peak (a ceiling) rules out: the peak entry or the FLOPs count is "
            "wrong for this device; please report it with the header's peak line"
        )
    return None
