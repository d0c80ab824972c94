"""Memory and time estimates for one training configuration, before running it (`dlx plan`).

Bytes per parameter, with AdamW and mixed precision by autocast (weights stay fp32, matmuls run in bf16/fp16):
    weights 4, gradients 4, AdamW moments 8, plus a 2-byte copy of each weight that autocast caches during forward.
Sharding, in the recipe's `parallel` words. Tensor parallelism (`tp`) first divides every matmul weight and the
embedding by tp (the norm weights, (2·n_layers + 1)·dim of them, stay whole on every rank). Then over the
dp = world_size / tp data-parallel ranks: DDP replicates everything (and with tp 1 keeps 4 bytes/param of gradient
buckets; with tp > 1 it is FSDP2's hybrid mode, which has none); DeepSpeed ZeRO stage 1 shards the optimizer state,
stage 2 also the gradients, stage 3 also the weights; FSDP shards all three (like stage 3).

Activations saved for backward, per token and per layer (p = bytes of the compute dtype, d = dim, f = FFN hidden,
k = n_kv_heads · head_dim, H = n_heads), counted from what dlx's modules keep (tests/test_plan.py checks the count
against the tensors a block saves, on CPU):
    RMSNorm inputs (fp32 residual stream) and 1/rms         2 · (4d + 4)
    + the fp32 normalised product, where rms_norm is PyTorch's composite kernel (CPU)   2 · 4d
    normed inputs of the q/k/v and FFN matmuls (one cast)   2 · p·d
    q, k, v handed to attention                             p·(d + 2k); p·3d where k and v are repeated (`kv_repeated`)
    attention output (input of wo) and its log-sum-exp      p·d + 4H
    SwiGLU: w1 and w3 outputs, silu, product                4 · p·f
RoPE keeps nothing (its tables are constants). Attention kernels that store the T×T score matrix (PyTorch's math
path: an explicit mask, or `attention_matrix`) add p·H·T; flash kernels (CUDA, and CPU since PyTorch 2.2) store only
the log-sum-exp. The loss (dlx.model.loss) keeps no logits: one chunk of at most 2²⁸ logits at a time, 8 bytes each
(the logits, p; their fp32 log-softmax, turned into the gradient in place, 4; that gradient cast back to p bytes, which
fp32 skips), plus the gradient of the final hidden states (p·d per token), the final norm's input (4d), and the output
weight's fp32 gradient accumulator (4 · vocab · d). Full activation checkpointing keeps only each layer's fp32 input
and recomputes one layer at a time; `selective` checkpoints every other layer.
With tensor (and sequence) parallelism every activation term is divided by tp except the normed matmul inputs, which
each rank gathers whole (B, T, dim) before its column-parallel matmuls; the loss then takes the whole logits as
vocabulary shards instead of chunks: (p + 4 + 4)·vocab / tp per token (the autocast logits, the fp32 copy
cross-entropy makes, its gradient).
This is an estimate (allocator fragmentation, temporary buffers and CUDA context are not counted); `dlx bench` prints it
beside the measurement.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from dlx.errors import UserError
from dlx.metrics.flops import FlopsPerToken, training_flops_per_token
from dlx.model.args import ModelArgs
from dlx.model.loss import CHUNK_LOGITS
from dlx.model.stats import ParamFormula
from dlx.parallel.traits import STRATEGY_TRAITS

STRATEGIES = tuple(STRATEGY_TRAITS)
ZERO_STAGES = (1, 2, 3)
CHECKPOINTING = ("none", "full", "selective")
AUTOCAST_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}
GB = 1e9


@dataclass(frozen=True)
class TrainingShape:
    seq_len: int
    micro_batch: int
    grad_accum: int = 1
    precision: str = "bf16"
    strategy: str = "none"
    world_size: int = 1
    """Ranks in all (GPUs): tp × the data-parallel ranks."""
    tp: int = 1
    """Tensor-parallel ranks per model replica."""
    zero_stage: int = 2
    """DeepSpeed ZeRO stage (strategy deepspeed): 1 shards the optimizer state, 2 also gradients, 3 also weights."""
    activation_checkpointing: str = "none"
    attention_matrix: bool = False
    """True when the attention kernel stores the T×T scores (PyTorch's math path: an explicit attention mask)."""
    device_type: str = "cuda"
    """Whose kernels: `cuda` (fused rms_norm; k and v repeated in fp32, where SDPA's GQA kernel does not run) or `cpu`
    (composite rms_norm; GQA in the flash kernel)."""

    @property
    def dp(self) -> int:
        """Data-parallel ranks: model replicas reading different batches."""
        return self.world_size // self.tp

    def __post_init__(self) -> None:
        for name in ("seq_len", "micro_batch", "grad_accum", "world_size", "tp"):
            if getattr(self, name) <= 0:
                raise UserError(f"{name.replace('_', '-')} must be a positive integer, got {getattr(self, name)}")
        if self.world_size % self.tp:
            raise UserError(f"--world-size {self.world_size} must be a multiple of --tp {self.tp} (ranks = dp × tp)")
        _check_choice("precision", self.precision, tuple(AUTOCAST_BYTES))
        _check_choice("strategy", self.strategy, STRATEGIES)
        if self.tp > 1 and not STRATEGY_TRAITS[self.strategy].supports_tp:
            raise UserError(f"--strategy {self.strategy} does not combine with --tp > 1; use --strategy fsdp")
        if self.zero_stage not in ZERO_STAGES:
            raise UserError(f"zero-stage must be 1, 2 or 3, got {self.zero_stage}")
        _check_choice("activation-checkpointing", self.activation_checkpointing, CHECKPOINTING)
        _check_choice("device", self.device_type, ("cuda", "cpu"))

    @property
    def kv_repeated(self) -> bool:
        """k and v copied to n_heads before attention: CUDA SDPA's GQA runs only in the half-precision flash kernel."""
        return self.device_type == "cuda" and self.precision == "fp32"


def _check_choice(name: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise UserError(f"unknown {name} '{value}'; choose one of {', '.join(allowed)}")


@dataclass(frozen=True)
class MemoryPlan:
    params: int
    weights_gb: float
    grads_gb: float
    optimizer_gb: float
    activations_gb: float
    logits_gb: float
    flops_per_token: FlopsPerToken
    tokens_per_step: int
    """Tokens in one optimizer step, all ranks: micro_batch · seq_len · grad_accum · dp."""

    @property
    def total_gb(self) -> float:
        return self.weights_gb + self.grads_gb + self.optimizer_gb + self.activations_gb + self.logits_gb

    def step_seconds(self, peak_tflops: float, mfu: float, world_size: int) -> float:
        """Predicted optimizer-step time at the given MFU (attention-inclusive FLOPs)."""
        flops = self.flops_per_token.attention * self.tokens_per_step
        return flops / (peak_tflops * 1e12 * mfu * world_size)


def _state_bytes(n_params: float, shape: TrainingShape) -> tuple[float, float, float]:
    """Weights, gradients, optimizer bytes per rank, for `n_params` per tensor-parallel rank."""
    weights = n_params * (4 + (2 if shape.precision != "fp32" else 0))
    grads = n_params * 4 * (2 if STRATEGY_TRAITS[shape.strategy].gradient_buckets and shape.tp == 1 else 1)
    optimizer = n_params * 8
    world = shape.dp
    if sharding_stage(shape) >= 1:
        optimizer /= world
    if sharding_stage(shape) >= 2:
        grads /= world
    if sharding_stage(shape) >= 3:
        weights /= world
    return weights, grads, optimizer


def sharding_stage(shape: TrainingShape) -> int:
    """What is sharded, as a ZeRO stage: 0 nothing, 1 optimizer state, 2 and gradients, 3 and weights."""
    stage = STRATEGY_TRAITS[shape.strategy].sharding_stage
    return shape.zero_stage if stage is None else stage


def activation_bytes_per_token_per_layer(args: ModelArgs, shape: TrainingShape) -> float:
    p, tp = AUTOCAST_BYTES[shape.precision], shape.tp
    d, f, k, heads = args.dim, args.ffn_hidden_dim, args.kv_heads * args.head_dim, args.n_heads
    norms = 2 * (4 * d + 4) + (2 * 4 * d if shape.device_type == "cpu" else 0)
    qkv = p * 3 * d if shape.kv_repeated else p * (d + 2 * k)
    sharded = norms + qkv + p * d + 4 * heads + 4 * p * f
    if shape.attention_matrix:
        sharded += p * heads * shape.seq_len
    return sharded / tp + 2 * p * d  # the normed matmul inputs are gathered whole on every TP rank


def loss_bytes(args: ModelArgs, shape: TrainingShape) -> float:
    """The loss's memory: without tensor parallelism one chunk's logits, the hidden-state gradient, the final norm's
    input and the output weight's gradient accumulator; with it the whole logits' shards (see the module docstring)."""
    p = AUTOCAST_BYTES[shape.precision]
    tokens = shape.micro_batch * shape.seq_len
    if shape.tp > 1:  # vocab-parallel cross-entropy on the whole logits' shards
        return tokens * args.vocab_size * (p + 4 + 4) / shape.tp
    chunk_tokens = min(tokens, max(1, CHUNK_LOGITS // args.vocab_size))
    per_logit = p + 4 + (p if p < 4 else 0)
    return chunk_tokens * args.vocab_size * per_logit + tokens * args.dim * (p + 4) + 4 * args.vocab_size * args.dim


def _activation_bytes(args: ModelArgs, shape: TrainingShape) -> float:
    tokens = shape.micro_batch * shape.seq_len
    per_layer = activation_bytes_per_token_per_layer(args, shape) * tokens
    layer_input = 4 * args.dim * tokens / shape.tp  # the residual stream is sequence-sharded under TP
    if shape.activation_checkpointing == "full":
        return args.n_layers * layer_input + per_layer
    if shape.activation_checkpointing == "selective":
        kept = (args.n_layers + 1) // 2
        return kept * per_layer + (args.n_layers - kept) * layer_input + per_layer
    return args.n_layers * per_layer


def plan_memory(args: ModelArgs, shape: TrainingShape) -> MemoryPlan:
    n_params = ParamFormula(args).total
    weights, grads, optimizer = _state_bytes(ParamFormula(args).per_tensor_parallel_rank(shape.tp), shape)
    return MemoryPlan(
        params=n_params,
        weights_gb=weights / GB,
        grads_gb=grads / GB,
        optimizer_gb=optimizer / GB,
        activations_gb=_activation_bytes(args, shape) / GB,
        logits_gb=loss_bytes(args, shape) / GB,
        flops_per_token=training_flops_per_token(args, shape.seq_len),
        tokens_per_step=shape.micro_batch * shape.seq_len * shape.grad_accum * shape.dp,
    )


def max_micro_batch(args: ModelArgs, shape: TrainingShape, budget_gb: float, limit: int = 4096) -> int:
    """The largest micro-batch whose estimate fits in budget_gb (0 when even 1 does not)."""
    best = 0
    low, high = 1, limit
    while low <= high:
        mid = (low + high) // 2
        fits = plan_memory(args, replace(shape, micro_batch=mid)).total_gb <= budget_gb
        best, low, high = (mid, mid + 1, high) if fits else (best, low, mid - 1)
    return best
