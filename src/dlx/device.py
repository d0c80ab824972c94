"""Everything that differs between CUDA and CPU lives here, so the rest of dlx never calls `torch.cuda` directly.

`torch.cuda.synchronize`, events, `set_device`, `reset_peak_memory_stats` and `pin_memory()` raise without CUDA; the
functions below do the right thing on either.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import platform
from collections.abc import Iterator

import psutil
import torch

from dlx.errors import UserError

PRECISION_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def resolve_device(name: str = "auto", local_rank: int | None = None) -> torch.device:
    """'auto' is CUDA when available (the local rank's GPU under torchrun), else CPU."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(name)
    if device.type == "cuda":
        index = local_rank if local_rank is not None else int(os.environ.get("LOCAL_RANK", 0))
        device = torch.device("cuda", index if device.index is None else device.index)
        torch.cuda.set_device(device)
    return device


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"CPU ({psutil.cpu_count(logical=True)} threads, torch uses {torch.get_num_threads()})"


ALLOC_CONF_VARIABLES = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")
EXPANDABLE_SEGMENTS = "expandable_segments:True"


def prefer_expandable_segments() -> str:
    """Let the CUDA caching allocator grow segments in place (`expandable_segments:True`), which avoids the
    fragmentation that makes a sweep's later, larger shapes run out early; a value the user set wins. Takes effect
    only before the first CUDA allocation. Returns the setting in force, as `NAME=value`."""
    for name in ALLOC_CONF_VARIABLES:
        if os.environ.get(name):
            return f"{name}={os.environ[name]}"
    os.environ[ALLOC_CONF_VARIABLES[0]] = EXPANDABLE_SEGMENTS
    return f"{ALLOC_CONF_VARIABLES[0]}={EXPANDABLE_SEGMENTS}"


CPU_HEAP_VARIABLES = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_")
CPU_HEAP_PRELOADS = ("jemalloc", "tcmalloc", "mimalloc")
M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_THRESHOLD = -1, -2, -3
CPU_HEAP = {M_MMAP_THRESHOLD: 32 << 20, M_TRIM_THRESHOLD: 1 << 30, M_TOP_PAD: 64 << 20}
"""glibc malloc for a training step (`mallopt`): blocks under 32 MB (glibc's largest mmap threshold) come from the
heap, freed memory is kept up to 1 GB, the heap grows 64 MB at a time."""


def prefer_cpu_heap() -> str:
    """Keep a CPU step's freed tensors in glibc's heap instead of returning them to the kernel. glibc's default
    starts by mmapping every block over 128 KB and raises that threshold only as blocks are freed, so a fresh
    process's first steps page-fault and zero every activation anew and run up to 1.9× slower than the same step
    later (BENCHMARKS.md, Tune, the 144-layout round); `dlx tune`'s measurements would then depend on their order.
    A choice the user made wins (`GLIBC_TUNABLES` with glibc.malloc, `MALLOC_*_` variables, a preloaded jemalloc,
    tcmalloc or mimalloc); not glibc: nothing to do. Returns the setting in force, in words."""
    tunables = os.environ.get("GLIBC_TUNABLES", "")
    chosen = [f"{name}={os.environ[name]}" for name in CPU_HEAP_VARIABLES if os.environ.get(name)]
    if "glibc.malloc" in tunables:
        chosen.append(f"GLIBC_TUNABLES={tunables}")
    preload = os.environ.get("LD_PRELOAD", "")
    if any(name in preload for name in CPU_HEAP_PRELOADS):
        chosen.append(f"LD_PRELOAD={preload}")
    if chosen:
        return "the user's: " + " ".join(chosen)
    if (libc := glibc()) is None:
        return "the C library's default (not glibc)"
    if not all(libc.mallopt(option, value) == 1 for option, value in CPU_HEAP.items()):
        return "glibc's default (mallopt refused)"
    return "glibc malloc: mmap threshold 32 MB, trim threshold 1 GB, top pad 64 MB"


def glibc() -> ctypes.CDLL | None:
    """The C library, where it is glibc (whose malloc `prefer_cpu_heap` and `trim_cpu_heap` tune)."""
    if platform.libc_ver()[0] != "glibc" or (library := ctypes.util.find_library("c")) is None:
        return None
    return ctypes.CDLL(library)


def trim_cpu_heap() -> bool:
    """Hand the heap's free pages back to the kernel (glibc `malloc_trim(0)`), after collecting dropped objects: a
    measurement that starts here counts its own tensors in its resident-set peak, not the up to 1 GB of freed memory
    the heap setting (`prefer_cpu_heap`) kept from the one before. Its first step page-faults again: call it before
    a warm-up, never inside a timed window. False where the C library is not glibc."""
    import gc

    gc.collect()
    if (libc := glibc()) is None:
        return False
    libc.malloc_trim(0)
    return True


def training_device(name: str, local_rank: int, world_size: int, key: str) -> torch.device:
    """The device a training process (`dlx pretrain`, `dlx bench`, `dlx tune`) computes on, set up before its first
    allocation: expandable segments on CUDA, the heap setting on a CPU (`prefer_cpu_heap`; unless the user chose
    either), then `resolve_device`. Under torchrun an explicit
    `cuda:N` is refused in one line (`key` names the setting): it would put every rank on GPU N, where NCCL fails."""
    if world_size > 1 and name.startswith("cuda:"):
        raise UserError(
            f"{key} {name} under torchrun would put all {world_size} ranks on one GPU; set {key} cuda (or auto): "
            "each rank takes the GPU of its LOCAL_RANK"
        )
    prefer_expandable_segments()
    device = resolve_device(name, local_rank)
    if device.type == "cpu":
        prefer_cpu_heap()
    return device


def synchronize(device: torch.device) -> None:
    """Wait for queued kernels; a no-op on CPU, where every op has finished when it returns."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def reset_peak_memory(device: torch.device) -> None:
    """CUDA: the allocator's peak. CPU (Linux): the process's peak RSS, back to the current RSS (`clear_refs` 5)."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return
    # Not Linux, or /proc not writable: the peak stays the process's lifetime peak.
    with contextlib.suppress(OSError), open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def cuda_rng_states() -> list[torch.Tensor]:
    """The CUDA generators' states, one per visible GPU; none when CUDA was never initialised in this process."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        return torch.cuda.get_rng_state_all()
    return []


def restore_cuda_rng_states(states: list[torch.Tensor]) -> str | None:
    """Restore the saved CUDA generator states that fit: one per visible GPU, in order. Returns a one-line note when
    the saving process saw a different number of GPUs (None when every state was restored)."""
    visible = torch.cuda.device_count() if torch.cuda.is_available() else 0
    for index, state in enumerate(states[:visible]):
        torch.cuda.set_rng_state(state, index)
    if len(states) == visible or not states:
        return None
    restored = min(len(states), visible)
    return (
        f"the checkpoint holds the random generator states of {len(states)} GPU(s) and {visible} are visible here: "
        f"restored {restored}; any other GPU keeps its state seeded from train.seed"
    )


def peak_memory_gb(device: torch.device) -> float:
    """CUDA: the allocator's peak since the last reset. CPU: the process's peak resident set size (ru_maxrss)."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 1e9
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9  # Linux reports KiB


def memory_in_use_gb(device: torch.device) -> float:
    """What the process holds now: CUDA's allocated tensors; on a CPU the resident set (psutil)."""
    if device.type == "cuda":
        return torch.cuda.memory_allocated(device) / 1e9
    return psutil.Process().memory_info().rss / 1e9


def peak_memory_method(device: torch.device) -> str:
    """How `peak_memory_gb` measures, in words, for headers and reports."""
    if device.type == "cuda":
        return "CUDA caching-allocator peak (torch.cuda.max_memory_allocated), tensors only, since the last reset"
    return (
        "process peak resident set size (ru_maxrss, since the last reset on Linux): weights, activations, Python and "
        "torch runtime together"
    )


def nvml_index(device: torch.device) -> int:
    """The NVML index of a CUDA device: NVML counts every GPU of the machine, CUDA only those in CUDA_VISIBLE_DEVICES
    (by index or UUID), renumbered from 0."""
    if device.type != "cuda":
        raise ValueError(f"NVML samples CUDA devices, not {device}")
    return torch.cuda._get_nvml_device_index(device)  # the mapping torch.cuda.utilization uses


def timing_event(device: torch.device) -> torch.cuda.Event:
    """A CUDA event that records a timestamp on the current stream when `.record()` is called (CUDA only)."""
    if device.type != "cuda":
        raise ValueError(f"timing events need a CUDA device, not {device}")
    return torch.cuda.Event(enable_timing=True)


def event_elapsed_s(start: torch.cuda.Event, end: torch.cuda.Event) -> float:
    """Seconds between two recorded events; both must have completed (synchronize first)."""
    return start.elapsed_time(end) / 1e3  # elapsed_time is in milliseconds


def autocast(device: torch.device, precision: str) -> contextlib.AbstractContextManager:
    """Mixed precision for forward: weights stay fp32, matmuls run in bf16/fp16. fp32 needs no context."""
    if precision == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=PRECISION_DTYPES[precision])


