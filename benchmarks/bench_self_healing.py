"""Self-healing (issue 29): what a job costs when a rank dies, a rank hangs, or the loss spikes, on this machine.

1. Restart: `torchrun --standalone --nproc_per_node 2 --max-restarts 1 dlx pretrain RECIPE --run-dir DIR --resume
   auto` on the demo model (fp32, DDP, gloo), rank 1 SIGKILLed by pid once the step-K checkpoint is written; timed
   from the kill to the first step the restarted job logs. Its losses are compared with an uninterrupted job's, step
   by step (the target: bit-identical).
2. Spike: one process, a 20x loss planted on 3 consecutive steps (DLX_FAULT_SPIKE), train.spike_policy rollback with
   patience 3 (and skip, which skips them one by one); the final validation loss against a clean run's.
3. Hang: a 2-rank job with parallel.timeout_s T; rank 1 SIGSTOPped; timed from the stop to the line naming it.

Run:  .venv/bin/python benchmarks/bench_self_healing.py      (appends to BENCHMARKS.md; --no-record to only print)
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

from dlx.train.demo import prepare_demo_data
from peers.record import environment, publish

RECIPE = ["--data.seq_len", "128", "--data.micro_batch_size", "4", "--log.every", "1"]
RECIPE += ["--train.precision", "fp32", "--log.progress", "false", "--data.num_workers", "0", "--train.seed", "0"]
LAUNCHER = [sys.executable, "-m", "torch.distributed.run"]
INTRO = (
    "A run that heals itself (issue 29): `--resume auto` under torchrun `--max-restarts`, loss-spike skip and rollback "
    "(train.spike_policy), and the line that names a hung rank. Measured by benchmarks/bench_self_healing.py."
)


def env() -> dict[str, str]:
    return {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", "COLUMNS": "200"}


def dlx(args: list[str], launch: list[str] | None, extra_env: dict[str, str] | None = None) -> subprocess.Popen:
    prefix = [*LAUNCHER, *launch, "-m", "dlx"] if launch else [sys.executable, "-m", "dlx"]
    return subprocess.Popen(
        [*prefix, "pretrain", *args],
        env={**env(), **(extra_env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def losses(run_dir: Path) -> dict[int, float]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return {r["step"]: r["loss"] for r in map(json.loads, lines)}


def rank_pid(launcher: subprocess.Popen, rank: int) -> int:
    for child in psutil.Process(launcher.pid).children():
        if child.environ().get("RANK") == str(rank):
            return child.pid
    raise RuntimeError(f"no rank {rank} under torchrun {launcher.pid}")


def restart(tmp: Path, data: Path, steps: int, kill_after: int, model: str = "demo") -> dict[str, float | str]:
    """The kill-to-first-step time of an automatic restart, and the interrupted losses against uninterrupted ones."""
    common = ["--model.preset", model, *RECIPE, "--data.path", str(data), "--train.max_steps", str(steps)]
    common += ["--parallel.strategy", "ddp"]
    common += ["--checkpoint.every", str(kill_after), "--train.global_batch_size", "8"]
    two = ["--standalone", "--nproc_per_node", "2"]
    straight = dlx([*common, "--run-dir", str(tmp / "straight")], two)
    _, err = straight.communicate()
    assert straight.returncode == 0, err[-3000:]
    run_dir = tmp / "healed"
    job = dlx([*common, "--run-dir", str(run_dir), "--resume", "auto"], [*two, "--max-restarts", "1"])
    marker = run_dir / "checkpoints" / f"step-{kill_after:08d}" / "trainer_state.json"
    while not marker.exists():
        assert job.poll() is None, job.communicate()[1][-3000:]
        time.sleep(0.05)
    time.sleep(0.5)  # well into the next steps
    os.kill(rank_pid(job, 1), signal.SIGKILL)
    killed, killed_wall = time.monotonic(), time.time()
    resumed_at = None
    for line in job.stdout:
        if "resuming from" in line:
            resumed_at = time.monotonic()
        if resumed_at and line.startswith("step "):
            first_step = time.monotonic()
            break
    _, err = job.communicate()
    assert job.returncode == 0, "the restarted job failed"
    restarted = torchrun_time(err, "failed (exitcode") - killed_wall  # torchrun has ended the old group's ranks
    a, b = losses(straight_dir := tmp / "straight"), losses(run_dir)
    diff = max(abs(a[s] - b[s]) for s in a)
    return {
        "kill_to_group_ended_s": restarted,
        "kill_to_resume_s": resumed_at - killed,
        "kill_to_first_step_s": first_step - killed,
        "steps": float(len(a)),
        "identical": "bit-identical" if a == b else f"max |Δloss| {diff:.3g}",
        "straight": str(straight_dir),
    }


def torchrun_time(stderr: str, text: str) -> float:
    """The wall time of torchrun's first log line holding `text` (`E1204 20:45:44.660000 PID ...`, local time)."""
    line = next(line for line in stderr.splitlines() if text in line and line[:1] in "EWI")
    stamp = datetime.datetime.strptime(f"{datetime.date.today().year}{line[1:5]} {line[6:21]}", "%Y%m%d %H:%M:%S.%f")
    return stamp.timestamp()


