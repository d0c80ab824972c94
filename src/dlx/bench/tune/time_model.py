"""`dlx tune`'s time model: the seconds of one optimizer step of a layout, per rank, as a sum of terms priced from
rates measured on this machine, each term scaled by a coefficient fitted to the layouts already measured.

    step_s = c_step · S  +  c_micro · A · K  +  c_compute · F / R  +  c_memory · B / bandwidth  +  c_comm · C / link
             +  c_attention · T_attention  +  c_compiled · B_compiled / bandwidth

S: the fixed cost of an optimizer step whatever its size (the optimizer's per-tensor Python and kernel launches, the
   loss's host sync, logging), priced at `STEP_PRIOR_S` until fitted.
A · K: micro-steps per optimizer step times what one costs besides its FLOPs and bytes (kernel launches, autograd's
   bookkeeping, the loader's batch copied in), priced at `KERNELS_PER_BLOCK` launches per block at `LAUNCH_PRIOR_S`.
F: training FLOPs per rank of the matmuls outside attention (`dlx.metrics.flops`, 6·N per token, ÷ tp), times the
   recomputation activation checkpointing adds (full: the forward again, +1/3; selective: half the layers, +1/6).
R: the matmul rate measured here for the layout's precision (float8: `torch._scaled_mm`) at its micro-batch's token
   count: small matmuls run below the device's peak, and this is where the micro-batch's effect enters.
B: bytes moved outside matmuls by an eager step: the activations `dlx plan` counts (written in forward, read in
   backward; the recomputed ones again), ×3 for the elementwise kernels around them (norms, SwiGLU, RoPE,
   residuals); AdamW reads and writes 32 bytes per parameter of its shard; the strategy's collectives copy gradients
   and weights even on one rank (`collective_copy_bytes`).
C: bytes each rank sends per step (`comm_bytes`; under context parallelism the keys and values gathered).
Under context parallelism (parallel.cp) every per-token term counts a rank's seq_len / cp tokens of each sequence,
and the attention call (measured at the whole sequence) 1 / cp of its query rows.
T_attention: the attention itself, measured: one layer's call forward and backward under the layout's kernel
   (train.attention) at its micro-batch (`tune_rates.measure_attention`), times layers and micro-steps, ÷ tp, plus
   the recomputed forwards (the same shares as F's). Where it was not measured (a kernel that refused the shape):
   priced as its FLOPs (12·L·H·Q·T per token) at R, plus, for math, the T×T scores of every head written and read
   in forward and backward at the copy bandwidth. Kernels are not priced from a prior ratio: on a CPU PyTorch's
   default kernel and math trade places with the micro-batch.
B_compiled: a torch.compile'd layout's activation traffic, a term of its own instead of B's: what compile's fusion
   saves is fitted from compiled layouts measured here, not assumed (before one is measured it is priced as eager).

The coefficients are fitted after each measured layout by non-negative least squares on relative error, with a ridge
pulling each toward 1 (its price from the measured rates and the priors), so that a term the measured layouts do not
tell apart keeps its price and one or two measured points already move every prediction (`calibrate`). A scale over
the whole sum (the geometric mean of measured ÷ fitted) then takes up what the ridge holds back when the machine runs
slower than its rates said (other processes on its cores): one measurement 10× slower than priced makes every
prediction 10× slower, not a few per cent.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import astuple, dataclass, field

import numpy as np

from dlx.bench.tune.space import Layout
from dlx.metrics.communication import communication_bytes
from dlx.metrics.estimate import (
    AUTOCAST_BYTES,
    TrainingShape,
    activation_bytes_per_token_per_layer,
    rank_shape,
    shard_ranks,
    sharding_stage,
)
from dlx.metrics.flops import training_flops_per_token
from dlx.model.args import ModelArgs
from dlx.model.stats import ParamFormula

RECOMPUTE = {"none": 0.0, "selective": 1 / 6, "full": 1 / 3}
"""Extra FLOPs, as a share of a training step's, that activation checkpointing recomputes."""
KERNELS_PER_BLOCK = 60
"""Kernels one transformer block launches per micro-step, forward and backward (the per-micro-step term's scale)."""
LAUNCH_PRIOR_S = {"cpu": 20e-6, "cuda": 10e-6}
"""A kernel launch's cost before any layout is measured (an eager op's dispatch on a CPU, a launch on CUDA)."""
STEP_PRIOR_S = {"cpu": 0.01, "cuda": 0.005}
"""The fixed cost of one optimizer step before any layout is measured."""
RIDGE = 0.1
"""How strongly the fitted coefficients stay near 1 (their priced value), against relative errors of the fit."""
TERMS = ("step", "micro", "compute", "memory", "comm", "attention", "compiled")
"""The model's terms, in the order of `LayoutCost` and of the coefficients."""


