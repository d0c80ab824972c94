"""The process group under torchrun: who am I, set-up, decisions rank 0 takes for all, metric reduction, teardown.

torch 2.13 ranks can abort at exit unless they meet at a barrier and destroy the process group before the interpreter
shuts down; `teardown` does both, and is safe to call when no group exists.
"""

from __future__ import annotations

import datetime
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, TypeVar

import torch
import torch.distributed as dist

from dlx.errors import UserError

T = TypeVar("T")
_STORE: dist.Store | None = None


@dataclass(frozen=True)
class DistEnv:
    """This rank's place. The ranks form a (dp, cp, tp) grid, row-major: the cp·tp ranks dp_rank·cp·tp … hold one
    model replica (split by tensor parallelism) and read the same batches, each cp rank its part of every sequence."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    tp: int = 1
    """Tensor-parallel ranks per model replica (parallel.tp)."""
    cp: int = 1
    """Context-parallel ranks per model replica (parallel.cp)."""

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def is_distributed(self) -> bool:
        return self.world_size > 1

    @property
    def dp_size(self) -> int:
        """Model replicas, each reading its own share of the data."""
        return self.world_size // (self.tp * self.cp)

    @property
    def dp_rank(self) -> int:
        return self.rank // (self.tp * self.cp)

    @property
    def cp_rank(self) -> int:
        """Which part of every sequence this rank holds (0 … cp - 1)."""
        return self.rank // self.tp % self.cp


GROUP_OF_ONE_KEYS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
_GROUP_OF_ONE_ENV: dict[str, str | None] = {}
"""The values those variables had before a group of one set them (restored when it is destroyed)."""


def launched_by_torchrun() -> bool:
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def env_from_torchrun() -> DistEnv:
    if not launched_by_torchrun():
        return DistEnv()
    return DistEnv(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ.get("LOCAL_RANK", 0)))


def init_distributed(device: torch.device, needs_group: bool, timeout_s: float, tp: int = 1, cp: int = 1) -> DistEnv:
    """Join the torchrun group (NCCL on CUDA, gloo on CPU). `needs_group`: FSDP and DeepSpeed need a process group
    even in a single plain process; that one gets a group of one rank on a free local port. `tp`, `cp`: parallel.tp
    and parallel.cp."""
    env = replace(env_from_torchrun(), tp=tp, cp=cp)
    if dist.is_initialized() or not (env.is_distributed or needs_group):
        return env
    if not launched_by_torchrun():  # a group of one: torchrun's variables for it, until `destroy_group`
        _GROUP_OF_ONE_ENV.update({key: os.environ.get(key) for key in GROUP_OF_ONE_KEYS})
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1")
        os.environ["MASTER_PORT"] = "0"  # the store binds a free port itself, then says which (no race)
    backend = "nccl" if device.type == "cuda" else "gloo"
    kwargs = {"device_id": device} if device.type == "cuda" else {}
    timeout = datetime.timedelta(seconds=timeout_s)
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    store = open_job_store(rank, world_size, timeout)
    dist.init_process_group(backend, store=store, rank=rank, world_size=world_size, timeout=timeout, **kwargs)
    return env


def open_job_store(rank: int, world_size: int, timeout: datetime.timedelta) -> dist.Store:
    """The job's key-value store (the process group's rendezvous, dlx's heartbeats), with keys of its own per attempt.

    torchrun's agent hosts one TCPStore for the whole job and keeps it across `--max-restarts` restarts, so the keys the
    failed attempt's ranks wrote (gloo's addresses, the init barrier's counter) are still there when the new ranks
    start: they would connect to a dead rank's port, or count stale arrivals. A prefix holding
    TORCHELASTIC_RESTART_COUNT gives each attempt a clean key space. Without torchrun's agent, rank 0 hosts the store.
    """
    global _STORE
    addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    agent_hosts = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    base = dist.TCPStore(
        addr, port, world_size, is_master=not agent_hosts and rank == 0, timeout=timeout, multi_tenant=True
    )
    if port == 0:
        os.environ["MASTER_PORT"] = str(base.port)  # for what reads it later (DeepSpeed's engine)
    _STORE = dist.PrefixStore(f"dlx/attempt{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}", base)
    return _STORE


def job_store() -> dist.Store | None:
    """The store `init_distributed` opened; None in one process without a group."""
    return _STORE if group_active() else None


def group_active() -> bool:
    return dist.is_available() and dist.is_initialized()


def teardown(meet: bool = True) -> None:
    """Destroy the group; first, when every rank is known to be ending too (`meet`: a finished run, or an error all
    ranks raised together), meet them in a barrier so that none exits while a peer still talks to it (torch 2.13 ranks
    may abort at exit otherwise). A rank failing on its own must not wait: its peers are inside another collective, so
    a barrier would hang both; destroying the group ends their collective with an error instead."""
    if not group_active():
        return
    try:
        if meet:
            dist.barrier()
    except Exception:  # a peer is gone: nothing to wait for
        pass
    finally:
        destroy_group()


def destroy_group() -> None:
    """Destroy the default group. Where DeepSpeed has used it, through DeepSpeed, which then drops the groups it
    cached: torch's own destroy leaves them behind, and the next DeepSpeed engine of the process (the next layout of
    `dlx tune` or `dlx bench`, a second run in one process) fails on a group that is no longer registered. A group of
    one gives back its store's port and the environment it set: a command the process starts later is not taken for
    one of its ranks."""
    global _STORE
    comm = sys.modules.get("deepspeed.comm.comm")  # where DeepSpeed keeps its backend (`cdb`)
    backend = getattr(comm, "cdb", None)
    if backend is not None and backend.is_initialized():
        comm.destroy_process_group()
    else:
        dist.destroy_process_group()
    _STORE = None
    for key, value in _GROUP_OF_ONE_ENV.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    _GROUP_OF_ONE_ENV.clear()


class MainFailed(RuntimeError):
    """Rank 0 failed inside a decision it takes for every rank (`main_decides`) with an error that is not a
    UserError (a CUDA error while timing, a bug): raised on every rank with the same message, so that the job ends at
    once instead of the other ranks waiting for rank 0's answer until the process-group timeout. On rank 0 it is
    raised from the original exception, whose traceback comes with it."""


def main_decides(fn: Callable[[], T]) -> T:
    """Run `fn` on rank 0 only and give every rank its result, or raise its UserError on every rank (so that a bad
    input stops all ranks with the same one line instead of leaving the others waiting); any other exception of `fn`
    becomes a `MainFailed` on every rank."""
    if not group_active() or dist.get_world_size() == 1:
        return fn()
    box: list[Any] = [None]
    failure: Exception | None = None
    if dist.get_rank() == 0:
        try:
            box[0] = ("ok", fn())
        except UserError as e:
            box[0] = ("error", str(e))
        except Exception as e:  # carried to every rank, then raised there (and here, from e)
            failure = e
            box[0] = ("failed", f"rank 0 failed deciding for every rank: {type(e).__name__}: {e}")
    dist.broadcast_object_list(box, src=0)
    kind, value = box[0]
    if kind == "error":
        raise UserError(value).alike_on_every_rank()
    if kind == "failed":
        raise MainFailed(value) from failure
    return value


def gather_to_main(value: T) -> list[T] | None:
    """Every rank's `value` (picklable), in rank order, on rank 0; None on the others. [value] in one process."""
    if not group_active() or dist.get_world_size() == 1:
        return [value]
    gathered: list[Any] | None = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
    dist.gather_object(value, gathered, dst=0)
    return gathered


