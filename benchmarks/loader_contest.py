"""The loader contest's checks beyond speed (see bench_loader.py): start-up, shutdown when the trainer is signalled,
a dying or failing worker, exact resume, and the data wait of the demo model trained through each contender.

Every check runs each contender (loader_contenders.CONTENDERS) the same way and returns plain figures; bench_loader.py
turns them into tables.
"""

from __future__ import annotations

import itertools
import json
import os
import select
import signal
import statistics
import subprocess
import sys
import time
from contextlib import suppress
from pathlib import Path

import numpy as np
import psutil
import torch

from loader_contenders import CONTENDERS, make_loader

HERE = Path(__file__).resolve().parent
SHM = Path("/dev/shm")
GRAD_ACCUM = 4
"""Micro-batches per optimizer step in the signalled trainer: an orderly stop must read the rest of its step."""

TRAINER = """
import sys, time
sys.path.insert(0, sys.argv[3])
from dlx.train.build.signals import GracefulStop
from loader_contenders import make_loader

contender, folder = sys.argv[1], sys.argv[2]
with GracefulStop() as stop:
    loader = make_loader(contender, folder, seq_len=16, micro_batch_size=2, num_workers=2, prefetch=2)
    step = 0
    while not stop.requested:
        for _ in range(ACCUM):  # one optimizer step: ACCUM micro-batches, each a short "forward + backward"
            next(loader)
            time.sleep(0.01)
        step += 1
        if step == 1:
            print("WORKERS", *loader.worker_pids, flush=True)
    loader.close()
print("STOPPED", step, flush=True)
sys.exit(128 + {"SIGINT": 2, "SIGTERM": 15}[stop.signal_name])
""".replace("ACCUM", str(GRAD_ACCUM))
"""A trainer with dlx's signal handling (finish the step, close the loader, exit 128 + signal number)."""


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def seconds_until_gone(pids: list[int], timeout: float) -> float | None:
    """Seconds until none of `pids` runs (None: some still ran after `timeout`; those are then killed)."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if not any(_alive(pid) for pid in pids):
            return time.monotonic() - start
        time.sleep(0.01)
    for pid in pids:
        with suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return None


def shm_entries() -> set[str]:
    return set(os.listdir(SHM)) if SHM.is_dir() else set()


def leaked_shm(before: set[str]) -> list[str]:
    """New /dev/shm entries that no running process holds (others sharing the machine may hold their own)."""
    new = shm_entries() - before
    held = set()
    for process in psutil.process_iter():
        with suppress(psutil.Error, OSError):
            held |= {m.path for m in process.memory_maps()} | {f.path for f in process.open_files()}
    return sorted(name for name in new if str(SHM / name) not in held)


def signal_trainer(contender: str, folder: Path, name: str, linger_timeout: float = 15.0) -> dict:
    """Start the trainer, signal it mid-run (SIGINT to its process group as Ctrl-C does; SIGTERM and SIGKILL to the
    trainer only), and report how it ended and how long its workers outlived it."""
    shm_before = shm_entries()
    trainer = subprocess.Popen(
        [sys.executable, "-c", TRAINER, contender, str(folder), str(HERE)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        ready, _, _ = select.select([trainer.stdout], [], [], 60)
        line = trainer.stdout.readline().split() if ready else []
        if not line or line[0] != "WORKERS":
            raise RuntimeError(f"{contender}: the trainer did not start: {trainer.stderr.read()[-2000:]}")
        workers = [int(pid) for pid in line[1:]]
        time.sleep(0.3 + 0.1 * np.random.default_rng().random())  # a few steps in, at no particular point of a step
        if name == "SIGINT":
            os.killpg(trainer.pid, signal.SIGINT)
        else:
            trainer.send_signal(signal.Signals[name])
        code = trainer.wait(timeout=60)
        linger = seconds_until_gone(workers, linger_timeout)
        stderr = trainer.stderr.read()
    finally:
        if trainer.poll() is None:
            os.killpg(trainer.pid, signal.SIGKILL)
            trainer.wait()
        trainer.stdout.close()
        trainer.stderr.close()
    expected = -signal.SIGKILL if name == "SIGKILL" else 128 + signal.Signals[name]
    return {
        "orderly": code == expected,
        "code": code,
        "linger_s": linger,
        "shm_left": leaked_shm(shm_before),
        "error": "" if code == expected else stderr.strip().splitlines()[-1:],
    }


def startup_seconds(contender: str, folder: Path, num_workers: int = 1) -> float:
    """Construction to the first batch in hand (worker start included)."""
    start = time.perf_counter()
    with make_loader(contender, folder, seq_len=256, micro_batch_size=8, num_workers=num_workers) as loader:
        next(loader)
        return time.perf_counter() - start


def trainer_cpu_us(contender: str, folder: Path, batches: int = 200, repeats: int = 5) -> float:
    """CPU time the trainer's own thread spends in `next(loader)` per batch (µs, median of `repeats` runs of
    `batches`), each batch asked for after a 2 ms pause in which the worker refills: the work that holds the GIL."""
    runs = []
    with make_loader(contender, folder, seq_len=256, micro_batch_size=8, num_workers=1, prefetch=4) as loader:
        for _ in itertools.islice(loader, 50):
            pass
        for _ in range(repeats):
            cpu = 0.0
            for _ in range(batches):
                time.sleep(0.002)
                start = time.thread_time()
                next(loader)
                cpu += time.thread_time() - start
            runs.append(cpu / batches * 1e6)
    return statistics.median(runs)


def worker_memory_mb(contender: str, folder: Path, batches: int = 200) -> float:
    """Unique memory (USS: pages no other process shares) of one worker after `batches` batches, in MB."""
    with make_loader(contender, folder, seq_len=256, micro_batch_size=8, num_workers=1) as loader:
        for _ in itertools.islice(loader, batches):
            pass
        (pid,) = loader.worker_pids
        return psutil.Process(pid).memory_full_info().uss / 1e6


def killed_worker(contender: str, folder: Path) -> dict:
    """SIGKILL one worker while the trainer reads; seconds until the trainer gets an error, where it surfaced, and
    the error's text. Run in a process of its own (`isolated`): torch's DataLoader raises from a SIGCHLD handler,
    wherever the trainer happens to be (in `next`, or in `close`), and its handler stays installed afterwards."""
    loader = make_loader(contender, folder, seq_len=16, micro_batch_size=2, num_workers=2, prefetch=2)
    where, start, victim = "the loop reading batches", time.monotonic(), -1
    try:
        next(loader)
        victim = loader.worker_pids[1]
        os.kill(victim, signal.SIGKILL)
        start = time.monotonic()
        while time.monotonic() - start < 30:
            next(loader)
            time.sleep(0.001)
        where = "close()"
        loader.close()
        return {"seconds": None, "where": "nowhere", "message": "no error in 30 s", "names_pid": False}
    except Exception as e:  # what each contender raises, and where, is what is measured
        message = str(e).strip().splitlines()[0]
        seconds = time.monotonic() - start
        return {"seconds": seconds, "where": where, "message": message, "names_pid": str(victim) in message}


def isolated(check: str, contender: str, folder: Path) -> dict:
    """`check(contender, folder)` of this module run in a fresh process (its signal handlers die with it)."""
    code = (
        f"import json, sys; sys.path.insert(0, {str(HERE)!r}); import loader_contest; "
        f"print(json.dumps(loader_contest.{check}({contender!r}, __import__('pathlib').Path({str(folder)!r}))))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    lines = result.stdout.strip().splitlines()
    if result.returncode != 0 or not lines:
        crash = result.stderr.strip()[-300:]
        return {"seconds": None, "where": "the check crashed", "message": crash, "names_pid": False}
    return json.loads(lines[-1])


def failing_worker(contender: str, folder: Path) -> dict:
    """The shard vanishes after the loader was built, so its worker fails: does the trainer's error name the shard and
    the cause (`named`), in one line (`one_line`: dlx's bar for a failure with a known cause; a failure without one
    keeps the worker's traceback: tests/integration/test_pool.py, tests/integration/test_faults_data.py)?"""
    shard = folder / "train-00000.bin"
    kept = shard.read_bytes()
    loader = make_loader(contender, folder, seq_len=16, micro_batch_size=2, num_workers=1)
    shard.unlink()
    try:
        next(loader)
        return {"named": False, "one_line": False, "message": "no error"}
    except Exception as e:
        text = str(e).strip()
        named = shard.name in text and ("No such file or directory" in text or "FileNotFoundError" in text)
        return {"named": named, "one_line": "\n" not in text, "message": text.splitlines()[-1]}
    finally:
        loader.close()
        shard.write_bytes(kept)


def _windows(batches: list[torch.Tensor], seq_len: int) -> list[int]:
    """Window ids (first token // seq_len: the shards hold consecutive integers) in reading order."""
    return [int(w) for batch in batches for w in batch[:, 0] // seq_len]


def _read(loaders: list, n_steps: int) -> list[torch.Tensor]:
    """`n_steps` steps of every rank's loader, the ranks' micro-batches of a step in rank order."""
    out = []
    for _ in range(n_steps):
        out += [next(loader)[0].clone() for loader in loaders]
    return out


def resume_exact(contender: str, folder: Path, before: tuple[int, int], after: tuple[int, int]) -> bool:
    """Read 3/4 of an epoch with (world size, workers) `before`, save rank 0's state, resume with `after` in new
    loaders and read on past the epoch's end: the windows read, in order, must be those of one uninterrupted
    single-rank reader (dlx's, in-process). The dataset's windows per epoch divide by every step size used, so that
    the skipped tail is the same for every world size."""
    seq, micro = 16, 4
    with make_loader(CONTENDERS[0], folder, seq_len=seq, micro_batch_size=micro, num_workers=0) as reference:
        n_windows_epoch = reference.windows_per_epoch
        expected = _windows(_read([reference], 2 * n_windows_epoch // micro), seq)
    world, workers = before
    loaders = [
        make_loader(contender, folder, seq_len=seq, micro_batch_size=micro, world_size=world, rank=r, num_workers=w)
        for r, w in zip(range(world), [workers] * world, strict=True)
    ]
    first_steps = (n_windows_epoch // (world * micro)) * 3 // 4
    try:
        first = _read(loaders, first_steps)
        state = loaders[0].state_dict()
    finally:
        for loader in loaders:
            loader.close()
    world, workers = after
    loaders = [
        make_loader(contender, folder, seq_len=seq, micro_batch_size=micro, world_size=world, rank=r, num_workers=w)
        for r, w in zip(range(world), [workers] * world, strict=True)
    ]
    try:
        for loader in loaders:
            loader.load_state_dict(state)
        done = len(_windows(first, seq))
        second = _read(loaders, (len(expected) - done) // (world * micro) // 2)
    except Exception:  # a contender that refuses the resume fails this check
        return False
    finally:
        for loader in loaders:
            loader.close()
    got = _windows(first, seq) + _windows(second, seq)
    return got == expected[: len(got)]


def demo_data_wait(contender: str, dataset: Path, steps: int, vocab_size: int, verify: bool = False) -> dict:
    """The demo recipe (model, seq 256, micro-batch 8, one loader worker) trained `steps` steps with the contender as
    its training loader; data wait and step time summed over steps 2.., and step 1's data wait (the loader's start)."""
    import tempfile

    from dlx.train import run as run_module
    from dlx.train.demo import demo_recipe
    from dlx.train.loop import finish, trainer
    from dlx.train.recipe import load_recipe

    recipe = demo_recipe(vocab_size)
    recipe["data"]["path"] = str(dataset)
    overrides = ["--train.max_steps", str(steps), "--eval.every", "0", "--log.every", "1", "--log.progress", "false"]
    config = load_recipe(None, overrides, base=recipe)
    original = run_module.build_train_loader

    def build(config, device, rank=0, world_size=1):
        data = config.data
        return make_loader(
            contender,
            data.path,
            seq_len=data.seq_len,
            micro_batch_size=data.micro_batch_size,
            seed=config.train.seed,
            rank=rank,
            world_size=world_size,
            num_workers=data.num_workers,
            prefetch=data.prefetch,
            device=device,
            **({"verify": verify} if contender == CONTENDERS[0] else {}),
        )

    run_module.build_train_loader = build
    saved_report = finish.write_report
    finish.write_report = lambda *args, **kwargs: None
    try:
        with tempfile.TemporaryDirectory(prefix="dlx-contest-run-") as tmp:
            result = trainer.pretrain(config, "contest", Path(tmp) / "run")
    finally:
        run_module.build_train_loader = original
        finish.write_report = saved_report
    first, records = result.records[0], [r for r in result.records if r["step"] > 1]
    wait = sum(r["data_wait_s"] for r in records)
    step = sum(r["step_s"] for r in records)
    return {
        "wait_pct": 100 * wait / step,
        "step_s": statistics.median(r["step_s"] for r in records),
        "first_wait_s": first["data_wait_s"],
    }
