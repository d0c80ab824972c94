"""Shared by the fault tests: start the real CLI, stop it at an exact point (dlx.faults), send a signal the way a user
or a scheduler does, and check what is left afterwards (processes, /dev/shm)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import psutil

from dlx.data.shards import MANIFEST_FILE

SHM = Path("/dev/shm")
SIGNALS = ("SIGINT", "SIGTERM", "SIGKILL")


def cli_env(**extra: str) -> dict[str, str]:
    return {**os.environ, "PYTHONUNBUFFERED": "1", "COLUMNS": "200", "OMP_NUM_THREADS": "1", **extra}


NO_PLOTS = (
    "import sys; from dlx.train.loop import finish; finish.write_report = lambda *args, **kwargs: None; "
    "from dlx.cli.app import main; sys.argv[0] = 'dlx'; main()"
)
"""`dlx` with report.md and its plots left out (3 s of matplotlib per run, as `train_helpers.skip_plots` does)."""


def start_cli(args: list[str], cwd: Path, env: dict[str, str] | None = None, plots: bool = True, **popen):
    """`dlx ARGS` in a session of its own, so that a SIGINT can go to its whole process group (Ctrl-C)."""
    command = [sys.executable, "-m", "dlx"] if plots else [sys.executable, "-c", NO_PLOTS]
    return subprocess.Popen(
        [*command, *args],
        cwd=cwd,
        env=env or cli_env(),
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
        **popen,
    )


def process_tree(pid: int) -> list[psutil.Process]:
    """The process and all its descendants, captured while it runs (a killed parent's orphans are not its children)."""
    root = psutil.Process(pid)
    return [root, *root.children(recursive=True)]


def send(proc: subprocess.Popen, name: str) -> None:
    """SIGINT as Ctrl-C sends it (to the whole foreground group); SIGTERM and SIGKILL to the main process only, as a
    scheduler or `kill PID` does: the workers must then notice on their own."""
    if name == "SIGINT":
        os.killpg(proc.pid, signal.SIGINT)
    else:
        proc.send_signal(signal.Signals[name])


def is_gone(process: psutil.Process) -> bool:
    try:
        return process.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def left_running(processes: list[psutil.Process], timeout: float = 10.0) -> list[psutil.Process]:
    """Those of `processes` still running after `timeout` seconds; any found are killed (after being reported)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not all(is_gone(p) for p in processes):
        time.sleep(0.05)
    alive = [p for p in processes if not is_gone(p)]
    for process in alive:
        process.kill()
    return alive


def finish(proc: subprocess.Popen, timeout: float = 90) -> tuple[str, str]:
    """Wait for the process (killing its group if it overruns) and return its output."""
    try:
        return proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        raise AssertionError(f"{proc.args} ran over {timeout} s\n{out}\n{err}") from None


def shm_entries() -> set[str]:
    return set(os.listdir(SHM)) if SHM.is_dir() else set()


def leaked_shm(before: set[str]) -> list[str]:
    """/dev/shm entries that appeared since `before` and that no running process holds: left behind by a process that
    ended (others sharing this machine may create their own while a test runs; those are held open or mapped)."""
    new = shm_entries() - before
    if not new:
        return []
    held = set()
    for process in psutil.process_iter():
        try:
            held |= {m.path for m in process.memory_maps()} | {f.path for f in process.open_files()}
        except (psutil.Error, OSError):
            continue
    return sorted(name for name in new if str(SHM / name) not in held)


def wait_for_file(path: Path, proc: subprocess.Popen, timeout: float = 90) -> None:
    """Until `path` exists; fails with the process's output if it ends first."""
    deadline = time.monotonic() + timeout
    while not path.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            out, err = finish(proc, 5) if proc.poll() is not None else ("", "(still running)")
            raise AssertionError(f"{path.name} never appeared (exit {proc.returncode})\n{out[-2000:]}\n{err[-4000:]}")
        time.sleep(0.01)


def committed(out: Path) -> tuple[bool, int] | None:
    """(complete, committed units) from a prepare output's manifest, None before it exists."""
    try:
        m = json.loads((out / MANIFEST_FILE).read_text())
    except (OSError, ValueError):
        return None
    return m["complete"], m["source"].get("resume", {}).get("next_unit", -1)


def signal_after_progress(
    cmd: list[str], out: Path, min_next_unit: int, name: str = "SIGKILL", before: Callable[[], None] | None = None
) -> tuple[subprocess.Popen | None, list[psutil.Process]]:
    """Start `dlx prepare` (cmd); send signal `name` once its manifest has committed `min_next_unit` units but is not
    complete. (the ended process, its process tree), or (None, []) when it finished before that point. The process
    waits at its `prepare_final` fault point before its last commit, so it cannot finish between the test's look at
    the manifest and the signal: a signal that reaches it there stops it as one mid-run would."""
    pause = out.parent / f"{out.name}-faults"
    pause.mkdir(exist_ok=True)
    env = cli_env(DLX_FAULT_PAUSE="prepare_final", DLX_FAULT_DIR=str(pause))
    proc = subprocess.Popen(
        cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env, start_new_session=True
    )
    deadline = time.monotonic() + 90
    while proc.poll() is None and time.monotonic() < deadline:
        state = committed(out)
        at_the_end = (pause / "prepare_final").exists()
        if state is not None and not state[0] and (state[1] >= min_next_unit or at_the_end):
            tree = process_tree(proc.pid)
            send(proc, name)
            (pause / "prepare_final").unlink(missing_ok=True)  # a process that ignores the signal goes on
            proc.wait(30)
            return proc, tree
        time.sleep(0.005)
    stderr = proc.communicate()[1]
    assert proc.returncode == 0, stderr
    return None, []


def start_torchrun(
    args: list[str], cwd: Path, env: dict[str, str], n_ranks: int = 2, launch: list[str] | None = None
) -> subprocess.Popen:
    """`torchrun --standalone --nproc_per_node N dlx ARGS` (plots left out, as `NO_PLOTS`), in a session of its own;
    `launch`: torchrun's own options instead of `--standalone --nproc_per_node N`."""
    launcher = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        *(launch or ["--standalone", "--nproc_per_node", str(n_ranks)]),
        "--no-python",
        sys.executable,
        "-c",
        NO_PLOTS,
    ]
    return subprocess.Popen(
        [*launcher, *args],
        cwd=cwd,
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )


def rank_processes(launcher: psutil.Process) -> dict[int, psutil.Process]:
    """The worker processes torchrun started, by their RANK."""
    ranks = {}
    for child in launcher.children():
        rank = child.environ().get("RANK")
        if rank is not None:
            ranks[int(rank)] = child
    return ranks