def barrier() -> None:
    """Every rank waits here for the others (a no-op in one process)."""
    if group_active() and dist.get_world_size() > 1:
        dist.barrier()


def all_reduce(values: list[float], op: str, device: torch.device) -> list[float]:
    """Sum, mean or max of each value across ranks in one collective; the values themselves without a group."""
    if not group_active() or dist.get_world_size() == 1:
        return values
    tensor = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX if op == "max" else dist.ReduceOp.SUM)
    if op == "mean":
        tensor /= dist.get_world_size()
    return tensor.tolist()


def all_reduce_tensor(values: list[torch.Tensor | float], op: str, device: torch.device) -> list[float]:
    """Like `all_reduce`, for values that may still be on the device (a loss): one stack, one collective, one wait."""
    stacked = torch.stack([torch.as_tensor(v, dtype=torch.float64, device=device).reshape(()) for v in values])
    if group_active() and dist.get_world_size() > 1:
        dist.all_reduce(stacked, op=dist.ReduceOp.MAX if op == "max" else dist.ReduceOp.SUM)
        if op == "mean":
            stacked /= dist.get_world_size()
    return stacked.tolist()


def any_rank(flag: bool, device: torch.device) -> bool:
    """True on every rank when it is true on at least one."""
    return all_reduce([float(flag)], "max", device)[0] > 0
