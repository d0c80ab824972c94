"""What the journeys share: `dlx` as a user runs it (a child process per command, its own caches), a raw corpus of
real text, and the records a run folder holds, read from a folder or a bucket."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import sysconfig
import time
from dataclasses import dataclass, field
from pathlib import Path

TRAIN = [
    "--model.preset",
    "debug",
    "--data.seq_len",
    "64",
    "--data.micro_batch_size",
    "4",
    "--train.precision",
    "fp32",
    "--train.lr",
    "3e-3",
    "--train.warmup_ratio",
    "0.1",
    "--log.every",
    "1",
    "--log.progress",
    "false",
]
"""A debug-sized run that takes a fraction of a second per step on a CPU."""


@dataclass
class User:
    """A user's shell: a working folder and an environment of their own (cache, staging, a bucket's endpoint)."""

    home: Path
    env: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.home.mkdir(parents=True, exist_ok=True)
        self.env = {
            **os.environ,
            "PYTHONUNBUFFERED": "1",
            "COLUMNS": "200",
            "OMP_NUM_THREADS": "1",
            "XDG_CACHE_HOME": str(self.home / ".cache"),
            "DLX_STAGING_DIR": str(self.home / ".cache" / "staging"),
            **self.env,
        }

    def dlx(self, *args: str, ok: bool = True, timeout: float = 300, **env: str) -> subprocess.CompletedProcess:
        """`dlx ARGS` to its end; with `ok`, a non-zero exit fails the journey with the command's own words."""
        result = subprocess.run(
            [sys.executable, "-m", "dlx", *args],
            cwd=self.home,
            env={**self.env, **env},
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if ok:
            assert result.returncode == 0, f"dlx {' '.join(args)} exited {result.returncode}:\n{result.stderr}"
        return result

    def python(self, code: str, timeout: float = 300) -> str:
        """A Python program the user writes (transformers on an exported model): its standard output."""
        result = subprocess.run(
            [sys.executable, "-c", code], cwd=self.home, env=self.env, capture_output=True, text=True, timeout=timeout
        )
        assert result.returncode == 0, result.stderr
        return result.stdout

    def torchrun(self, ranks: int, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
        """`torchrun --standalone --nproc_per_node RANKS -m dlx ARGS`, as the README starts a job on one machine."""
        launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(ranks)]
        result = subprocess.run(
            [*launcher, "-m", "dlx", *args], cwd=self.home, env=self.env, capture_output=True, text=True,
            timeout=timeout, start_new_session=True,
        )  # fmt: skip
        assert result.returncode == 0, f"torchrun dlx {' '.join(args)} exited {result.returncode}:\n{result.stderr}"
        return result

    def start(self, *args: str, **env: str) -> subprocess.Popen:
        """`dlx ARGS` in a session of its own (a signal can reach its whole process group), not waited for."""
        return subprocess.Popen(
            [sys.executable, "-m", "dlx", *args],
            cwd=self.home,
            env={**self.env, **env},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )


def kill_when_paused(proc: subprocess.Popen, marker: Path, ready=lambda: True, timeout: float = 240) -> None:
    """SIGKILL the process group of `proc` once it waits at its fault pause point (`marker` exists) and `ready()`
    holds; the whole group is gone when this returns."""
    deadline = time.monotonic() + timeout
    while not (marker.exists() and ready()):
        assert proc.poll() is None, f"the run ended before it was killed:\n{proc.stderr.read()}"
        assert time.monotonic() < deadline, "the run never reached the point it was to be killed at"
        time.sleep(0.1)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(30)
    proc.stderr.close()


def stdlib_documents(count: int) -> list[dict[str, str]]:
    """`count` real documents as a raw corpus holds them: whole Python modules of the standard library (code) and
    their docstrings' first paragraphs (prose), each with an `id` and a `url`."""
    lib = Path(sysconfig.get_paths()["stdlib"])
    documents = []
    for path in sorted(lib.glob("*.py")):
        text = path.read_text(encoding="utf-8", errors="replace")
        if len(text) < 2000:
            continue
        documents.append({"id": f"code/{path.name}", "url": f"file://{path}", "text": text})
        doc = text.split('"""')[1].strip() if text.count('"""') >= 2 else ""
        if len(doc) > 200:
            documents.append({"id": f"prose/{path.stem}", "url": f"file://{path}#doc", "text": doc})
        if len(documents) >= count:
            break
    return documents[:count]


def write_jsonl(path: Path, records: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(record, ensure_ascii=False) + "\n" for record in records), encoding="utf-8")
    return path


def step_losses(metrics_jsonl: str) -> dict[int, float]:
    """Step → loss of a metrics.jsonl's text (a step logged twice, before and after a resume, keeps the last)."""
    return {r["step"]: r["loss"] for r in map(json.loads, metrics_jsonl.splitlines()) if "loss" in r}
