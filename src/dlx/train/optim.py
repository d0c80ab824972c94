"""AdamW with decay / no-decay parameter groups, and the learning-rate schedule."""

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
    to min_lr at the last step, or constant. A plain object (not a lambda) so that its state pickles as plain data."""

    def __init__(self, cfg: TrainSection, total_steps: int):
        self.kind = cfg.schedule
        self.total_steps = total_steps
        self.warmup_steps = int(cfg.warmup_ratio * total_steps)
        self.min_ratio = cfg.min_lr / cfg.lr

    def __call__(self, step: int) -> float:
        if step < self.warmup_steps:
            return (step + 1) / self.warmup_steps
        if self.kind == "constant":
            return 1.0
        decay_steps = max(1, self.total_steps - 1 - self.warmup_steps)
        progress = min(1.0, (step - self.warmup_steps) / decay_steps)
        shape = 0.5 * (1.0 + math.cos(math.pi * progress)) if self.kind == "cosine" else 1.0 - progress
        return self.min_ratio + (1.0 - self.min_ratio) * shape


def build_scheduler(
    optimizer: torch.optim.Optimizer, cfg: TrainSection, total_steps: int
) -> torch.optim.lr_scheduler.LambdaLR:
    return torch.optim.lr_scheduler.LambdaLR(optimizer, LRSchedule(cfg, total_steps))
