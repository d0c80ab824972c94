"""`dlx tune`'s time model: the seconds of one optimizer step of a layout, per rank, from rates measured on this
machine, then calibrated on the layouts already measured.

    step_s = c_compute · F / R(precision, tokens)  +  c_memory · B / bandwidth  +  c_comm · C / link  +  c_micro · A

F: training FLOPs per rank (`dlx.metrics.flops`, attention convention: 6·N + 12·L·H·Q·T per token, ÷ tp), times the
   recomputation activation checkpointing adds (full: the forward again, +1/3; selective: half the layers, +1/6).
R: the matmul rate measured here for the layout's precision (float8: `torch._scaled_mm`) at its micro-batch's token
   count: small matmuls run below the device's peak, and this is where the micro-batch's effect enters.
B: bytes moved outside matmuls: the activations `dlx plan` counts (written in forward, read in backward; the
   recomputed ones again), ×3 for the elementwise kernels around them (norms, SwiGLU, RoPE, residuals), halved by
   torch.compile's fusion (a prior); PyTorch's math attention writes and reads the T×T scores; AdamW reads and writes
   32 bytes per parameter of its shard; the strategy's collectives copy gradients and weights even on one rank
   (`collective_copy_bytes`).
C: bytes each rank sends per step: DDP all-reduces the gradients once (2·(dp-1)/dp · 4 bytes per parameter); ZeRO-1/2
   reduce-scatter gradients and all-gather weights once; FSDP and ZeRO-3 all-gather the weights in forward and backward
   and reduce-scatter the gradients in every micro-step; tensor parallelism all-gathers and reduce-scatters each
   block's activations twice in forward and twice in backward.
A: micro-steps per optimizer step (kernel launches, Python, the loader: a fixed cost per micro-step).

The coefficients start at (1, 1, 1, 30 µs per block kernel) and are fitted after each measured layout by least
squares on relative error, pulled toward those starting values (a ridge), so one or two measured points already move
every prediction and no coefficient leaves a sane range.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from dlx.bench.tune_space import Layout
from dlx.metrics.estimate import AUTOCAST_BYTES, TrainingShape, activation_bytes_per_token_per_layer
from dlx.metrics.flops import training_flops_per_token
from dlx.model.args import ModelArgs
from dlx.model.stats import ParamFormula
from dlx.parallel.traits import STRATEGY_TRAITS

RECOMPUTE = {"none": 0.0, "selective": 1 / 6, "full": 1 / 3}
"""Extra FLOPs, as a share of a training step's, that activation checkpointing recomputes."""
KERNELS_PER_BLOCK = 60
"""Kernels one transformer block launches per micro-step, forward and backward (the per-micro-step cost's scale)."""
RIDGE = 0.3
"""How strongly the fitted coefficients stay near their starting values (relative units)."""


@dataclass(frozen=True)
class Rates:
    """What this machine does per second, measured (`dlx.bench.tune_rates`)."""

    matmul_tflops: dict[tuple[str, int], float]
    """(precision or 'float8', tokens per micro-batch) → TFLOPS of a block-shaped matmul."""
    memory_gbps: float
    """A large tensor copied: bytes read plus written per second."""
    link_gbps: float
    """Per rank, sent through a collective (measured under torchrun, else the stated assumption)."""
    link_measured: bool


@dataclass(frozen=True)
class LayoutCost:
    """The layout's step, in seconds at the uncalibrated rates, per term of the model."""

    compute_s: float
    memory_s: float
    comm_s: float
    micro_s: float

    def terms(self) -> np.ndarray:
        return np.array([self.compute_s, self.memory_s, self.comm_s, self.micro_s])


def layout_cost(
    args: ModelArgs, layout: Layout, seq_len: int, precision: str, world_size: int, rates: Rates
) -> LayoutCost:
    tokens = layout.micro_batch * seq_len * layout.grad_accum  # per replica
    flops = training_flops_per_token(args, seq_len).attention * tokens / layout.tp
    flops *= 1 + RECOMPUTE[layout.activation_checkpointing]
    rate = rates.matmul_tflops[("float8" if layout.float8 else precision, layout.micro_batch * seq_len)]
    compute_s = flops / (rate * 1e12)
    memory_s = memory_bytes(args, layout, seq_len, precision, world_size) / (rates.memory_gbps * 1e9)
    comm_s = comm_bytes(args, layout, seq_len, precision, world_size) / (rates.link_gbps * 1e9)
    micro_s = layout.grad_accum * args.n_layers * KERNELS_PER_BLOCK * 1e-6
    return LayoutCost(compute_s, memory_s, comm_s, micro_s)