def compute_capability_major(device: torch.device) -> int:
    """The CUDA device's compute capability, major number (8: Ampere, 9: Hopper); CUDA only."""
    return torch.cuda.get_device_properties(device).major


def supports_native_bf16(device: torch.device) -> bool:
    """Whether bf16 is the faster precision that still trains: CUDA with bf16, or a CPU with AVX512-BF16/AMX."""
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    flags = _cpu_flags()
    return bool(flags & {"avx512_bf16", "amx_bf16"})


def float8_capability(device: torch.device) -> str | None:
    """None where float8 matmuls run, else why not, in words. CUDA: compute capability 8.9 or later (Ada, Hopper,
    Blackwell). Any other device: whether `torch._scaled_mm`, the matmul torchao's float8 layers call, runs a 16×16
    float8 product there (torch ≥ 2.11 has a CPU kernel: correct, not faster than bf16)."""
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        if (major, minor) < (8, 9):
            name = torch.cuda.get_device_name(device)
            return f"{name} is compute capability {major}.{minor}; float8 needs 8.9 or later"
        return None
    ones = torch.ones(16, 16, dtype=torch.float8_e4m3fn, device=device)
    scale = torch.ones((), device=device)
    try:
        torch._scaled_mm(ones, ones.t(), scale_a=scale, scale_b=scale, out_dtype=torch.bfloat16)
    except (RuntimeError, NotImplementedError) as e:
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        return f"{device.type} has no float8 matmuls in torch {torch.__version__} (torch._scaled_mm: {reason})"
    return None


