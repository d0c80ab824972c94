"""For the tests and the benchmark of `dlx view`: long run folders written with the trainer's own line format (every key
a logged step record holds), and the `dlx view` server as a child process that ends with its `with` block."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import yaml

from dlx.metrics.logger import to_json_line

PHASES = ("data_wait", "forward", "backward", "optimizer", "communication", "other")
SPIKES = (12_345, 67_890)
"""Steps whose loss is planted 10× the curve in every long run (the envelope must keep them)."""


def write_long_run(folder: Path, steps: int, seed: int, eval_every: int = 1000, save_every: int = 5000) -> Path:
    """A finished-looking run folder of `steps` logged steps (log.every 1): config.yaml, metrics.jsonl with a noisy
    decaying loss and the planted spikes, eval.jsonl, and start, checkpoint and loss_spike events, all timed."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    lr = 3e-4 * (1 + seed % 3)
    config = {"model": {"preset": "debug", "dim": 64}, "train": {"lr": lr, "max_steps": steps, "seed": seed}}
    (folder / "config.yaml").write_text(yaml.safe_dump(config))
    step = np.arange(1, steps + 1)
    loss = 2.5 + 8.0 / np.sqrt(step) + rng.normal(0, 0.05, steps)
    for spike in SPIKES:
        if spike <= steps:
            loss[spike - 1] *= 10
    phases = rng.gamma(20, 1, (steps, len(PHASES))) * np.array([0.2, 3, 6, 1, 0.5, 0.3]) * 1e-3
    step_s = phases.sum(axis=1)
    times = 1.7e9 + 30 + np.cumsum(step_s)
    with open(folder / "metrics.jsonl", "w") as f:
        for i in range(steps):
            f.write(to_json_line(step_record(i + 1, loss[i], lr, phases[i], float(times[i]))) + "\n")
    with open(folder / "eval.jsonl", "w") as f:
        for s in range(eval_every, steps + 1, eval_every):
            f.write(to_json_line({"step": s, "loss": float(loss[s - 1]) + 0.1, "perplexity": 1.0, "bpb": 1.1}) + "\n")
    events = [{"event": "start", "step": 0, "startup_s": 30.0, "time": 1.7e9 + 30}]
    for s in range(save_every, steps + 1, save_every):
        events.append({"event": "checkpoint", "step": s, "save_s": 1.5, "time": float(times[s - 1])})
    for s in (s for s in SPIKES if s <= steps):
        events.append({"event": "loss_spike", "step": s, "loss": float(loss[s - 1]), "time": float(times[s - 1])})
    (folder / "events.jsonl").write_text("".join(to_json_line(e) + "\n" for e in events))
    return folder


def step_record(step: int, loss: float, lr: float, phases: np.ndarray, time: float) -> dict:
    step_s = float(phases.sum())
    record = {"step": step, "loss": float(loss), "lr": lr, "grad_norm": 1.0 + float(phases[1]) * 100, "tokens": 32768}
    record["tokens_per_s"] = 32768 / step_s
    record.update({f"{name}_s": float(value) for name, value in zip(PHASES, phases, strict=True)})
    record.update(step_s=step_s, data_wait_pct=100 * float(phases[0]) / step_s, tflops=200.0, tflops_dense=190.0)
    record.update(mfu=0.4, mfu_dense=0.38, peak_mem_gb=61.2, epoch=0, time=round(time, 3))
    record.update(window_steps=1, step_s_std=0.0)
    return record


@contextlib.contextmanager
def view_server(*args: str, env: dict[str, str] | None = None) -> Iterator[tuple[subprocess.Popen, str]]:
    """`dlx view ARGS --port 0` as a child process; (the process, its address). SIGTERM and a wait on the way out."""
    command = [sys.executable, "-m", "dlx", "view", *args, "--port", "0"]
    proc = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, **(env or {})}
    )
    try:
        line = proc.stdout.readline()
        found = re.search(r"http://127\.0\.0\.1:\d+/", line)
        assert found, f"no address in {line!r}; stderr: {proc.stderr.read() if proc.poll() is not None else ''}"
        yield proc, found.group(0)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        proc.stdout.close()
        proc.stderr.close()