def memory_bytes(args: ModelArgs, layout: Layout, seq_len: int, precision: str, world_size: int) -> float:
    """Bytes moved outside matmuls in one step, per rank (see the module docstring)."""
    shape = training_shape(layout, seq_len, precision, world_size, "cpu")
    tokens = layout.micro_batch * seq_len * layout.grad_accum
    per_token_layer = activation_bytes_per_token_per_layer(args, shape)
    recomputed = {"none": 0.0, "selective": 0.5, "full": 1.0}[layout.activation_checkpointing]
    activations = 3 * per_token_layer * tokens * args.n_layers * (2 + recomputed)
    if layout.compile:
        activations /= 2
    if layout.attention == "math":
        scores = AUTOCAST_BYTES[precision] * args.n_heads * seq_len * seq_len / layout.tp
        activations += 4 * scores * layout.micro_batch * layout.grad_accum * args.n_layers
    params = ParamFormula(args).per_tensor_parallel_rank(layout.tp)
    sharded = STRATEGY_TRAITS[layout.strategy].sharding_stage
    stage = layout.zero_stage if sharded is None else sharded
    optimizer = 32 * params / (shape.dp if stage >= 1 else 1)
    return activations + optimizer + collective_copy_bytes(layout, params)


def collective_copy_bytes(layout: Layout, params: float) -> float:
    """What the strategy's collectives read and write locally whatever the rank count (a group of one copies too):
    DDP's gradient buckets once per step; sharded weights gathered in forward and backward and gradients
    reduce-scattered in every micro-step (FSDP, ZeRO-3); ZeRO-1/2's flat gradient and weight buffers once per step."""
    if layout.strategy == "none":
        return 0.0
    sharded = STRATEGY_TRAITS[layout.strategy].sharding_stage
    stage = layout.zero_stage if sharded is None else sharded
    if stage >= 3:
        return 2 * 3 * 4 * params * layout.grad_accum
    return 2 * 2 * 4 * params


def comm_bytes(args: ModelArgs, layout: Layout, seq_len: int, precision: str, world_size: int) -> float:
    """Bytes each rank sends in one step (see the module docstring); 0 on one rank."""
    dp = world_size // layout.tp
    params = ParamFormula(args).per_tensor_parallel_rank(layout.tp)
    ring = (dp - 1) / dp
    sharded = STRATEGY_TRAITS[layout.strategy].sharding_stage
    stage = layout.zero_stage if sharded is None else sharded
    once = stage < 3  # all-reduce (DDP), or reduce-scatter + all-gather once per step (ZeRO-1/2)
    data = 2 * ring * 4 * params if once else 3 * ring * 4 * params * layout.grad_accum
    tp_ring = (layout.tp - 1) / layout.tp
    tokens = layout.micro_batch * seq_len * layout.grad_accum
    tensor = 8 * tp_ring * tokens * args.dim * AUTOCAST_BYTES[precision] * args.n_layers
    return data + tensor


def training_shape(layout: Layout, seq_len: int, precision: str, world_size: int, device_type: str) -> TrainingShape:
    """The layout as `dlx plan` takes it."""
    return TrainingShape(
        seq_len=seq_len,
        micro_batch=layout.micro_batch,
        grad_accum=layout.grad_accum,
        precision=precision,
        strategy=layout.strategy,
        world_size=world_size,
        tp=layout.tp,
        zero_stage=layout.zero_stage,
        activation_checkpointing=layout.activation_checkpointing,
        attention_matrix=layout.attention == "math",
        device_type=device_type,
    )


@dataclass(frozen=True)
class TimeModel:
    """Coefficients over LayoutCost's terms: predicted step seconds = coefficients · terms."""

    coefficients: tuple[float, float, float, float] = (1.0, 1.0, 1.0, 1.0)
    measured_points: int = 0

    def predict(self, cost: LayoutCost) -> float:
        return float(np.dot(self.coefficients, cost.terms()))


def calibrate(costs: Sequence[LayoutCost], measured_s: Sequence[float], ridge: float = RIDGE) -> TimeModel:
    """The coefficients that best predict the measured step times, as relative errors, with a ridge pulling each
    toward 1 (its uncalibrated value); none below 1 % of it. No points: the uncalibrated model."""
    if not costs:
        return TimeModel()
    rows = [cost.terms() / seconds for cost, seconds in zip(costs, measured_s, strict=True)]
    a = np.vstack([*rows, ridge * np.eye(4)])
    b = np.concatenate([np.ones(len(rows)), ridge * np.ones(4)])
    solution, *_ = np.linalg.lstsq(a, b, rcond=None)
    clipped = np.maximum(solution, 0.01)
    return TimeModel(tuple(float(x) for x in clipped), len(rows))  # type: ignore[arg-type]
