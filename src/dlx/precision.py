"""Compute precision: which one `auto` means here, the autocast context, and the fp16 loss scaler."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from dlx import device as dev


def resolve_precision(name: str, device: torch.device) -> str:
    """`auto` is bf16 where the device runs it natively (it trains as well as fp32 with fp32 master weights and is
    about twice as fast there), else fp32. fp16 is only ever chosen explicitly: it needs loss scaling."""
    if name == "auto":
        return "bf16" if dev.supports_native_bf16(device) else "fp32"
    return name


@dataclass
class Precision:
    name: str
    """bf16, fp16 or fp32."""
    device: torch.device
    scaler: torch.amp.GradScaler | None
    """Only for fp16: scales the loss so that small gradients do not underflow, and skips steps with inf/NaN grads."""
    engine_managed: bool = False
    """DeepSpeed casts the weights and scales the loss itself: no autocast, no scaler here."""

    def autocast(self) -> contextlib.AbstractContextManager:
        if self.engine_managed:
            return contextlib.nullcontext()
        return dev.autocast(self.device, self.name)

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        return self.scaler.scale(loss) if self.scaler is not None else loss

    def unscale_(self, optimizer: torch.optim.Optimizer) -> None:
        """Bring gradients back to their true size before clipping (a no-op without a scaler)."""
        if self.scaler is not None:
            self.scaler.unscale_(optimizer)

    def step(self, optimizer: torch.optim.Optimizer) -> None:
        if self.scaler is not None:
            self.scaler.step(optimizer)
            self.scaler.update()
        else:
            optimizer.step()


def build_precision(name: str, device: torch.device, engine_managed: bool = False) -> Precision:
    resolved = resolve_precision(name, device)
    scaler = torch.amp.GradScaler(device.type) if resolved == "fp16" and not engine_managed else None
    return Precision(resolved, device, scaler, engine_managed)
