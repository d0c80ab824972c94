"""AdamW with decay / no-decay parameter groups, and the learning-rate schedules: warm-up then cosine, linear or
constant (`LRSchedule`), or warm-up, stable, decay (`WSDSchedule`), stepped by `ScheduledLR`."""

from __future__ import annotations

import math

import torch
from torch import nn

from dlx.train.config import TrainSection


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Decay the matmul weights only. Norm gains (1-D) and the token embedding are left alone: decaying a gain pulls it
    towards 0 rather than towards "no effect", and rare tokens' embedding rows would shrink between their updates."""
    decay, no_decay = [], []
    for name, param in model.named_parameters():  # a tied output projection is yielded once, as the embedding
        if not param.requires_grad:
            continue
        if param.ndim < 2 or "tok_embeddings" in name:
            no_decay.append(param)
        else:
            decay.append(param)
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]


def build_optimizer(model: nn.Module, cfg: TrainSection, device: torch.device) -> torch.optim.Optimizer:
    """AdamW, fused (one kernel for every parameter) on CUDA and CPU, where PyTorch has that implementation; or plain
    SGD, whose update is linear in the gradient (float noise stays small: the way to compare parallel layouts)."""
    groups = param_groups(model, cfg.weight_decay)
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(groups, lr=cfg.lr)
    fused = device.type in ("cuda", "cpu")
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=cfg.betas, eps=cfg.eps, fused=fused or None)


class LRSchedule:
    """Multiplier of the peak lr at optimizer step `step` (0-based): linear warm-up from 0, then cosine or linear decay
    to min_lr at the last step, or constant. A plain object (not a lambda) so that its state pickles as plain data.

    The decay is a segment [start, start_progress, end], as in `WSDSchedule`: a fresh run plans [warmup_steps, 0,
    total - 1]. Resumed with another length, `continue_from` goes on from the progress the last step taken had
    reached, stretched (or squeezed) to end at the new last step: the lr never jumps. Warm-up keeps its length."""

    def __init__(self, cfg: TrainSection, total_steps: int):
        self.kind = cfg.schedule
        self.total_steps = total_steps
        self.warmup_steps = int(cfg.warmup_ratio * total_steps)
        self.min_ratio = cfg.min_lr / cfg.lr
        self.decay = [self.warmup_steps, 0.0, total_steps - 1]

    def progress(self, step: int) -> float:
        start, start_progress, end = self.decay
        if step <= start:
            return start_progress
        return min(1.0, start_progress + (1.0 - start_progress) * (step - start) / max(1, end - start))

    def __call__(self, step: int) -> float:
        if step < self.warmup_steps:
            return (step + 1) / self.warmup_steps
        if self.kind == "constant":
            return 1.0
        progress = self.progress(step)
        shape = 0.5 * (1.0 + math.cos(math.pi * progress)) if self.kind == "cosine" else 1.0 - progress
        return self.min_ratio + (1.0 - self.min_ratio) * shape

    def state(self) -> dict:
        return {"total_steps": self.total_steps, "warmup_steps": self.warmup_steps, "decay": list(self.decay)}

    def continue_from(self, saved: dict, steps_done: int) -> str | None:
        """Adopt a saved plan at a resume after `steps_done` steps; re-plan it (and say how) if the run's length
        changed. The lr of the last step taken, multiplier(steps_done - 1), is unchanged either way."""
        self.warmup_steps = int(saved["warmup_steps"])
        self.decay = [int(saved["decay"][0]), float(saved["decay"][1]), int(saved["decay"][2])]
        if saved["total_steps"] == self.total_steps or self.kind == "constant":
            return None
        change = f"train.schedule {self.kind}: {saved['total_steps']:,} → {self.total_steps:,} steps"
        last_taken = steps_done - 1
        if last_taken < self.warmup_steps:
            self.decay = [self.warmup_steps, 0.0, self.total_steps - 1]
            return f"{change} at step {steps_done:,}; after the warm-up the decay runs to min_lr at step " + (
                f"{self.total_steps:,}"
            )
        reached = self.progress(last_taken)
        self.decay = [last_taken, reached, self.total_steps - 1]
        return (
            f"{change} at step {steps_done:,}; the decay continues from where it was ({reached:.0%} through) to "
            f"min_lr at step {self.total_steps:,}"
        )


DECAY_SHAPES = {
    "linear": lambda progress: 1.0 - progress,
    "cosine": lambda progress: 0.5 * (1.0 + math.cos(math.pi * progress)),
    "1-sqrt": lambda progress: 1.0 - math.sqrt(progress),
}
"""WSD decay shapes: the share of (lr - min_lr) left at a progress in [0, 1] through the decay."""