@dataclass(frozen=True)
class Rates:
    """What this machine does per second, measured (`dlx.bench.tune.rates`)."""

    matmul_tflops: dict[tuple[str, int], float]
    """(precision or 'float8', tokens per micro-batch) → TFLOPS of a block-shaped matmul."""
    memory_gbps: float
    """A large tensor copied: bytes read plus written per second."""
    link_gbps: float
    """Per rank, sent through a collective (measured under torchrun, else the stated assumption)."""
    link_measured: bool
    device_type: str = "cpu"
    """Whose priors (`STEP_PRIOR_S`, `LAUNCH_PRIOR_S`) price the step and micro-step terms."""
    attention_s: dict[tuple[str, int], float] = field(default_factory=dict)
    """(train.attention, micro-batch) → seconds of one layer's attention call, forward and backward, all heads, at
    the recipe's sequence length; what is missing is priced from FLOPs."""


@dataclass(frozen=True)
class LayoutCost:
    """The layout's step, in seconds at the measured rates and the priors, per term of the model (`TERMS`)."""

    step_s: float
    micro_s: float
    compute_s: float
    memory_s: float
    comm_s: float
    attention_s: float = 0.0
    compiled_s: float = 0.0

    def terms(self) -> np.ndarray:
        return np.array(astuple(self), dtype=float)


def layout_cost(
    args: ModelArgs, layout: Layout, seq_len: int, precision: str, world_size: int, rates: Rates
) -> LayoutCost:
    tokens = layout.tokens_per_micro(seq_len) * layout.grad_accum  # per rank: seq_len / cp of each sequence
    recompute = 1 + RECOMPUTE[layout.activation_checkpointing]
    per_token = training_flops_per_token(args, seq_len)
    rate = rates.matmul_tflops[("float8" if layout.float8 else precision, layout.tokens_per_micro(seq_len))]
    bandwidth = rates.memory_gbps * 1e9
    call_s = rates.attention_s.get((layout.attention, layout.micro_batch))
    if call_s is None:  # not measured: its FLOPs at the matmul rate, math's scores at the copy bandwidth
        attention_flops = (per_token.attention - per_token.dense) * tokens / layout.tp * recompute
        attention_s = attention_flops / (rate * 1e12) + scores_bytes(args, layout, seq_len, precision) / bandwidth
    else:  # the call at the whole sequence; a cp rank's queries are 1 / cp of its rows
        attention_s = call_s * args.n_layers * layout.grad_accum / layout.tp / layout.cp * recompute
    flops = per_token.dense * tokens / layout.tp * recompute
    activations = activation_traffic_bytes(args, layout, seq_len, precision, world_size)
    eager = 0.0 if layout.compile else activations
    return LayoutCost(
        step_s=STEP_PRIOR_S.get(rates.device_type, 0.01),
        micro_s=layout.grad_accum * args.n_layers * KERNELS_PER_BLOCK * LAUNCH_PRIOR_S.get(rates.device_type, 20e-6),
        compute_s=flops / (rate * 1e12),
        memory_s=(eager + state_traffic_bytes(args, layout, seq_len, precision, world_size)) / bandwidth,
        comm_s=comm_bytes(args, layout, seq_len, precision, world_size) / (rates.link_gbps * 1e9),
        attention_s=attention_s,
        compiled_s=(activations if layout.compile else 0.0) / bandwidth,
    )


def activation_traffic_bytes(args: ModelArgs, layout: Layout, seq_len: int, precision: str, world_size: int) -> float:
    """The activations of one step written in forward and read in backward (the recomputed ones again), ×3 for the
    elementwise kernels around them."""
    shape = rank_shape(training_shape(layout, seq_len, precision, world_size, "cpu"))
    tokens = layout.tokens_per_micro(seq_len) * layout.grad_accum
    per_token_layer = activation_bytes_per_token_per_layer(args, shape)
    recomputed = {"none": 0.0, "selective": 0.5, "full": 1.0}[layout.activation_checkpointing]
    return 3 * per_token_layer * tokens * args.n_layers * (2 + recomputed)


def scores_bytes(args: ModelArgs, layout: Layout, seq_len: int, precision: str) -> float:
    """Math attention's T×T scores per head, written and read in forward and in backward, every layer and
    micro-step; 0 for the fused kernels."""
    if layout.attention != "math":
        return 0.0
    scores = AUTOCAST_BYTES[precision] * args.n_heads * seq_len * seq_len / layout.tp / layout.cp
    return 4 * scores * layout.micro_batch * layout.grad_accum * args.n_layers


def state_traffic_bytes(args: ModelArgs, layout: Layout, seq_len: int, precision: str, world_size: int) -> float:
    """AdamW's reads and writes of its shard (32 bytes per parameter) and the strategy's local copies."""
    shape = training_shape(layout, seq_len, precision, world_size, "cpu")
    params = ParamFormula(args).per_tensor_parallel_rank(layout.tp)
    optimizer = 32 * params / (shard_ranks(shape) if sharding_stage(shape) >= 1 else 1)
    return optimizer + collective_copy_bytes(layout, shape, params)


