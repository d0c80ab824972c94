"""What torchtitan needs to run a dense Llama here, set up by the harness without editing torchtitan.

`prepare_imports` must run before the first torchtitan import. On a machine without CUDA it points torchtitan at the
CPU (`torchtitan.tools.utils.device_type` is "cuda" whenever no accelerator is found, so `Trainer.__init__` calls
`torch.cuda.set_device`; its metrics' CUDA memory monitor is replaced by `HostMemoryMonitor`), and it stands in for
three imports the dense Llama path never calls, where they are missing: `triton` (imported by torchtitan's MoE
expert-parallel kernels at module level), `datasets` (Hugging Face Datasets, imported by its text-dataset module,
which `trainer.py` imports) and `tensorboard` (imported by its metrics module). Each stand-in raises on use with a
line naming what is missing.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.machinery
import importlib.util
import os
import socket
import sys
import types
from collections.abc import Iterator

import torch

EP_KERNELS = (
    *("copy_full_counts_to_peers_kernel", "copy_rows_to_peers_kernel", "expand_topk_grad_kernel"),
    *("fill_combine_metadata_kernel", "fill_dispatch_metadata_kernel", "invert_flat_indices_kernel"),
    *("reduce_topk_slots_kernel", "topk_scores_grad_kernel"),
)
"""What torchtitan.distributed.minimal_async_ep.api imports from its Triton kernels module."""


def _missing(what: str, why: str):
    def refuse(*args, **kwargs):
        raise RuntimeError(f"{what} is not installed here ({why}); the torchtitan harness does not use it")

    return refuse


def _stand_in(name: str, why: str, **attributes) -> types.ModuleType:
    """A module registered under `name` whose attributes raise when called."""
    module = types.ModuleType(name)
    module.__spec__ = importlib.machinery.ModuleSpec(name, None)
    for attribute, value in attributes.items():
        setattr(module, attribute, value if value is not None else _missing(f"{name}.{attribute}", why))
    sys.modules[name] = module
    return module


@functools.cache
def prepare_imports() -> tuple[str, ...]:
    """Make torchtitan importable for a dense Llama run on this machine (once per process); returns what was stood
    in or patched."""
    done = []
    if importlib.util.find_spec("triton") is None:
        why = "torchtitan's MoE expert-parallel kernels need Triton"
        _stand_in("torchtitan.distributed.minimal_async_ep.kernels", why, **dict.fromkeys(EP_KERNELS))
        done.append("triton (MoE expert-parallel kernels)")
    if importlib.util.find_spec("datasets") is None:
        why = "Hugging Face Datasets, for torchtitan's text datasets"
        _stand_in("datasets", why, Dataset=type("Dataset", (), {}), load_dataset=None)
        _stand_in("datasets.distributed", why, split_dataset_by_node=None)
        done.append("datasets (Hugging Face Datasets loader)")
    if importlib.util.find_spec("tensorboard") is None:
        _stand_in("torch.utils.tensorboard", "TensorBoard, for torchtitan's metrics", SummaryWriter=None)
        done.append("tensorboard (metrics writer)")
    if not torch.cuda.is_available():
        from torchtitan.tools import utils

        utils.device_type, utils.device_module = "cpu", torch.cpu
        from torchtitan.components import metrics

        metrics.build_device_memory_monitor = lambda: HostMemoryMonitor(metrics.DeviceMemStats)
        done.append('device_type "cuda" -> "cpu", and a host memory monitor for its CUDA one')
    return tuple(done)


class HostMemoryMonitor:
    """What torchtitan's metrics read from its `DeviceMemoryMonitor` (CUDA allocator statistics), on the host: the
    process's resident-set high-water mark as both the active and the reserved peak."""

    def __init__(self, stats_type: type) -> None:
        import psutil

        self.stats_type, self.device_name = stats_type, "cpu"
        self.device_capacity = psutil.virtual_memory().total
        self.device_capacity_gib = self.device_capacity / 2**30

    def get_peak_stats(self):
        import resource

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB
        gib, pct = peak / 2**30, 100 * peak / self.device_capacity
        return self.stats_type(gib, pct, gib, pct, 0, 0)

    def reset_peak_stats(self) -> None:
        pass  # the kernel's high-water mark cannot be reset


@contextlib.contextmanager
def single_process_env() -> Iterator[None]:
    """The rendezvous variables torchrun would set for one process, while torchtitan initializes its process group;
    the environment as it was afterwards."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    wanted = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    saved = {key: os.environ.get(key) for key in wanted}
    os.environ.update({key: value for key, value in wanted.items() if saved[key] is None})
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
