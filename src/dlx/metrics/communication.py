"""Bytes each rank sends per optimizer step, by what sends them: context parallelism's key/value all-gathers and
their reduce-scattered gradients, FSDP/HSDP's weight gathers and gradient reduce-scatters, HSDP's all-reduce across
replicas, DDP's all-reduce. `dlx plan` prints them; benchmarks/bench_context_parallel.py counts the cp collectives'
bytes on gloo ranks against `cp_communication_bytes`."""

from __future__ import annotations

from dataclasses import dataclass

from dlx.metrics.estimate import AUTOCAST_BYTES, TrainingShape, shard_ranks, sharding_stage
from dlx.model.args import ModelArgs
from dlx.model.stats import ParamFormula


@dataclass(frozen=True)
class Communication:
    """Bytes one rank sends per optimizer step, by what sends them (ring collectives: an all-gather or a
    reduce-scatter of N bytes over g ranks sends N · (g − 1) / g per rank, an all-reduce twice that)."""

    context_parallel: float
    """Keys and values all-gathered in forward (again in a checkpointed layer's recomputation) and their gradients
    reduce-scattered in backward, every layer, every micro-step."""
    sharding: float
    """FSDP/HSDP within a shard group: weights all-gathered in forward and again in backward (p bytes each),
    gradients reduce-scattered in fp32; DDP: the fp32 gradient all-reduce."""
    replication: float
    """hsdp: the sharded fp32 gradients all-reduced across the dp_replicate replicas."""

    @property
    def total(self) -> float:
        return self.context_parallel + self.sharding + self.replication


def cp_communication_bytes(args: ModelArgs, shape: TrainingShape) -> float:
    """2 (k, v) × n_layers × (B · T · n_kv_heads · head_dim / tp · p) × (cp − 1)/cp, once for the gather, once for
    the gradients' reduce-scatter, once more for the recomputation under full or selective checkpointing (of the
    layers it recomputes), times grad_accum."""
    if shape.cp == 1:
        return 0.0
    p = AUTOCAST_BYTES[shape.precision]
    gathered = shape.micro_batch * shape.seq_len * args.kv_heads * args.head_dim * p / shape.tp
    recomputed = {"none": 0, "full": args.n_layers, "selective": (args.n_layers + 1) // 2}
    gathers = 2 * (2 * args.n_layers + recomputed[shape.activation_checkpointing])  # k and v
    return gathers * gathered * (shape.cp - 1) / shape.cp * shape.grad_accum


def communication_bytes(args: ModelArgs, shape: TrainingShape) -> Communication:
    """Per rank and optimizer step (gradient sync once per step: the accumulation's micro-steps do not sync; FSDP
    gathers the weights every micro-step). Not counted: the per-step loss all-reduce, tensor parallelism's
    activation collectives."""
    params = ParamFormula(args).per_tensor_parallel_rank(shape.tp)
    p = AUTOCAST_BYTES[shape.precision]
    stage, group = sharding_stage(shape), shard_ranks(shape)
    ring = (group - 1) / group
    if shape.strategy in ("fsdp", "hsdp"):
        sharding = (2 * p * shape.grad_accum + 4) * params * ring  # two weight gathers per micro-step, one grad RS
    elif shape.dp > 1 and stage == 0 and shape.strategy != "none":
        sharding = 2 * 4 * params * ring  # DDP's fp32 all-reduce
    else:
        sharding = 0.0
    replicas = shape.dp_replicate if shape.strategy == "hsdp" else 1
    replication = 2 * 4 * params / group * (replicas - 1) / replicas
    return Communication(cp_communication_bytes(args, shape), sharding, replication)
