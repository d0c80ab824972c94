"""The step plan: the run's sizes (`StepPlan`: batch, accumulation, steps) and the start-up header that prints them,
in HF Trainer's words.

HF Trainer's arithmetic (for example 16,527,707 examples × 3 epochs / 8 = 6,197,892 steps, as HF Trainer prints it):
an example is one training window of seq_len + 1 tokens; total batch = micro-batch × accumulation × world size; steps
per epoch = ⌊micro-batches per rank per epoch / accumulation⌋; total steps = ⌈epochs × steps per epoch⌉, unless
train.max_steps is set.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from dlx.errors import UserError
from dlx.train.config import RunConfig


@dataclass(frozen=True)
class StageShape:
    """A stage's batch shape (data.stages, `dlx.train.build.stages`), through its last step."""

    last_step: int
    seq_len: int
    micro_batch_size: int
    grad_accum: int


@dataclass(frozen=True)
class StepPlan:
    examples: int | None
    """Training windows per epoch, all ranks together; None for synthetic data (unbounded)."""
    micro_batch_size: int
    grad_accum: int
    world_size: int
    seq_len: int
    total_steps: int
    """Optimizer steps the run will take."""
    tp: int = 1
    """Tensor-parallel ranks per replica: the devices are world_size × tp (world_size counts the replicas)."""
    stages: tuple[StageShape, ...] = ()
    """With data.stages: each stage's shape (the fields above are the first stage's); the tokens per step are equal."""

    def shape_at(self, step: int) -> StageShape:
        """The batch shape of optimizer step `step`."""
        for stage in self.stages:
            if step <= stage.last_step:
                return stage
        last = self.stages[-1] if self.stages else None
        return last or StageShape(self.total_steps, self.seq_len, self.micro_batch_size, self.grad_accum)

    def grad_accum_at(self, step: int) -> int:
        """Micro-batches accumulated in optimizer step `step`."""
        return self.shape_at(step).grad_accum

    @property
    def total_batch(self) -> int:
        """Sequences per optimizer step: micro-batch × accumulation × world size."""
        return self.micro_batch_size * self.grad_accum * self.world_size

    @property
    def tokens_per_step(self) -> int:
        return self.total_batch * self.seq_len

    @property
    def epochs(self) -> float | None:
        if not self.examples:
            return None
        return self.total_steps * self.total_batch / self.examples


def plan_steps(
    config: RunConfig,
    batches_per_epoch: int | None,
    windows_per_epoch: int | None,
    world_size: int,
    tp: int = 1,
    stages: tuple[StageShape, ...] = (),
) -> StepPlan:
    """How many optimizer steps the run takes: train.max_steps, or epochs × steps per epoch. `world_size`: the
    data-parallel replicas (ranks ÷ tp), which read different batches. `stages`: data.stages' shapes."""
    train = config.train
    grad_accum = resolve_grad_accum(config, world_size)
    total = train.max_steps
    if total is None:
        steps_per_epoch = (batches_per_epoch or 0) // grad_accum
        if steps_per_epoch == 0:
            raise UserError(
                f"the training split has {batches_per_epoch} micro-batches per epoch and rank, fewer than "
                f"train.grad_accum ({grad_accum}): lower train.grad_accum or data.micro_batch_size, or prepare "
                "more data"
            ).alike_on_every_rank()
        total = max(1, math.ceil(train.epochs * steps_per_epoch))
    if stages:
        first = stages[0]
        return StepPlan(None, first.micro_batch_size, first.grad_accum, world_size, first.seq_len, total, tp, stages)
    micro = config.data.micro_batch_size
    return StepPlan(windows_per_epoch, micro, grad_accum, world_size, config.data.seq_len, total, tp)


def resolve_grad_accum(config: RunConfig, world_size: int) -> int:
    """train.grad_accum, or global_batch_size / (micro_batch_size × world size), which must divide exactly."""
    global_batch, micro = config.train.global_batch_size, config.data.micro_batch_size
    if global_batch is None:
        return config.train.grad_accum
    per_step = micro * world_size
    if global_batch % per_step:
        raise UserError(
            f"train.global_batch_size {global_batch} is not a multiple of data.micro_batch_size × world size = "
            f"{micro} × {world_size} = {per_step}; pick a global batch that is, or another micro-batch or rank count"
        ).alike_on_every_rank()
    return global_batch // per_step


def header_lines(plan: StepPlan, trainable: int, precision: str, device_name: str) -> list[str]:
    """HF Trainer's 'Running training' block, then what dlx adds (tokens, precision, device)."""
    unbounded = "per stage (data.stages)" if plan.stages else "synthetic data"
    examples = f"{plan.examples:,}" if plan.examples else f"unbounded ({unbounded})"
    epochs = f"{plan.epochs:,.4g}" if plan.epochs is not None else f"n/a ({unbounded})"
    return [
        "***** Running training *****",
        f"  Num examples = {examples}",
        f"  Num Epochs = {epochs}",
        f"  Instantaneous batch size per device = {plan.micro_batch_size:,}",
        f"  Total train batch size (w. parallel, distributed & accumulation) = {plan.total_batch:,}",
        f"  Gradient Accumulation steps = {plan.grad_accum:,}",
        f"  Total optimization steps = {plan.total_steps:,}",
        f"  Number of trainable parameters = {trainable:,}",
        f"  Sequence length = {plan.seq_len:,}; tokens per step = {plan.tokens_per_step:,}; "
        f"total tokens = {plan.tokens_per_step * plan.total_steps:,}",
        f"  Precision = {precision}; device = {device_name}; world size = {plan.world_size * plan.tp}"
        + (f" ({plan.world_size} data-parallel × {plan.tp} tensor-parallel)" if plan.tp > 1 else ""),
    ]
