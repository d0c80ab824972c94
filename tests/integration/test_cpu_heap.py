"""The CPU heap setting (`dlx.device.prefer_cpu_heap`): a step's activations come from glibc's heap, not from fresh
mmaps, unless the user chose an allocator setting."""

import platform
import subprocess
import sys

import pytest

from dlx import device as dev

pytestmark = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's mallopt")

MMAPPED_MB = """
import ctypes, sys
import torch
from dlx import device as dev

class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]

libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = MallInfo2
if sys.argv[1] == "train":
    dev.training_device("cpu", 0, 1, "train.device")
before = libc.mallinfo2().hblkhd
block = torch.ones(4 << 20)  # 16 MB, an activation's size
print((libc.mallinfo2().hblkhd - before) >> 20)
"""


def mmapped_mb(mode: str, env: dict[str, str] | None = None) -> int:
    done = subprocess.run(
        [sys.executable, "-c", MMAPPED_MB, mode], capture_output=True, text=True, check=True, env=env, timeout=120
    )
    return int(done.stdout.split()[-1])


def test_a_cpu_training_process_takes_a_16_mb_block_from_the_heap_where_glibc_alone_mmaps_it():
    assert mmapped_mb("plain") == 16  # glibc's default in a fresh process: mmapped, page-faulted, given back
    assert mmapped_mb("train") == 0


def test_the_users_allocator_choice_wins(monkeypatch):
    for name in (*dev.CPU_HEAP_VARIABLES, "GLIBC_TUNABLES", "LD_PRELOAD"):
        monkeypatch.delenv(name, raising=False)
    assert dev.prefer_cpu_heap().startswith("glibc malloc: mmap threshold 32 MB")
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "131072")
    assert dev.prefer_cpu_heap() == "the user's: MALLOC_MMAP_THRESHOLD_=131072"
    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_")
    monkeypatch.setenv("LD_PRELOAD", "/usr/lib/libjemalloc.so.2")
    assert dev.prefer_cpu_heap() == "the user's: LD_PRELOAD=/usr/lib/libjemalloc.so.2"
    monkeypatch.delenv("LD_PRELOAD")
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.mmap_threshold=65536")
    assert dev.prefer_cpu_heap() == "the user's: GLIBC_TUNABLES=glibc.malloc.mmap_threshold=65536"


def test_a_user_setting_keeps_glibcs_own_behaviour_in_a_training_process():
    import os

    env = {**os.environ, "MALLOC_TOP_PAD_": "131072"}
    env.pop("GLIBC_TUNABLES", None)
    assert mmapped_mb("train", env) == 16


HEAP_KEPT_MB = """
import psutil, torch
from dlx import device as dev

dev.prefer_cpu_heap()
blocks = [torch.ones(1 << 18) for _ in range(200)]  # 200 blocks of 1 MB, from the heap, touched
rss = psutil.Process().memory_info().rss
del blocks
kept = psutil.Process().memory_info().rss
dev.trim_cpu_heap()
print((rss - kept) >> 20, (kept - psutil.Process().memory_info().rss) >> 20)
"""


def test_freed_heap_memory_stays_resident_until_a_measurement_trims_it():
    import os

    unset = (*dev.CPU_HEAP_VARIABLES, "GLIBC_TUNABLES", "LD_PRELOAD")
    env = {name: value for name, value in os.environ.items() if name not in unset}
    done = subprocess.run(
        [sys.executable, "-c", HEAP_KEPT_MB], capture_output=True, text=True, check=True, env=env, timeout=120
    )
    given_back_on_free, given_back_on_trim = (int(mb) for mb in done.stdout.split()[-2:])
    assert given_back_on_free < 20  # kept for the next step
    assert given_back_on_trim > 150  # what trim_cpu_heap hands back before a measurement
