"""One optimizer step's micro-steps: `grad_accum` times (wait for data, forward, backward), each phase a named span of
the PhaseTimer. The loop (`dlx.train.loop.trainer.train_loop`) and `dlx bench` (`dlx.bench.measure`) step through this
one function, so a benchmark measures the real step."""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import nn

from dlx.metrics.timing import PhaseTimer
from dlx.parallel.strategy import Strategy
from dlx.precision import Precision
from dlx.train.build.objective import PLAIN, Objective, training_loss


def accumulate_gradients(
    model: nn.Module,
    batches: Iterator,
    accum: int,
    precision: Precision,
    timer: PhaseTimer,
    strategy: Strategy,
    objective: Objective = PLAIN,
) -> torch.Tensor:
    """`accum` micro-steps; returns the step's mean loss (detached). Each micro-loss is divided by `accum`, so the
    summed gradients equal those of one batch `accum` times larger (the micro-batches have equal sizes). Under DDP
    and FSDP, gradients are synchronised only in the last micro-step's backward (`strategy.gradient_sync`).
    `objective`: document ids for the model, the z-loss weight, and the z-loss term's record
    (dlx.train.build.objective)."""
    total = None
    for index in range(accum):
        last = index == accum - 1
        with timer.phase("data_wait"):
            inputs, targets = next(batches)
        with strategy.gradient_sync(last):
            with timer.phase("forward"), precision.autocast():
                extra = objective.model_inputs(inputs)  # document ids, when data.document_mask is on
                parts = training_loss(strategy, model, inputs, targets, objective.z_loss_weight, **extra)
                objective.record_z_loss(parts, accum)  # logged apart, when train.z_loss > 0
            with timer.phase("backward"):
                strategy.backward(parts.loss / accum, last)  # cross-entropy + train.z_loss × z-loss
        loss = parts.cross_entropy / accum  # what is logged and checked: the cross-entropy alone
        total = loss if total is None else total + loss
    return total
