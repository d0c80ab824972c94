"""Memory and time estimates for one training configuration, before running it (`dlx plan`).

The estimate is the peak of live tensors: what CUDA's caching allocator reports as `max_memory_allocated`, and what
`torch.profiler`'s allocator events add up to on a CPU. It is not the sum of its terms, which are never all alive at
once: the weights and AdamW's state stay, the rest comes and goes by phase (`phase_peaks`), and the total is the
weights and optimizer state plus the largest phase. benchmarks/bench_memory_estimate.py checks it against dlx's own
steps, cell by cell.

Bytes per parameter, with AdamW and mixed precision by autocast (weights stay fp32, matmuls run in bf16/fp16):
    weights 4, gradients 4, AdamW moments 8, plus a 2-byte copy of each weight that autocast caches during forward
    and each matmul keeps for its backward (the loss casts the output weight itself, for its forward).
The RoPE tables (fp32 cos and sin, max_seq_len × head_dim each) are counted with the weights.
Sharding, in the recipe's `parallel` words. Tensor parallelism (`tp`) first divides every matmul weight and the
embedding by tp (the norm weights, (2·n_layers + 1)·dim of them, stay whole on every rank). Then over the
dp = world_size / tp data-parallel ranks: DDP replicates everything (and with tp 1 keeps 4 bytes/param of gradient
buckets; with tp > 1 it is FSDP2's hybrid mode, which has none); DeepSpeed ZeRO stage 1 shards the optimizer state,
stage 2 also the gradients, stage 3 also the weights; FSDP shards all three (like stage 3).

Activations saved for backward, per token and per layer (p = bytes of the compute dtype, d = dim, f = FFN hidden,
k = n_kv_heads · head_dim, H = n_heads), counted from what dlx's modules keep (tests/integration/test_plan.py checks the
count against the tensors a block saves, on CPU):
    RMSNorm inputs (fp32 residual stream) and 1/rms         2 · (4d + 4)
    + the fp32 normalised product, where rms_norm is PyTorch's composite kernel (CPU)   2 · 4d
    normed inputs of the q/k/v and FFN matmuls (one cast)   2 · p·d
    q, k, v handed to attention                             p·(d + 2k); p·3d where k and v are repeated (`kv_repeated`)
    attention output (input of wo) and its log-sum-exp      p·d + 4H
    SwiGLU: w1 and w3 outputs, silu, product                4 · p·f
RoPE keeps nothing (its tables are constants). Attention kernels that store the T×T score matrix (PyTorch's math
path: an explicit mask, or `attention_matrix`) add p·H·T; flash kernels (CUDA, and CPU since PyTorch 2.2) store only
the log-sum-exp. The loss (dlx.model.loss) keeps no logits: one chunk of at most 2²⁸ logits at a time (in fp32 the
logits, 4, overwritten by their log-softmax and then by the gradient; under autocast the logits, p, their fp32 copy
overwritten the same way, 4, and the gradient cast back to p bytes), plus
the final hidden states and their gradient (2·p·d per token), the final norm's input (4d, and 4d more for the
composite kernel's product on CPU), and the output weight's fp32 gradient accumulator (4 · vocab · d): `loss_buffers`.
Full activation checkpointing keeps only each layer's fp32 input and recomputes one layer at a time; `selective`
checkpoints every other layer.
With tensor (and sequence) parallelism every activation term is divided by tp except the normed matmul inputs, which
each rank gathers whole (B, T, dim) before its column-parallel matmuls; the loss then takes the whole logits as
vocabulary shards instead of chunks: (p + 4 + 4)·vocab / tp per token (the autocast logits, the fp32 copy
cross-entropy makes, its gradient).
Not counted: the allocator's slack, the CUDA context, per-op temporaries inside a kernel, the loader's memory. On a
CPU the process's resident set exceeds the tensors' peak by more than that: glibc's malloc raises its mmap threshold
(up to 32 MiB) after the first large free, so tensors below it come from heaps that keep freed memory; measured,
the resident set grows 14-46 % more than the tensors do (BENCHMARKS.md, Memory estimate). `dlx bench` prints the
estimate beside the measurement.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

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
    cp: int = 1
    """Context-parallel ranks per model replica: each holds seq_len / cp tokens of every sequence."""
    dp_replicate: int = 1
    """strategy hsdp: replicas, each sharded over dp / dp_replicate ranks."""

    @classmethod
    def of(
        cls,
        layout: Any,
        *,
        seq_len: int,
        micro_batch: int,
        grad_accum: int = 1,
        precision: str = "bf16",
        world_size: int = 1,
        device_type: str = "cuda",
        attention: str = "auto",
        document_mask: bool = False,
    ) -> TrainingShape:
        """The one builder of a training step's shape, from a layout (anything with the `parallel` section's names:
        the recipe's ParallelConfig, a `dlx tune` layout, a `dlx bench` setup; a name it lacks takes its default)
        and the step's sizes. The attention kernel stores the T×T scores with train.attention math, and on a CPU
        wherever SDPA gets a boolean mask (document masks, context parallelism)."""
        cp = getattr(layout, "cp", 1)
        masked = (document_mask or cp > 1) and device_type != "cuda"
        return cls(
            seq_len=seq_len,
            micro_batch=micro_batch,
            grad_accum=grad_accum,
            precision=precision,
            strategy=layout.strategy,
            world_size=world_size,
            tp=getattr(layout, "tp", 1),
            zero_stage=getattr(layout, "zero_stage", 2),
            activation_checkpointing=getattr(layout, "activation_checkpointing", "none"),
            attention_matrix=attention == "math" or masked,
            device_type=device_type,
            cp=cp,
            dp_replicate=getattr(layout, "dp_replicate", 1),
        )

    @property
    def dp(self) -> int:
        """Data-parallel ranks, over which gradients are averaged and state sharded: world_size / tp (the
        context-parallel ranks among them)."""
        return self.world_size // self.tp

    @property
    def replicas(self) -> int:
        """Model replicas reading different batches: dp / cp."""
        return self.dp // self.cp

    def __post_init__(self) -> None:
        for name in ("seq_len", "micro_batch", "grad_accum", "world_size", "tp"):
            if getattr(self, name) <= 0:
                raise UserError(f"{name.replace('_', '-')} must be a positive integer, got {getattr(self, name)}")
        if self.world_size % self.tp:
            raise UserError(f"--world-size {self.world_size} must be a multiple of --tp {self.tp} (ranks = dp × tp)")
        _check_context_and_replicas(self)
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
class MemoryEstimate:
    params: int
    weights_gb: float
    """fp32 weights and, under autocast, their compute-dtype copies (see the module docstring)."""
    grads_gb: float
    """Gradients (and DDP's buckets): live from backward to the optimizer step's zero_grad."""
    optimizer_gb: float
    activations_gb: float
    """What forward saves for backward (checkpointed: the layer inputs), plus one layer's recomputation."""
    logits_gb: float
    """The loss at its largest: one chunk's logits and their gradient, the hidden states, their gradient, the output
    weight's gradient accumulator."""
    flops_per_token: FlopsPerToken
    tokens_per_step: int
    """Tokens in one optimizer step, all ranks: micro_batch · seq_len · grad_accum · dp."""
    total_gb: float = 0.0
    """The peak: weights and optimizer state, plus the largest of the phases' buffers (`peak_phase`); not the sum of
    the terms above, which are never all alive at once."""
    peak_phase: str = ""
    """Where the peak falls: `forward` (at the loss), `backward`, or `optimizer`."""

    def step_seconds(self, peak_tflops: float, mfu: float, world_size: int) -> float:
        """Predicted optimizer-step time at the given MFU (attention-inclusive FLOPs)."""
        flops = self.flops_per_token.attention * self.tokens_per_step
        return flops / (peak_tflops * 1e12 * mfu * world_size)


@dataclass(frozen=True)
class StateBytes:
    """Per rank: the fp32 weights, autocast's compute-dtype copies of them, the gradients, DDP's buckets, AdamW's
    moments."""

    weights: float
    copies: float
    grads: float
    buckets: float
    optimizer: float


def rope_table_bytes(args: ModelArgs) -> int:
    """RoPE's cos and sin tables, fp32 (max_seq_len, head_dim) each: buffers every rank holds whole."""
    return 2 * args.max_seq_len * args.head_dim * 4


def _state_bytes(args: ModelArgs, n_params: float, shape: TrainingShape) -> StateBytes:
    """The state for `n_params` per tensor-parallel rank, sharded as the strategy shards it (not the RoPE tables)."""
    weights = n_params * 4 + rope_table_bytes(args)
    copies = n_params * 2 if shape.precision != "fp32" else 0.0
    grads = n_params * 4
    buckets = grads if STRATEGY_TRAITS[shape.strategy].gradient_buckets and shape.tp == 1 else 0.0
    optimizer = n_params * 8
    world = shard_ranks(shape)
    if sharding_stage(shape) >= 1:
        optimizer /= world
    if sharding_stage(shape) >= 2:
        grads /= world
    if sharding_stage(shape) >= 3:
        weights, copies = (weights - rope_table_bytes(args)) / world + rope_table_bytes(args), copies / world
    return StateBytes(weights, copies, grads, buckets, optimizer)


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


@dataclass(frozen=True)
class LossBytes:
    """The loss's buffers (dlx.model.loss) in forward, at their largest, and what of them backward starts with."""

    forward: float
    kept: float


def loss_buffers(args: ModelArgs, shape: TrainingShape) -> LossBytes:
    """Without tensor parallelism: one chunk's logits (p) and, under autocast, their fp32 copy (4) and the gradient
    cast back to p bytes, per logit (in fp32 the log-softmax and the gradient are written over the logits; under
    autocast over the fp32 copy, or, on CUDA in fp16, into the fp32 tensor that log_softmax makes from the fp16 logits
    in one kernel: the same 4 bytes), and 37 bytes of per-token scalars per chunk token; per token the final norm's
    output (the hidden states, p·d), their gradient (p·d), the final norm's saved fp32 input (4d, and on CPU its
    composite kernel's fp32 product, 4d); and the output weight's fp32 gradient accumulator (4 · vocab · d). Backward
    starts with the gradients, the norm's input and the accumulator. With tensor parallelism the whole logits'
    vocabulary shards."""
    p = AUTOCAST_BYTES[shape.precision]
    tokens = shape.micro_batch * shape.seq_len
    if shape.tp > 1:  # vocab-parallel cross-entropy on the whole logits' shards
        whole = tokens * args.vocab_size * (p + 4 + 4) / shape.tp
        return LossBytes(whole, whole)
    chunk_tokens = min(tokens, max(1, CHUNK_LOGITS // args.vocab_size))
    chunk = chunk_tokens * args.vocab_size * (4 if p == 4 else p + 4 + p)
    # per chunk token: the clamped target (int64), the target's logit, the picked log-probability, the log-sum-exp, its
    # square, the masked cross-entropy, the row scale and the target's gradient term (fp32 each), the counted mask
    chunk += chunk_tokens * (8 + 7 * 4 + 1)
    norm_input = tokens * args.dim * (4 + (4 if shape.device_type == "cpu" else 0))
    accumulator = 4 * args.vocab_size * args.dim
    kept = tokens * args.dim * p + norm_input + accumulator
    return LossBytes(chunk + tokens * args.dim * p + kept, kept)


def loss_bytes(args: ModelArgs, shape: TrainingShape) -> float:
    """The loss's memory at its largest, in forward (`loss_buffers`)."""
    return loss_buffers(args, shape).forward


@dataclass(frozen=True)
class ActivationBytes:
    saved: float
    """Saved by forward for backward: every layer's activations, or the checkpointed layers' inputs."""
    recompute: float
    """One checkpointed layer's activations, made again in backward (0 without checkpointing)."""
    last_layer: float
    """What the first layer keeps (its activations, or its input when checkpointed): the least backward ends with."""


def activation_bytes(args: ModelArgs, shape: TrainingShape) -> ActivationBytes:
    """Full checkpointing keeps only each layer's fp32 input and recomputes one layer at a time; `selective`
    checkpoints every other layer (the even ones, as dlx.parallel.wrap does)."""
    tokens = shape.micro_batch * shape.seq_len
    per_layer = activation_bytes_per_token_per_layer(args, shape) * tokens
    layer_input = 4 * args.dim * tokens / shape.tp  # the residual stream is sequence-sharded under TP
    recompute = per_layer - layer_input  # the recomputed layer's first norm input is the input checkpointing kept
    if shape.activation_checkpointing == "full":
        return ActivationBytes(args.n_layers * layer_input, recompute, layer_input)
    if shape.activation_checkpointing == "selective":
        checkpointed = (args.n_layers + 1) // 2
        saved = checkpointed * layer_input + (args.n_layers - checkpointed) * per_layer
        return ActivationBytes(saved, recompute, layer_input)
    return ActivationBytes(args.n_layers * per_layer, 0.0, per_layer)


def phase_peaks(args: ModelArgs, shape: TrainingShape, state: StateBytes) -> dict[str, float]:
    """Bytes beyond the fp32 weights and the optimizer state at the peak of each phase of a step.

    In every phase but the optimizer's, the micro-batch's token ids and targets (int64, 16 bytes per token) and,
    under autocast, the sequence's RoPE rows in the compute dtype.
    forward: autocast's weight copies (cached for the forward, saved by each matmul for its backward), the saved
        activations and the loss at its chunk. Gradients were freed by the previous step's zero_grad (set to None):
        only DDP's buckets and, from the second micro-step of an accumulation, the gradients are there.
    backward: begins with the weight copies, the saved activations, the loss's kept buffers and one recomputed layer;
        layer by layer activations and copies are freed as gradients are made, so its largest point is at its start
        or at its end (every gradient with the first layer's activations and recomputation, or, tied, the
        embedding's dense gradient), and the fp32 gradient of the residual stream between layers. The loss's
        accumulator is the output weight's gradient: counted at the start, part of the gradients at the end.
    optimizer: the gradients (fused AdamW updates in place; clipping adds one scalar per parameter)."""
    acts, loss = activation_bytes(args, shape), loss_buffers(args, shape)
    grads, buckets = state.grads, state.buckets
    accumulated = grads if shape.grad_accum > 1 else 0.0
    tokens = shape.micro_batch * shape.seq_len
    residual_grad = 4 * args.dim * tokens / shape.tp  # fp32, handed from layer to layer
    batch = 16 * tokens  # the micro-batch's token ids and targets, int64
    if shape.precision != "fp32":  # the RoPE rows of this sequence, cast once per forward to the compute dtype
        batch += 2 * shape.seq_len * args.head_dim * AUTOCAST_BYTES[shape.precision]
    forward = batch + state.copies + acts.saved + loss.forward + accumulated + buckets
    start = batch + state.copies + acts.saved + acts.recompute + loss.kept + accumulated + buckets + residual_grad
    # At the end the embedding's backward: tied, its dense gradient is made whole, then added into the output's.
    tied = 4 * args.vocab_size * args.dim / shape.tp if args.tie_embeddings else 0.0
    end = batch + grads + buckets + residual_grad + max(acts.last_layer + acts.recompute, tied)
    return {"forward": forward, "backward": max(start, end), "optimizer": grads + buckets}


def plan_memory(args: ModelArgs, shape: TrainingShape) -> MemoryEstimate:
    n_params = ParamFormula(args).total
    state = _state_bytes(args, ParamFormula(args).per_tensor_parallel_rank(shape.tp), shape)
    local = rank_shape(shape)  # under context parallelism: the seq_len / cp tokens this rank holds
    phases = add_context_parallel_bytes(args, shape, phase_peaks(args, local, state))
    peak_phase = max(phases, key=phases.get)
    acts = activation_bytes(args, local)
    return MemoryEstimate(
        params=n_params,
        weights_gb=(state.weights + state.copies) / GB,
        grads_gb=(state.grads + state.buckets) / GB,
        optimizer_gb=state.optimizer / GB,
        activations_gb=(acts.saved + acts.recompute + gathered_kv_bytes(args, shape).saved) / GB,
        logits_gb=loss_bytes(args, local) / GB,
        flops_per_token=training_flops_per_token(args, shape.seq_len),
        tokens_per_step=shape.micro_batch * shape.seq_len * shape.grad_accum * shape.replicas,
        total_gb=(state.weights + state.optimizer + phases[peak_phase]) / GB,
        peak_phase=peak_phase,
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


def _check_context_and_replicas(shape: TrainingShape) -> None:
    if shape.cp < 1 or shape.dp % shape.cp:
        raise UserError(f"--cp {shape.cp} must divide the {shape.dp} data-parallel ranks (world size ÷ tp)")
    if shape.seq_len % (2 * shape.cp):
        raise UserError(f"--seq-len {shape.seq_len} must split into 2 × cp = {2 * shape.cp} equal chunks")
    if shape.dp_replicate < 1 or shape.dp % shape.dp_replicate:
        raise UserError(f"--dp-replicate {shape.dp_replicate} must divide the {shape.dp} data-parallel ranks")
    if shape.dp_replicate > 1 and shape.strategy != "hsdp":
        raise UserError("--dp-replicate applies to --strategy hsdp only")


def shard_ranks(shape: TrainingShape) -> int:
    """The ranks a sharding strategy divides the state over: every data-parallel rank, or under hsdp one replica's
    dp / dp_replicate of them."""
    return shape.dp // shape.dp_replicate if shape.strategy == "hsdp" else shape.dp


def rank_shape(shape: TrainingShape) -> TrainingShape:
    """The shape one rank's activations and loss see: under context parallelism, seq_len / cp tokens of each
    sequence (the attention over the whole sequence is added by `gathered_kv_bytes`)."""
    return replace(shape, seq_len=shape.seq_len // shape.cp, cp=1, attention_matrix=False) if shape.cp > 1 else shape


@dataclass(frozen=True)
class GatheredBytes:
    saved: float
    """The other ranks' keys and values that attention saves for backward, over the layers that keep them."""
    mask: float
    """The boolean mask of this rank's queries against every key, (B, T / cp, T), shared by the layers."""
    scores: float
    """Where the kernel stores the score matrix (attention_matrix): its whole T-wide rows, over the layers."""


def gathered_kv_bytes(args: ModelArgs, shape: TrainingShape) -> GatheredBytes:
    """What context parallelism adds to a rank's activations (`dlx.parallel.context`): per layer the gathered keys
    and values beyond its own, B · T · (1 − 1/cp) tokens × 2 (k, v) × width × p, width = n_kv_heads · head_dim, or
    dim on CUDA where they are repeated for a masked kernel; only the layers whose activations are kept (under full
    checkpointing the one recomputed). Zero at cp 1 (nothing is gathered)."""
    if shape.cp == 1:
        return GatheredBytes(0.0, 0.0, 0.0)
    p = AUTOCAST_BYTES[shape.precision]
    width = args.dim if shape.device_type == "cuda" and args.kv_heads < args.n_heads else args.kv_heads * args.head_dim
    others = shape.micro_batch * shape.seq_len * (1 - 1 / shape.cp)
    layers = {"none": args.n_layers, "full": 1, "selective": args.n_layers // 2 + 1}[shape.activation_checkpointing]
    local_tokens = shape.micro_batch * shape.seq_len // shape.cp
    scores = p * args.n_heads * shape.seq_len * local_tokens * layers if shape.attention_matrix else 0.0
    return GatheredBytes(2 * p * width * others * layers / shape.tp, local_tokens * shape.seq_len, scores / shape.tp)


def add_context_parallel_bytes(args: ModelArgs, shape: TrainingShape, phases: dict[str, float]) -> dict[str, float]:
    """The phases' peaks with the gathered keys and values, the mask and any stored scores added to forward and
    backward."""
    extra = gathered_kv_bytes(args, shape)
    added = extra.saved + extra.mask + extra.scores
    return {name: value + (added if name != "optimizer" else 0.0) for name, value in phases.items()}