def _cpu_flags() -> set[str]:
    info = cpu_info()
    return set((info.get("flags") or info.get("Features") or "").split())


def cpu_info() -> dict[str, str]:
    """The first processor's block of /proc/cpuinfo (`model name`, `flags`, `cpu MHz`, ...); empty without one."""
    info: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if not line.strip():
                    if "flags" in info or "Features" in info:
                        break
                    continue
                key, _, value = line.partition(":")
                info.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    return info


STAGING_BUFFERS = 2


class HostToDevice:
    """Host batches (in a buffer the caller reuses) → tensors of their own on the device.

    CPU: one copy into a fresh tensor. CUDA: through a ring of pinned staging buffers and a non-blocking copy on the
    current stream, so that the transfer overlaps the GPU's work; an event per staging buffer keeps it from being
    refilled while its copy is in flight. Other devices: `.to(device)`.
    """

    def __init__(self, device: torch.device, shape: tuple[int, ...]):
        self.device = device
        self._staging: list[torch.Tensor] = []
        if device.type == "cuda":
            self._staging = [torch.empty(shape, dtype=torch.int64, pin_memory=True) for _ in range(STAGING_BUFFERS)]
        self._copied: list[torch.cuda.Event | None] = [None] * len(self._staging)
        self._next = 0

    def __call__(self, host: torch.Tensor) -> torch.Tensor:
        if self.device.type == "cpu":
            return host.clone()
        if not self._staging:
            return host.to(self.device)
        i, self._next = self._next, (self._next + 1) % STAGING_BUFFERS
        if self._copied[i] is not None:
            self._copied[i].synchronize()
        self._staging[i].copy_(host)
        batch = self._staging[i].to(self.device, non_blocking=True)
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(self.device))
        self._copied[i] = event
        return batch


