"""Host batch → tensors on the training device. The one place that knows about CUDA.

On CPU the batch is copied out of the shared slot into a fresh tensor (the slot goes back to the worker at once, and the
trainer may keep the tensor as long as it likes). On CUDA it goes through a small ring of pinned staging buffers and a
non-blocking copy on the current stream, so the host-to-device transfer overlaps with the GPU's work; an event per
staging buffer makes sure a buffer is not overwritten while its copy is still in flight.
"""

from __future__ import annotations

import numpy as np
import torch

STAGING_BUFFERS = 2


class CpuTransfer:
    def __call__(self, host: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        batch = torch.from_numpy(host).clone()  # (2, B, seq_len)
        return batch[0], batch[1]


class CudaTransfer:
    def __init__(self, device: torch.device, shape: tuple[int, ...]):
        self.device = device
        self._staging = [torch.empty(shape, dtype=torch.int64, pin_memory=True) for _ in range(STAGING_BUFFERS)]
        self._copied: list[torch.cuda.Event | None] = [None] * STAGING_BUFFERS
        self._next = 0

    def __call__(self, host: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        i, self._next = self._next, (self._next + 1) % STAGING_BUFFERS
        if self._copied[i] is not None:
            self._copied[i].synchronize()
        self._staging[i].copy_(torch.from_numpy(host))
        batch = self._staging[i].to(self.device, non_blocking=True)
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(self.device))
        self._copied[i] = event
        return batch[0], batch[1]


def make_transfer(device: torch.device, shape: tuple[int, ...]) -> CpuTransfer | CudaTransfer:
    """Pinned memory and asynchronous copies on CUDA; plain tensors (moved with `.to`) elsewhere."""
    if device.type == "cuda":
        return CudaTransfer(device, shape)
    if device.type == "cpu":
        return CpuTransfer()
    return _OtherDeviceTransfer(device)


class _OtherDeviceTransfer:
    def __init__(self, device: torch.device):
        self.device = device

    def __call__(self, host: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        batch = torch.from_numpy(host).to(self.device)
        return batch[0], batch[1]
