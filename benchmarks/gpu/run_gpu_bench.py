"""GPU throughput and MFU: `dlx bench` sweeps of llama3.2-1b in bf16, with and without torch.compile, with MFU in both
conventions against the target: ≥ 55 % (attention-inclusive convention) for llama3.2-1b on an H200.

Two ways to run it, from the repository root:

  python3 benchmarks/gpu/run_gpu_bench.py --check [--out DIR]
      One shot on a lent device machine (its own torch, no network, only files under $OUT come back). Unpacks the
      wheels in benchmarks/gpu/wheels/ whose packages this Python lacks (download them first, here:
      `.venv/bin/python benchmarks/gpu/offline_deps.py download`), then runs within --budget-s (330 s): llama3.2-1b,
      bf16, seq 2048, micro-batch 4/8/16, compile off (grad accum 1 and 4: the fixed costs' share of a step) and compile
      on. Everything goes into --out (default $OUT): each sweep's bench.csv, bench.md and bench.png, run.log,
      environment.txt and entry.md. Back here, `run_gpu_bench.py --record DIR` appends DIR/entry.md to BENCHMARKS.md.
      The device call: run(command="DLX_GIT_SHA=<sha> python3 benchmarks/gpu/run_gpu_bench.py --check",
      carry=["benchmarks/gpu/wheels"], timeout_s=450).
  .venv/bin/python benchmarks/gpu/run_gpu_bench.py
      The longer sweep (llama3.2-1b and small-125m, seq 1024/2048, micro-batch 1–16, compile off and on) where dlx is
      installed with its dependencies; appends to BENCHMARKS.md, section "GPU".

--dry-run prints the commands (with --check, also the wheels it would unpack) and runs nothing. Every sweep is
`python -m dlx bench` with src/ first on PYTHONPATH, so no `dlx` script needs to exist beside the Python. The git SHA
comes from git where there is one, else from DLX_GIT_SHA (the device machine gets a copy of the tree without .git).
"""

from __future__ import annotations

import argparse
import datetime
import math
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path[:0] = [str(HERE), str(HERE.parent), str(ROOT / "src")]  # offline_deps, `peers`, and dlx from this tree
import offline_deps  # noqa: E402  (stdlib only: importable before the wheels are unpacked)

MODELS = ("llama3.2-1b", "small-125m")
MFU_TARGET = {"llama3.2-1b": 0.55}
CHECK_BUDGET_S = 330
MIN_SWEEP_S = 30
"""A sweep is not started with less time left than this (a model build alone takes seconds)."""
SECTION_INTRO = "Measured by `benchmarks/gpu/run_gpu_bench.py`; see its docstring."


@dataclass(frozen=True)
class Sweep:
    name: str
    """Its folder under the output folder."""
    argv: tuple[str, ...]
    """The `dlx` arguments, without --out."""

    def command(self, out: Path) -> list[str]:
        return [sys.executable, "-m", "dlx", *self.argv, "--out", str(out / self.name)]

    def shown(self) -> str:
        return shlex.join(["dlx", *self.argv])


def check_sweeps(steps: int, warmup: int) -> list[Sweep]:
    """The device run: compile off first (minutes are short: it finishes), then compile on."""
    common = ("--model", "llama3.2-1b", "--seq-len", "2048", "--micro-batch", "4,8,16", "--precision", "bf16")
    timing = ("--steps", str(steps), "--warmup", str(warmup))
    return [
        Sweep("llama3.2-1b", ("bench", *common, "--grad-accum", "1,4", *timing)),
        Sweep("llama3.2-1b-compile", ("bench", *common, *timing, "--compile")),
    ]


def full_sweeps(args: argparse.Namespace) -> list[Sweep]:
    sweeps = []
    for model in args.models.split(","):
        for compiled in (False, True):
            argv = ("bench", "--model", model, "--seq-len", args.seq_len, "--micro-batch", args.micro_batch)
            argv += ("--precision", "bf16", "--steps", str(args.steps), "--warmup", str(args.warmup))
            name = f"{model}-compile" if compiled else model
            sweeps.append(Sweep(name, argv + (("--compile",) if compiled else ())))
    return sweeps