def eval_loss(run_dir: Path) -> float:
    return json.loads((run_dir / "eval.jsonl").read_text().splitlines()[-1])["loss"]


def spikes(tmp: Path, data: Path, steps: int, at: int) -> list[tuple[str, float, str]]:
    """(policy, final eval loss, what happened) for a clean run and planted-spike runs."""
    common = ["--model.preset", "demo", *RECIPE, "--data.path", str(data), "--train.max_steps", str(steps)]
    common += ["--eval.every", str(steps)]
    common += ["--eval.batches", "20", "--checkpoint.every", "10", "--checkpoint.keep_last", "3"]
    common += ["--train.spike_window", "20", "--train.spike_patience", "3"]
    planted = {"DLX_FAULT_SPIKE": f"{at},{at + 1},{at + 2}x20"}
    rows = []
    for name, policy, fault in (("clean", "off", {}), ("skip", "skip", planted), ("rollback", "rollback", planted)):
        run_dir = tmp / f"spike-{name}"
        proc = dlx([*common, "--train.spike_policy", policy, "--run-dir", str(run_dir)], None, fault)
        _, err = proc.communicate()
        assert proc.returncode == 0, err[-3000:]
        events = (run_dir / "events.jsonl").read_text().splitlines() if (run_dir / "events.jsonl").exists() else []
        kinds = [json.loads(e)["event"] for e in events]
        rows.append(
            (name, eval_loss(run_dir), f"{kinds.count('loss_spike')} spikes, {kinds.count('rollback')} rollback")
        )
    return rows


