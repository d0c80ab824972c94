"""GPU counters per logged record, read through NVML (`nvidia-ml-py`, optional: `pip install 'dlx[nvml]'`).

Record keys, in percent, each the mean over the record's wall-clock window (evaluation inside it included):

    gpu_util_pct       NVML utilization.gpu: share of time one or more kernels ran. Not how busy the SMs were: one
                       small kernel at a time counts as 100 %.
    mem_util_pct       NVML utilization.memory: share of time device memory was read or written (the memory
                       controller busy), what GPU tables often call "memory bandwidth".
    sm_active_pct      NVML GPM SM_UTIL: share of the SMs busy.
    tensor_active_pct  NVML GPM ANY_TENSOR_UTIL: share of time the SMs ran tensor-core instructions ("tensor core").
    fp32_active_pct    NVML GPM FP32_UTIL / FP16_UTIL: non-tensor floating-point math ("fp engine").
    fp16_active_pct
    dram_active_pct    NVML GPM DRAM_BW_UTIL: DRAM bandwidth used, as a share of its peak.

Method. utilization.gpu/.memory are the driver's own averages over its last sample period (1/6 s to 1 s): a
background thread reads them every SAMPLE_INTERVAL_S and sleeps in between (`Event.wait`, never a busy loop; a read
is one ctypes call that releases the GIL), and `window()` returns the mean of the reads since its previous call. GPM
(GPU Performance Monitoring, Hopper and newer) counts between two samples; one is taken at each `window()` call, so
those columns cover exactly the window. DCGM's profiling fields (DCGM_FI_PROF_PIPE_TENSOR_ACTIVE,
DCGM_FI_PROF_DRAM_ACTIVE) measure the same activities on older GPUs too, but their Python bindings ship with DCGM
itself, not on PyPI: dlx does not read them, so before Hopper the GPM columns are null and the header says why.

On a CPU run, without the package, or with `log.nvml: false` there are no GPU keys in the records; the header,
report and `dlx bench` say n/a and why.
"""

from __future__ import annotations

import threading
from typing import Any

import torch

from dlx import device as dev

SAMPLE_INTERVAL_S = 0.2
"""Seconds between two utilisation reads of the background thread."""
UTILIZATION_KEYS = ("gpu_util_pct", "mem_util_pct")
GPM_METRICS = {
    "sm_active_pct": "NVML_GPM_METRIC_SM_UTIL",
    "tensor_active_pct": "NVML_GPM_METRIC_ANY_TENSOR_UTIL",
    "fp32_active_pct": "NVML_GPM_METRIC_FP32_UTIL",
    "fp16_active_pct": "NVML_GPM_METRIC_FP16_UTIL",
    "dram_active_pct": "NVML_GPM_METRIC_DRAM_BW_UTIL",
}
"""Record key -> pynvml's GPM metric constant."""
RECORD_KEYS = (*UTILIZATION_KEYS, *GPM_METRICS)
NO_DCGM = "DCGM's profiling fields need DCGM's own Python bindings (not on PyPI), which dlx does not use"


class NoGpuCounters:
    """What a run has when NVML cannot sample: no record keys, and the reason."""

    def __init__(self, reason: str) -> None:
        self.reason = reason

    def window(self) -> dict[str, float | None]:
        return {}

    def describe(self) -> str:
        return f"GPU utilisation, tensor/DRAM activity: n/a ({self.reason})"

    def close(self) -> None:
        pass