def child_env(deps: Path | None) -> dict[str, str]:
    """This environment with src/ (and the unpacked wheels) on PYTHONPATH."""
    env = dict(os.environ)
    paths = [str(ROOT / "src"), str(deps) if deps else "", env.get("PYTHONPATH", "")]
    env["PYTHONPATH"] = os.pathsep.join(path for path in paths if path)
    return env


def run_within(argv: list[str], env: dict[str, str], seconds: float, log: TextIO) -> str:
    """Run argv from the repository root, its output to stdout and `log`; stopped (its whole process group) after
    `seconds`. Returns `ok`, `exit N` or `stopped at the time budget`."""
    print(f"$ {shlex.join(argv)}", file=log, flush=True)
    proc = subprocess.Popen(
        argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    pump = threading.Thread(target=_tee, args=(proc.stdout, log), daemon=True)
    pump.start()
    try:
        code = proc.wait(timeout=None if math.isinf(seconds) else max(seconds, 0.0))
    except subprocess.TimeoutExpired:
        _stop(proc)
        pump.join(timeout=5)
        return "stopped at the time budget"
    pump.join(timeout=5)
    return "ok" if code == 0 else f"exit {code}"


def _tee(stream: TextIO, log: TextIO) -> None:
    for line in stream:
        sys.stdout.write(line)
        log.write(line)
    sys.stdout.flush()
    log.flush()


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM to the sweep's process group, SIGKILL after 15 s; returns once no member of the group is left running
    (the leader's exit alone does not say its children are gone)."""
    for sig, grace in ((signal.SIGTERM, 15), (signal.SIGKILL, 5)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            proc.poll()  # reap the leader
            if not _running_members(proc.pid):
                return
            time.sleep(0.05)


def _running_members(group: int) -> list[int]:
    """The pids of this process group still running, from /proc (stdlib only: this runs before the wheels are
    unpacked; zombies, state Z, only wait for their parent's reaping)."""
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            state, _, pgrp = stat.read_text().rsplit(")", 1)[1].split()[:3]
        except (OSError, ValueError):
            continue  # exited while read
        if int(pgrp) == group and state != "Z":
            members.append(int(stat.parent.name))
    return members


def run_sweeps(sweeps: list[Sweep], out: Path, env: dict[str, str], budget_s: float, log: TextIO) -> list[str]:
    """Each sweep in turn until the budget is spent; a status per sweep. A sweep stopped midway keeps the points
    it finished (dlx bench writes bench.csv after every point)."""
    deadline = time.monotonic() + budget_s
    statuses = []
    for sweep in sweeps:
        left = deadline - time.monotonic()
        if left < MIN_SWEEP_S:
            statuses.append(f"not started: {left:.0f} s of the budget left")
            continue
        statuses.append(run_within(sweep.command(out), env, left, log))
    return statuses


def summary(rows: list[dict]) -> list[str]:
    """The best MFU per model and compile setting against the target, and the fixed costs' share by grad accum."""
    lines = []
    for model in sorted({row["model"] for row in rows}):
        for compiled in ("off", "on"):
            ok = [r for r in rows if r["model"] == model and r["compile"] == compiled and r["status"] == "ok"]
            if not ok or ok[0]["mfu"] == "":
                continue
            best = max(ok, key=lambda r: r["mfu"])
            target = MFU_TARGET.get(model)
            met = target is not None and best["mfu"] >= target
            verdict = "" if target is None else f" (target ≥ {target:.0%}: {'met' if met else 'not met'})"
            lines.append(
                f"- {model}, compile {compiled}: best MFU {best['mfu']:.1%} (dense {best['mfu_dense']:.1%})"
                f" at seq {best['seq_len']}, micro-batch {best['micro_batch']}, grad accum {best['grad_accum']}"
                + verdict
            )
            lines += fixed_cost_lines(model, compiled, ok)
    return lines


def fixed_cost_lines(model: str, compiled: str, rows: list[dict]) -> list[str]:
    """Per micro-batch measured at more than one grad accum: optimizer + weight-cast share of the step at each."""
    lines = []
    for batch in sorted({r["micro_batch"] for r in rows}):
        at = sorted((r for r in rows if r["micro_batch"] == batch and r["optimizer_pct"] != ""), key=_accum)
        if len(at) > 1:
            shares = ", ".join(
                f"{r['optimizer_pct'] + r['weight_cast_pct']:.1f} % at grad accum {r['grad_accum']}" for r in at
            )
            lines.append(f"  - fixed costs (optimizer + autocast weight casts), micro-batch {batch}: {shares}")
    return lines


def _accum(row: dict) -> int:
    return row["grad_accum"]


def entry_lines(sweeps: list[Sweep], statuses: list[str], out: Path, header: list[str], title: str) -> list[str]:
    """The BENCHMARKS.md entry: header, the sweeps and how each ended, the summary and the tables."""
    from dlx.bench.results import markdown_table, read_rows
    from dlx.bench.sweep import CSV_NAME

    rows = [row for sweep in sweeps for row in read_rows(out / sweep.name / CSV_NAME)]
    stamp = f"### {datetime.datetime.now().astimezone():%Y-%m-%d %H:%M %Z} — {title}"
    ran = [f"- `{sweep.shown()}`: {status}" for sweep, status in zip(sweeps, statuses, strict=True)]
    head = [stamp, "", *header, "- the sweeps it ran:", *ran, "", *(summary(rows) or ["- no point was measured"])]
    return markdown_table(rows, head).splitlines()


def device_environment(env: dict[str, str]) -> list[str]:
    """torch, CUDA, the GPUs, Triton and the C compiler Triton builds its launcher with, as lines for the entry."""
    probe = (
        "import torch; print(f'- torch {torch.__version__}, CUDA {torch.version.cuda}, '"
        "f'{torch.cuda.device_count()} GPU(s): {torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}')"
    )
    lines = [subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True).stdout.strip()]
    try:
        import triton

        lines.append(f"- triton {triton.__version__}")
    except ImportError:
        lines.append("- triton: not installed (torch.compile cannot build GPU kernels)")
    compilers = [name for name in ("cc", "gcc", "clang") if shutil.which(name)]
    lines.append(f"- C compiler for Triton's launcher: {', '.join(compilers) or 'none found (CC unset)'}")
    return [line for line in lines if line]


def prepare_check(wheels: Path, dry_run: bool) -> Path | None:
    """Unpack the missing wheels (printing the plan); returns the folder to put on PYTHONPATH."""
    plan = offline_deps.unpack_plan(wheels) if wheels.is_dir() else []
    for wheel, present in plan:
        print(f"wheel {wheel.name}: {'present (' + present + '), kept' if present else 'missing here, unpacked'}")
    if not plan:
        print(f"no wheels in {wheels}: using this Python's packages as they are")
    if dry_run or not plan:
        return None
    deps = Path(tempfile.mkdtemp(prefix="dlx-deps-"))
    offline_deps.unpack_missing(wheels, deps)
    sys.path.insert(0, str(deps))
    return deps


def check_imports(env: dict[str, str]) -> str | None:
    """None when `dlx bench` can import all it needs here; else the last line of the ImportError."""
    probe = "import dlx.cli.app, dlx.cli.bench_commands, dlx.bench.command, dlx.bench.plot, matplotlib"
    result = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, cwd=ROOT)
    return None if result.returncode == 0 else (result.stderr.strip().splitlines() or ["unknown error"])[-1]


def run_check(args: argparse.Namespace) -> int:
    """The one-shot device run; returns the exit status."""
    out = args.out or (Path(os.environ["OUT"]) if os.environ.get("OUT") else None)
    if out is None:
        return fail("--check needs --out DIR or $OUT (the folder whose files come back)")
    sweeps = check_sweeps(args.check_steps, args.check_warmup)
    if args.dry_run:
        prepare_check(args.wheels, dry_run=True)
        print("\n".join(shlex.join(sweep.command(out)) for sweep in sweeps))
        return 0
    out.mkdir(parents=True, exist_ok=True)
    env = child_env(prepare_check(args.wheels, dry_run=False))
    problem = check_imports(env)
    if problem is not None:
        return fail(f"dlx cannot import its dependencies here ({problem}); run offline_deps.py download first")
    import torch

    if not torch.cuda.is_available():
        return fail("no CUDA device here; --check measures a GPU (--dry-run prints its commands)")
    from peers.record import environment

    header = [*environment(["src/dlx", "benchmarks/gpu"]), *device_environment(env)]
    (out / "environment.txt").write_text("\n".join(header) + "\n")
    with open(out / "run.log", "w") as log:
        statuses = run_sweeps(sweeps, out, env, args.budget_s, log)
    lines = entry_lines(sweeps, statuses, out, header, "lent device, `run_gpu_bench.py --check`")
    (out / "entry.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


def run_full(args: argparse.Namespace) -> int:
    sweeps = full_sweeps(args)
    if args.dry_run:
        print("\n".join(shlex.join(sweep.command(args.out)) for sweep in sweeps))
        return 0
    import torch

    if not torch.cuda.is_available():
        return fail("no CUDA device here; this benchmark measures GPUs (--dry-run prints its commands)")
    from peers.record import environment, record_section

    header = environment(["src/dlx", "benchmarks/gpu"])
    args.out.mkdir(parents=True, exist_ok=True)
    with open(args.out / "run.log", "w") as log:
        statuses = run_sweeps(sweeps, args.out, child_env(None), math.inf, log)
    lines = entry_lines(sweeps, statuses, args.out, header, "full sweep")
    print("\n".join(lines))
    if not args.no_record:
        record_section("GPU", SECTION_INTRO, lines)
    return 0


def record(folder: Path, benchmarks: Path | None = None) -> int:
    """Append a device run's entry.md (fetched from its $OUT) to BENCHMARKS.md (or `benchmarks`), section GPU."""
    from peers.record import BENCHMARKS_MD, record_section

    entry = folder / "entry.md"
    if not entry.is_file():
        return fail(f"{entry} does not exist; give the folder the device run's files were fetched into")
    record_section("GPU", SECTION_INTRO, entry.read_text().splitlines(), path=benchmarks or BENCHMARKS_MD)
    print(f"appended {entry} to {benchmarks or BENCHMARKS_MD}, section GPU")
    return 0


def fail(message: str) -> int:
    """One line on stderr; the exit status for bad input or a machine that cannot run this."""
    print(f"error: {message}", file=sys.stderr)
    return 2


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="the one-shot device run (see the docstring)")
    parser.add_argument("--record", type=Path, metavar="DIR", help="append DIR/entry.md to BENCHMARKS.md")
    parser.add_argument("--dry-run", action="store_true", help="print what would run and exit")
    parser.add_argument("--wheels", type=Path, default=offline_deps.WHEELS, help="--check: the downloaded wheels")
    parser.add_argument("--budget-s", type=float, default=CHECK_BUDGET_S, help="--check: seconds for all sweeps")
    parser.add_argument("--check-steps", type=int, default=5, help="--check: timed steps per point")
    parser.add_argument("--check-warmup", type=int, default=2, help="--check: untimed steps per point (compilation)")
    parser.add_argument("--models", default=",".join(MODELS), help="comma-separated presets")
    parser.add_argument("--seq-len", default="1024,2048")
    parser.add_argument("--micro-batch", default="1,2,4,8,16")
    parser.add_argument("--steps", type=int, default=10, help="timed steps per point")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps per point (covers compilation)")
    parser.add_argument("--out", type=Path, default=None, help="output folder (--check: default $OUT)")
    parser.add_argument("--no-record", action="store_true", help="print only; do not append to BENCHMARKS.md")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.record is not None:
        return record(args.record)
    if args.check:
        return run_check(args)
    args.out = args.out or ROOT / "runs" / "gpu-bench"
    return run_full(args)


if __name__ == "__main__":
    sys.exit(main())