def collective_copy_bytes(layout: Layout, shape: TrainingShape, params: float) -> float:
    """What the strategy's collectives read and write locally whatever the rank count (a group of one copies too):
    DDP's gradient buckets once per step; sharded weights gathered in forward and backward and gradients
    reduce-scattered in every micro-step (FSDP, HSDP, ZeRO-3); ZeRO-1/2's flat gradient and weight buffers once per
    step."""
    if layout.strategy == "none":
        return 0.0
    if sharding_stage(shape) >= 3:
        return 2 * 3 * 4 * params * layout.grad_accum
    return 2 * 2 * 4 * params


def comm_bytes(args: ModelArgs, layout: Layout, seq_len: int, precision: str, world_size: int) -> float:
    """Bytes each rank sends in one step; 0 on one rank. DDP, FSDP and HSDP as `dlx plan` counts them
    (`dlx.metrics.communication`); DeepSpeed's ZeRO-1/2 reduce-scatter the gradients and all-gather the weights once
    per step, ZeRO-3 gathers the weights in forward and backward and reduce-scatters the gradients every micro-step;
    tensor parallelism all-gathers and reduce-scatters each block's activations twice in forward and twice in
    backward."""
    shape = training_shape(layout, seq_len, precision, world_size, "cpu")
    params = ParamFormula(args).per_tensor_parallel_rank(layout.tp)
    if layout.strategy == "deepspeed":
        ring = (shape.dp - 1) / shape.dp
        once = sharding_stage(shape) < 3
        data = 2 * ring * 4 * params if once else 3 * ring * 4 * params * layout.grad_accum
    else:
        data = communication_bytes(args, shape).total
    tp_ring = (layout.tp - 1) / layout.tp
    tokens = layout.tokens_per_micro(seq_len) * layout.grad_accum
    return data + 8 * tp_ring * tokens * args.dim * AUTOCAST_BYTES[precision] * args.n_layers


def training_shape(layout: Layout, seq_len: int, precision: str, world_size: int, device_type: str) -> TrainingShape:
    """The layout as `dlx plan` takes it."""
    return TrainingShape.of(
        layout,
        seq_len=seq_len,
        micro_batch=layout.micro_batch,
        grad_accum=layout.grad_accum,
        precision=precision,
        world_size=world_size,
        device_type=device_type,
        attention=layout.attention,
    )


@dataclass(frozen=True)
class TimeModel:
    """Coefficients over LayoutCost's terms: predicted step seconds = coefficients · terms."""

    coefficients: tuple[float, ...] = (1.0,) * len(TERMS)
    measured_points: int = 0
    scale: float = 1.0
    """Over the whole sum: the geometric mean of the measured steps ÷ the coefficients' predictions."""

    def predict(self, cost: LayoutCost) -> float:
        return self.scale * float(np.dot(self.coefficients, cost.terms()))

    def describe(self) -> str:
        terms = ", ".join(f"{name} {value:.3g}" for name, value in zip(TERMS, self.coefficients, strict=True))
        return f"{terms}; × {self.scale:.3g} overall"


def calibrate(costs: Sequence[LayoutCost], measured_s: Sequence[float], ridge: float = RIDGE) -> TimeModel:
    """The non-negative coefficients that best predict the measured step times, as relative errors, with a ridge of
    weight `ridge` pulling each toward 1 (ridge 0: plain non-negative least squares, which recovers the coefficients
    of step times that are such a sum exactly). No points: the priced model."""
    if not costs:
        return TimeModel()
    rows = np.vstack([cost.terms() / seconds for cost, seconds in zip(costs, measured_s, strict=True)])
    a = np.vstack([rows, ridge * np.eye(rows.shape[1])])
    b = np.concatenate([np.ones(len(rows)), ridge * np.ones(rows.shape[1])])
    coefficients = non_negative_least_squares(a, b)
    fitted = rows @ coefficients  # each measured point's prediction ÷ its measurement
    scale = float(np.exp(-np.mean(np.log(fitted)))) if np.all(fitted > 0) else 1.0
    return TimeModel(tuple(float(x) for x in coefficients), len(rows), scale)


def non_negative_least_squares(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """argmin ‖a·x − b‖ over x ≥ 0, exactly: the least-squares solution on every subset of the columns, the best of
    those with no negative entry (the model has few terms: 2^7 small solves). Columns that are all zero stay 0."""
    n = a.shape[1]
    live = [j for j in range(n) if np.any(a[:, j])]
    best, best_residual = np.zeros(n), float(np.sum(b**2))
    for size in range(1, len(live) + 1):
        for subset in itertools.combinations(live, size):
            solution, *_ = np.linalg.lstsq(a[:, subset], b, rcond=None)
            if np.any(solution < 0):
                continue
            residual = float(np.sum((a[:, subset] @ solution - b) ** 2))
            if residual < best_residual - 1e-15:
                best = np.zeros(n)
                best[list(subset)] = solution
                best_residual = residual
    return best