class NvmlCounters:
    """Utilisation sampled in a sleeping thread, GPM activity between `window()` calls; `close` stops both."""

    def __init__(self, nvml: Any, index: int, interval_s: float = SAMPLE_INTERVAL_S) -> None:
        self.nvml = nvml
        self.interval_s = interval_s
        nvml.nvmlInit()
        try:
            self.handle = nvml.nvmlDeviceGetHandleByIndex(index)
        except nvml.NVMLError:
            nvml.nvmlShutdown()
            raise
        self.gpm, self.gpm_reason = _open_gpm(nvml, self.handle)
        self._lock = threading.Lock()
        self._sums = [0.0, 0.0]
        self._reads = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, name="dlx-nvml", daemon=True)
        self._thread.start()

    def window(self) -> dict[str, float | None]:
        """Mean utilisation since the previous call (one read now if the thread made none) and GPM activity; null
        where the driver refused a read (the run goes on)."""
        with self._lock:
            sums, reads = self._sums, self._reads
            self._sums, self._reads = [0.0, 0.0], 0
        values: dict[str, float | None] = dict.fromkeys(RECORD_KEYS)
        try:
            if reads == 0:
                sums, reads = self._read(), 1
            values.update({key: total / reads for key, total in zip(UTILIZATION_KEYS, sums, strict=True)})
            if self.gpm:
                values.update(self.gpm.window())
        except self.nvml.NVMLError:
            pass
        return values

    def describe(self) -> str:
        gpm = "tensor/DRAM/FP activity from NVML GPM per record" if self.gpm else f"GPM n/a ({self.gpm_reason})"
        return f"GPU utilisation: NVML utilization.gpu and .memory every {self.interval_s:g} s, mean per record; {gpm}"

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        if self.gpm:
            self.gpm.close()
        self.nvml.nvmlShutdown()

    def _read(self) -> list[float]:
        rates = self.nvml.nvmlDeviceGetUtilizationRates(self.handle)
        return [float(rates.gpu), float(rates.memory)]

    def _sample(self) -> None:
        while not self._stop.wait(self.interval_s):  # sleeps; wakes early only to stop
            try:
                gpu, memory = self._read()
            except self.nvml.NVMLError:
                continue  # a read the driver refused (e.g. during a GPU reset): the window has one read fewer
            with self._lock:
                self._sums[0] += gpu
                self._sums[1] += memory
                self._reads += 1


class GpmCounters:
    """NVML GPU Performance Monitoring: activity counted between two samples, the later one starting the next."""

    def __init__(self, nvml: Any, handle: Any) -> None:
        self.nvml, self.handle = nvml, handle
        self.samples = [nvml.nvmlGpmSampleAlloc(), nvml.nvmlGpmSampleAlloc()]
        nvml.nvmlGpmSampleGet(handle, self.samples[0])

    def window(self) -> dict[str, float | None]:
        nvml = self.nvml
        nvml.nvmlGpmSampleGet(self.handle, self.samples[1])
        request = nvml.c_nvmlGpmMetricsGet_t()
        request.version = nvml.NVML_GPM_METRICS_GET_VERSION
        request.numMetrics = len(GPM_METRICS)
        request.sample1, request.sample2 = self.samples
        for slot, constant in enumerate(GPM_METRICS.values()):
            request.metrics[slot].metricId = getattr(nvml, constant)
        nvml.nvmlGpmMetricsGet(request)
        self.samples.reverse()  # the newer sample starts the next window
        return {
            key: float(request.metrics[slot].value) if request.metrics[slot].nvmlReturn == nvml.NVML_SUCCESS else None
            for slot, key in enumerate(GPM_METRICS)
        }

    def close(self) -> None:
        for sample in self.samples:
            self.nvml.nvmlGpmSampleFree(sample)


def _open_gpm(nvml: Any, handle: Any) -> tuple[GpmCounters | None, str]:
    try:
        if not nvml.nvmlGpmQueryDeviceSupport(handle).isSupportedDevice:
            return None, f"NVML GPM needs a Hopper or newer GPU; {NO_DCGM}"
        return GpmCounters(nvml, handle), ""
    except (nvml.NVMLError, AttributeError) as error:  # AttributeError: an nvidia-ml-py without GPM
        return None, f"NVML GPM unavailable ({error}); {NO_DCGM}"


def open_gpu_counters(device: torch.device, enabled: bool = True) -> NvmlCounters | NoGpuCounters:
    """NVML counters for this rank's GPU, or the reason there are none (never an error: the run goes on)."""
    if not enabled:
        return NoGpuCounters("log.nvml is false")
    if device.type != "cuda":
        return NoGpuCounters(f"a {device.type} run: NVML samples NVIDIA GPUs only")
    try:
        import pynvml  # nvidia-ml-py
    except ImportError:
        return NoGpuCounters("nvidia-ml-py is not installed: pip install 'dlx[nvml]'")
    try:
        return NvmlCounters(pynvml, dev.nvml_index(device))
    except (pynvml.NVMLError, RuntimeError) as error:  # RuntimeError: torch could not map the device to NVML
        return NoGpuCounters(f"NVML could not open {device}: {error}")


def format_columns(record: dict[str, Any]) -> str:
    """The console's GPU part, e.g. `gpu 97% · mem 41% · tensor 33% · dram 52%`; "" when the record has none."""
    shown = {"gpu": "gpu_util_pct", "mem": "mem_util_pct", "tensor": "tensor_active_pct", "dram": "dram_active_pct"}
    parts = [f"{label} {_pct(record.get(key))}" for label, key in shown.items() if key in record]
    return " · ".join(parts)


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.0f}%"