def hang(tmp: Path, data: Path, timeout_s: int) -> tuple[float, str]:
    """Seconds from SIGSTOP to the line naming the rank, and the line."""
    args = ["--model.preset", "demo", *RECIPE, "--data.path", str(data), "--train.max_steps", "100000"]
    args += ["--parallel.strategy", "ddp"]
    args += ["--parallel.timeout_s", str(timeout_s), "--run-dir", str(tmp / "hang")]
    job = dlx(args, ["--standalone", "--nproc_per_node", "2"])
    for line in job.stdout:
        if line.startswith("step 5 "):
            break
    victim = rank_pid(job, 1)
    os.kill(victim, signal.SIGSTOP)
    stopped = time.monotonic()
    named = ""
    for line in job.stderr:
        if "did not arrive" in line:
            named = line.strip()
            break
    took = time.monotonic() - stopped
    os.kill(victim, signal.SIGKILL)
    job.communicate()
    return took, named


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, help="A prepared stdlib-8k dataset (default: prepared into a temp dir).")
    parser.add_argument("--steps", type=int, default=40, help="Optimizer steps of the restart and spike runs.")
    parser.add_argument("--timeout-s", type=int, default=10, help="parallel.timeout_s of the hang run.")
    parser.add_argument("--no-record", action="store_true", help="Print only; do not append to BENCHMARKS.md.")
    parser.add_argument(
        "--restart-only",
        metavar="PRESET",
        help="Measure only the restart, on this model preset (e.g. small-125m), with --steps steps.",
    )
    args = parser.parse_args()
    if args.restart_only:
        restart_only(args)
        return
    header = environment(["src/dlx", "benchmarks"])
    with tempfile.TemporaryDirectory(prefix="dlx-bench-heal-") as name:
        tmp = Path(name)
        data = demo_data(args.data, tmp)
        healed = restart(tmp, data, args.steps, kill_after=args.steps // 2)
        spike_rows = spikes(tmp, data, args.steps * 2, at=args.steps + 5)
        hang_s, named = hang(tmp, data, args.timeout_s)
    clean = spike_rows[0][1]
    lines = [
        f"### {datetime.datetime.now().astimezone():%Y-%m-%d %H:%M %Z}",
        "",
        *header,
        "",
        f"Demo model (fp32, seq 128, global batch 8), CPU, gloo. Restart: 2-rank DDP, {args.steps} steps, rank 1 "
        f"SIGKILLed after the step-{args.steps // 2} checkpoint:",
        "",
        *restart_rows(healed),
        f"| SIGSTOP of rank 1 → the line naming it (parallel.timeout_s {args.timeout_s}) | {hang_s:.1f} s |",
        "",
        f"Planted spike: 20x the loss on steps {args.steps + 5}-{args.steps + 7} of {args.steps * 2}, spike_window 20, "
        "patience 3; final validation loss (20 batches):",
        "",
        "| run | eval loss | vs clean | events |",
        "|---|---|---|---|",
        *[f"| {n} | {loss:.4f} | {100 * (loss / clean - 1):+.2f} % | {what} |" for n, loss, what in spike_rows],
        "",
        f"The naming line: `{named}`",
    ]
    publish("Self-healing", INTRO, lines, record=not args.no_record)


def restart_rows(healed: dict[str, float | str]) -> list[str]:
    """The restart's table: its header and one row per measure."""
    return [
        "| measure | value |",
        "|---|---|",
        f"| SIGKILL → torchrun has ended the old group (its `failed` line) | {healed['kill_to_group_ended_s']:.1f} s |",
        f"| SIGKILL → `resuming from` printed by the restarted ranks | {healed['kill_to_resume_s']:.1f} s |",
        f"| SIGKILL → first step logged after the automatic resume | {healed['kill_to_first_step_s']:.1f} s |",
        f"| losses, interrupted vs uninterrupted ({healed['steps']:.0f} steps) | {healed['identical']} |",
    ]


def demo_data(given: Path | None, tmp: Path) -> Path:
    """The dataset given, else the demo's stdlib dataset prepared under `tmp`."""
    data = given or tmp / "stdlib-8k"
    if given is None:
        prepare_demo_data(data)
    return data


def restart_only(args: argparse.Namespace) -> None:
    """The restart measurement alone, on a larger preset (its checkpoint is what the restart reads back)."""
    header = environment(["src/dlx", "benchmarks"])
    with tempfile.TemporaryDirectory(prefix="dlx-bench-heal-") as name:
        tmp = Path(name)
        data = demo_data(args.data, tmp)
        healed = restart(tmp, data, args.steps, kill_after=args.steps // 2, model=args.restart_only)
    lines = [
        f"### {datetime.datetime.now().astimezone():%Y-%m-%d %H:%M %Z} (restart only: {args.restart_only})",
        "",
        *header,
        "",
        f"Preset {args.restart_only} (fp32, seq 128, global batch 8), CPU, gloo, 2-rank DDP, {args.steps} steps, "
        f"rank 1 SIGKILLed after the step-{args.steps // 2} checkpoint:",
        "",
        *restart_rows(healed),
    ]
    publish("Self-healing", INTRO, lines, record=not args.no_record)


if __name__ == "__main__":
    main()
