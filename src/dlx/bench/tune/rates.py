"""The rates `dlx tune`'s time model starts from, measured on this machine in about a second: a block-shaped matmul
per precision and micro-batch token count, a large copy, (under torchrun) an all-reduce across the ranks, and one
layer's attention call forward and backward per kernel and micro-batch."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

import torch
import torch.distributed as dist

from dlx import device as dev
from dlx.bench.tune.time_model import Rates
from dlx.model.args import ModelArgs
from dlx.model.attention_kernels import AttentionShape, kernel_timer
from dlx.parallel.distributed import group_active

ASSUMED_LINK_GBPS = {"cuda": 100.0, "cpu": 1.0}
"""Link rate per rank where it cannot be measured (no torchrun): NVLink-class for CUDA, gloo over loopback for CPU."""
MAX_TOKENS = 8192
"""Larger micro-batches are timed at this many tokens (the rate has flattened by then)."""
AUTO_TIMED = ("cudnn", "flash", "efficient")
"""What train.attention `auto` is priced at on CUDA: the fastest of SDPA's fused kernels (flex is left out: timing it
compiles it, tens of seconds; where flex wins the run is faster than priced, and the fit takes that up)."""
ATTENTION_REPEATS = 5
CPU_MATMUL_FLOPS = 2e9
"""On a CPU a timed matmul is cut to about this many FLOPs (a second or less; its rate has flattened by then)."""


def measure_rates(
    args: ModelArgs, device: torch.device, keys: Iterable[tuple[str, int]], link_gbps: float | None
) -> Rates:
    """Matmul TFLOPS for each (precision or float8, tokens) in `keys`, the copy bandwidth, the link rate (measured
    under torchrun; else `link_gbps`, else the assumed one)."""
    timed: dict[tuple[str, int], float] = {}
    matmul: dict[tuple[str, int], float] = {}
    for kind, tokens in sorted(set(keys)):
        capped = timed_tokens(args, device, tokens)
        if (kind, capped) not in timed:
            timed[(kind, capped)] = matmul_tflops(args, device, kind, capped)
        matmul[(kind, tokens)] = timed[(kind, capped)]
    measured_link = all_reduce_gbps(device) if group_active() and dist.get_world_size() > 1 else None
    link = measured_link or link_gbps or ASSUMED_LINK_GBPS.get(device.type, 1.0)
    return Rates(matmul, copy_gbps(device), link, measured_link is not None, device.type)


def timed_tokens(args: ModelArgs, device: torch.device, tokens: int) -> int:
    """The token count a micro-batch's matmul rate is timed at: its own, capped (see MAX_TOKENS, CPU_MATMUL_FLOPS),
    rounded down to a power of two above the cap so that nearby micro-batches share one timing."""
    cap = MAX_TOKENS
    if device.type == "cpu":
        cap = min(cap, max(64, int(CPU_MATMUL_FLOPS / (2 * args.dim * args.ffn_hidden_dim))))
    if tokens <= cap:
        return tokens
    return 1 << (cap.bit_length() - 1)


def best_seconds(fn: Callable[[], object], device: torch.device, repeats: int = 3) -> float:
    """The fastest of `repeats` timed calls after one untimed (the least disturbed by other load)."""
    fn()
    times = []
    for _ in range(repeats):
        dev.synchronize(device)
        start = time.perf_counter()
        fn()
        dev.synchronize(device)
        times.append(time.perf_counter() - start)
    return min(times)


def matmul_tflops(args: ModelArgs, device: torch.device, kind: str, tokens: int) -> float:
    """(tokens, dim) @ (dim, ffn_hidden_dim), the shape of a block's largest matmuls, in the layout's arithmetic:
    autocast's dtype (fp32 as is), or float8 through `torch._scaled_mm` (bf16 output)."""
    generator = torch.Generator(device="cpu").manual_seed(0)
    x = torch.randn(tokens, args.dim, generator=generator).to(device)
    w = torch.randn(args.ffn_hidden_dim, args.dim, generator=generator).to(device)
    if kind == "float8":
        x8, w8 = x.to(torch.float8_e4m3fn), w.to(torch.float8_e4m3fn)
        scale = torch.ones((), device=device)

        def run() -> object:
            return torch._scaled_mm(x8, w8.t(), scale_a=scale, scale_b=scale, out_dtype=torch.bfloat16)
    else:
        dtype = dev.PRECISION_DTYPES[kind]
        xd, wd = x.to(dtype), w.to(dtype)

        def run() -> object:
            return xd @ wd.t()

    seconds = best_seconds(run, device)
    return 2 * tokens * args.dim * args.ffn_hidden_dim / seconds / 1e12


def copy_gbps(device: torch.device, n_bytes: int = 1 << 27) -> float:
    """Bytes read plus written per second by a copy of an fp32 tensor of `n_bytes`."""
    source = torch.ones(n_bytes // 4, device=device)
    target = torch.empty_like(source)
    seconds = best_seconds(lambda: target.copy_(source), device)
    return 2 * n_bytes / seconds / 1e9


def all_reduce_gbps(device: torch.device, n_bytes: int = 1 << 25) -> float:
    """Bytes each rank sends per second in a ring all-reduce (2·(n-1)/n of the tensor), timed as the slowest rank."""
    tensor = torch.ones(n_bytes // 4, device=device)
    seconds = torch.tensor([best_seconds(lambda: dist.all_reduce(tensor), device)], device=device)
    dist.all_reduce(seconds, op=dist.ReduceOp.MAX)
    world = dist.get_world_size()
    return 2 * (world - 1) / world * n_bytes / float(seconds.item()) / 1e9


def measure_attention(
    args: ModelArgs, device: torch.device, seq_len: int, precision: str, keys: Iterable[tuple[str, int]]
) -> dict[tuple[str, int], float]:
    """Seconds of one layer's attention call, forward and backward, all heads, for each (train.attention, micro-batch)
    in `keys`, through the model's own call (`dlx.model.attention_kernels.kernel_timer`) in the step's compute dtype.
    Micro-batches over MAX_TOKENS tokens are timed at fewer sequences and scaled (attention is linear in the batch);
    a kernel that refuses the shape is left out (the model prices it from FLOPs)."""
    dtype = dev.PRECISION_DTYPES[precision]
    timed: dict[tuple[str, int], float | None] = {}
    seconds: dict[tuple[str, int], float] = {}
    for setting, micro_batch in sorted(set(keys)):
        batch = max(1, min(micro_batch, MAX_TOKENS // seq_len))
        if (setting, batch) not in timed:
            shape = AttentionShape(batch, args.n_heads, args.kv_heads, seq_len, args.head_dim, dtype)
            timed[(setting, batch)] = attention_call_s(setting, shape, device)
        call_s = timed[(setting, batch)]
        if call_s is not None:
            seconds[(setting, micro_batch)] = call_s * micro_batch / batch
    return seconds


def attention_call_s(setting: str, shape: AttentionShape, device: torch.device) -> float | None:
    """train.attention `setting`'s call at `shape`: its kernel (default and a CPU's auto: PyTorch's own choice; auto
    on CUDA: the fastest of `AUTO_TIMED`), None where none runs it."""
    names = (AUTO_TIMED if device.type == "cuda" else ("default",)) if setting == "auto" else (setting,)
    timer = kernel_timer(shape, device, repeats=ATTENTION_REPEATS)
    ms = [value for value in (timer(name) for name in names) if value is not None]
    return min(ms) / 1e3 if ms else None