class WSDSchedule:
    """Warm-up, stable, decay: linear warm-up from 0, the peak lr held, then a decay to min_lr over the last
    `decay_ratio` of the steps, shaped linear, cosine or 1-sqrt (`DECAY_SHAPES`).

    The decay is a segment [start, start_progress, end]: after step `start` the progress runs from `start_progress` to 1
    at step `end` (the last step), and the multiplier is min + (1 - min) · shape(progress). A fresh run plans
    [last stable step, 0, total - 1]. Resumed with another length (train.max_steps or train.epochs) or another
    train.decay_ratio, `continue_from` re-plans it without a jump in the lr:
      - decay not begun: the stable phase is extended (or shortened) and the decay placed at the end of the new length,
        never before the resumed step;
      - decay begun: it goes on from the progress it had reached, stretched (or squeezed) to end at the new last step,
        so the lr keeps falling and never rises again.
    Warm-up keeps the length the run started with. The plan is part of the scheduler's state (`ScheduledLR`).
    """

    def __init__(self, cfg: TrainSection, total_steps: int):
        self.shape = DECAY_SHAPES[cfg.decay_shape]
        self.total_steps = total_steps
        self.decay_ratio = cfg.decay_ratio
        self.min_ratio = cfg.min_lr / cfg.lr
        self.warmup_steps = int(cfg.warmup_ratio * total_steps)
        self.decay = self.planned_decay(first_step=0)

    def planned_decay(self, first_step: int) -> list:
        """[start, 0.0, end]: the decay over the last decay_ratio of the steps, starting no earlier than first_step."""
        decay_steps = round(self.decay_ratio * self.total_steps)
        first_decay_step = max(self.warmup_steps, self.total_steps - decay_steps, first_step)
        return [first_decay_step - 1, 0.0, self.total_steps - 1]

    def progress(self, step: int) -> float:
        start, start_progress, end = self.decay
        if step <= start:
            return start_progress
        if end <= start:
            return 1.0
        return min(1.0, start_progress + (1.0 - start_progress) * (step - start) / (end - start))

    def __call__(self, step: int) -> float:
        if step < self.warmup_steps:
            return (step + 1) / self.warmup_steps
        return self.min_ratio + (1.0 - self.min_ratio) * self.shape(self.progress(step))

    def state(self) -> dict:
        return {
            "total_steps": self.total_steps,
            "decay_ratio": self.decay_ratio,
            "warmup_steps": self.warmup_steps,
            "decay": list(self.decay),
        }

    def continue_from(self, saved: dict, steps_done: int) -> str | None:
        """Adopt a saved plan at a resume after `steps_done` steps; re-plan it (and say how) if the run's length or
        decay_ratio changed. The lr of the last step taken, multiplier(steps_done - 1), is unchanged either way."""
        self.warmup_steps = int(saved["warmup_steps"])
        self.decay = [int(saved["decay"][0]), float(saved["decay"][1]), int(saved["decay"][2])]
        if saved["total_steps"] == self.total_steps and saved["decay_ratio"] == self.decay_ratio:
            return None
        change = f"train.schedule wsd: {saved['total_steps']:,} → {self.total_steps:,} steps"
        last_taken = steps_done - 1
        reached = self.progress(last_taken)
        if reached == 0.0:
            self.decay = self.planned_decay(first_step=steps_done)
            return f"{change} at step {steps_done:,}; the decay has not begun: it runs over steps " + (
                f"{self.decay[0] + 2:,}-{self.total_steps:,}" if self.decay[0] + 1 < self.total_steps else "none"
            )
        self.decay = [last_taken, reached, self.total_steps - 1]
        return (
            f"{change} at step {steps_done:,}; the decay had begun ({reached:.0%} through): it continues from there "
            f"to min_lr at step {self.total_steps:,}"
        )


class ScheduledLR(torch.optim.lr_scheduler.LambdaLR):
    """LambdaLR whose state also holds the schedule's decay plan (`plan`), so that a resumed run continues its decay
    as planned, or re-plans it when the run's length changed (`continue_from`; `resume_note` says what happened)."""

    def __init__(self, optimizer: torch.optim.Optimizer, schedule: LRSchedule | WSDSchedule):
        self.plan = schedule.state()
        self.resume_note: str | None = None
        super().__init__(optimizer, schedule)

    def load_state_dict(self, state_dict: dict) -> None:
        state_dict = dict(state_dict)
        saved = state_dict.pop("plan", None) or state_dict.pop("wsd", None)  # "wsd": checkpoints before cosine had one
        super().load_state_dict(state_dict)
        schedule = self.lr_lambdas[0]
        self.resume_note = schedule.continue_from(saved, self.last_epoch) if _fits(saved, schedule) else None
        self.plan = schedule.state()
        lrs = [base * schedule(self.last_epoch) for base in self.base_lrs]  # the next step's, as re-planned
        for group, lr in zip(self.optimizer.param_groups, lrs, strict=True):
            group["lr"] = lr
        self._last_lr = lrs

    def scale_last_lr(self, factor: float) -> None:
        """Scale the learning rate set for the next step (and what get_last_lr reports) by `factor` (a spike
        rollback's re-warm-up); the next `step` sets the schedule's own again."""
        lrs = [lr * factor for lr in self.get_last_lr()]
        for group, lr in zip(self.optimizer.param_groups, lrs, strict=True):
            group["lr"] = lr
        self._last_lr = lrs


def _fits(saved: dict | None, schedule: LRSchedule | WSDSchedule) -> bool:
    """Whether a saved plan belongs to this kind of schedule (a run may switch train.schedule at a resume)."""
    return saved is not None and ("decay_ratio" in saved) == isinstance(schedule, WSDSchedule)


def build_scheduler(optimizer: torch.optim.Optimizer, cfg: TrainSection, total_steps: int) -> ScheduledLR:
    schedule = WSDSchedule(cfg, total_steps) if cfg.schedule == "wsd" else LRSchedule(cfg, total_steps)
    return ScheduledLR(optimizer, schedule)