def memory_budget_gb(device: torch.device) -> float:
    """What a run may use: the GPU's total memory on CUDA; on a CPU the memory available now (psutil)."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory / 1e9
    return psutil.virtual_memory().available / 1e9


def available_memory_gb() -> float:
    """Host memory available now without swapping (psutil)."""
    return psutil.virtual_memory().available / 1e9


def free_gpu_memory_gb(device: torch.device) -> float:
    """The GPU's free memory now, as the driver sees it (other processes' allocations included)."""
    return torch.cuda.mem_get_info(device)[0] / 1e9


def is_out_of_memory(error: BaseException) -> bool:
    """Whether `error` is the device running out of memory (torch.OutOfMemoryError, raised by the CUDA allocator)."""
    return isinstance(error, torch.OutOfMemoryError)


def release_memory(device: torch.device) -> None:
    """After an out-of-memory error: collect the dropped tensors and hand the cached blocks back to the device."""
    import gc

    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


SDPA_BACKENDS = {
    "cudnn": "CUDNN_ATTENTION",
    "flash": "FLASH_ATTENTION",
    "efficient": "EFFICIENT_ATTENTION",
    "math": "MATH",
}
"""dlx's names for SDPA's kernels → torch.nn.attention.SDPBackend members."""


@contextlib.contextmanager
def prefer_sdpa_kernel(kernel: str | None, fallback: bool = True) -> Iterator[None]:
    """While inside: SDPA runs `kernel` (cudnn, flash, efficient or math) wherever it takes the call; math takes
    the calls it refuses (a generation step's mask, say) unless `fallback` is off. None, or flex (not SDPA): SDPA's
    own choice, nothing changed.

    `torch.nn.attention.sdpa_kernel` sets the process-wide flags torch.backends.cuda.enable_*_sdp read on every SDPA
    call, eager or while torch.compile traces (which is where a compiled model's kernel is fixed), and with
    set_priority puts `kernel` before math (PyTorch's own order puts math before cuDNN; a CPU looks at the flags
    only: flash, then math). torch 2.13's compile caches do not key on these flags, so the kernel joins
    torch.compiler.config.cache_key_tag: a graph cached under another kernel is not reused. Entered outside any
    compiled region: inside one, that config patch is a graph break (Dynamo does not trace it; sdpa_kernel with
    set_priority itself traces since pytorch#160684). tests/integration/test_compile.py pins both."""
    if kernel not in SDPA_BACKENDS:
        yield
        return
    from torch.nn.attention import SDPBackend, sdpa_kernel

    names = dict.fromkeys([kernel, "math"] if fallback else [kernel])
    tag = f"{torch.compiler.config.cache_key_tag}|sdpa={kernel}"
    backends = [getattr(SDPBackend, SDPA_BACKENDS[name]) for name in names]
    with sdpa_kernel(backends, set_priority=True), torch.compiler.config.patch(cache_key_tag=tag):
        yield
