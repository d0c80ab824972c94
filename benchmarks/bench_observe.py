"""Observability costs: W&B logging (offline) and NVML sampling on step time, and a 2-step profile of the demo.

Part 1, in one process, interleaved rounds: the embedded demo's recipe (its model and data) trained `--steps` steps
per run with `log.every 1` (a record every step, the worst case for the loggers), under settings that take turns
round by round, so that the load other processes put on the machine hits all alike:

    files   metrics.jsonl and eval.jsonl only: the baseline
    wandb   + Weights & Biases, WANDB_MODE=offline (wandb's service process writes RUN/wandb/)
    nvml    + the GPU counters' sampling thread (every 0.2 s) and a GPM window per record, on a FAKE pynvml: on a
            CPU there is no NVML, so this measures dlx's side (the thread waking, the lock, the per-record window),
            not the driver call, which is unmeasured here

A run's figures are the median and the minimum `step_s` of its records after `--warmup` steps (`step_s` includes the
logging of the previous record: it is the wall time between two `end_step`s; the minimum is the step least disturbed
by other processes), and the median CPU time the training thread spent between two `end_step`s (the step and the
logging after it; what other processes do on a shared machine moves it far less than wall time); a round's ratio is
setting ÷ files of that round. Also measured directly: the cost of one record logged with and without W&B
(`MetricsLogger.log`, then W&B's observer), the CPU time of W&B's service processes (wandb-core and its system
monitor, which run beside training), and what the sampling thread and one counters window cost.

Part 2: the demo's recipe with `profile.start 3`, `profile.steps 2`, once without and once with Python stacks: the
trace's size, the time to stop the profiler and write the trace and tables (outside any step), and the profiled
steps' step time against the median of the others.

Run:  .venv/bin/python benchmarks/bench_observe.py    (appends to BENCHMARKS.md; --no-record to only print)
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import io
import itertools
import json
import os
import statistics
import tempfile
import time
import types
from pathlib import Path

import psutil

from dlx.metrics import gpu_monitor
from dlx.metrics.logger import MetricsLogger
from dlx.metrics.timing import PhaseTimer
from dlx.train.config import build_config
from dlx.train.demo import DEMO_DATA, demo_recipe, prepare_demo_data
from dlx.train.loop.trainer import pretrain
from dlx.train.observers import build as observe
from peers.contenders import spread
from peers.record import environment, record_section

SETTINGS = ("files", "wandb", "nvml")


class FakeNvml(types.ModuleType):
    """The pynvml names dlx calls, answering at once (a real NVML read goes to the driver: not measured here)."""

    class NVMLError(Exception):
        pass

    NVML_SUCCESS = 0
    NVML_GPM_METRICS_GET_VERSION = 1

    def __init__(self) -> None:
        super().__init__("pynvml")
        for slot, name in enumerate(gpu_monitor.GPM_METRICS.values()):
            setattr(self, name, slot)

    def nvmlInit(self):
        pass

    def nvmlShutdown(self):
        pass

    def nvmlDeviceGetHandleByIndex(self, index):
        return index

    def nvmlDeviceGetUtilizationRates(self, handle):
        return types.SimpleNamespace(gpu=97, memory=41)

    def nvmlGpmQueryDeviceSupport(self, handle):
        return types.SimpleNamespace(isSupportedDevice=1)

    def nvmlGpmSampleAlloc(self):
        return object()

    def nvmlGpmSampleGet(self, handle, sample):
        pass

    def nvmlGpmSampleFree(self, sample):
        pass

    def c_nvmlGpmMetricsGet_t(self):
        metrics = [types.SimpleNamespace(metricId=0, value=50.0, nvmlReturn=0) for _ in gpu_monitor.GPM_METRICS]
        return types.SimpleNamespace(version=0, numMetrics=0, sample1=None, sample2=None, metrics=metrics)

    def nvmlGpmMetricsGet(self, request):
        return request


def recipe(data: Path, steps: int, **sections: dict) -> dict:
    from dlx.data.shards import read_manifest

    raw = demo_recipe(read_manifest(data).vocab_size)
    raw["data"]["path"] = str(data)
    raw["train"]["max_steps"] = steps
    raw["eval"] = {"every": 0}
    raw["checkpoint"] = {"every": 0, "keep_last": 1}
    raw["log"] = {"every": 1, "progress": False}
    for section, values in sections.items():
        raw.setdefault(section, {}).update(values)
    return raw


def train_quietly(raw: dict, run_dir: Path) -> list[dict]:
    """One run, its console output swallowed; returns its records."""
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        result = pretrain(build_config(raw), "bench", run_dir)
    return result.records


def service_cpu_s() -> float:
    """CPU seconds used so far by this process's children (W&B's service processes once a W&B run has started)."""
    total = 0.0
    for child in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.NoSuchProcess):
            times = child.cpu_times()
            total += times.user + times.system
    return total


def one_run(setting: str, data: Path, steps: int, warmup: int, run_dir: Path) -> dict[str, float]:
    """Median and minimum step_s of the records after `warmup`, the median CPU time of the training thread per step
    (between two `end_step`s: the step and the logging after it), the run's wall time and its children's CPU time."""
    real_open, real_end_step = observe.open_gpu_counters, PhaseTimer.end_step
    if setting == "nvml":  # the CPU has no NVML: counters on the fake, as on a GPU they would be opened
        observe.open_gpu_counters = lambda device, enabled=True: gpu_monitor.NvmlCounters(FakeNvml(), 0)
    thread_cpu: list[float] = []

    def end_step(timer: PhaseTimer) -> dict[str, float]:
        thread_cpu.append(time.thread_time())
        return real_end_step(timer)

    PhaseTimer.end_step = end_step
    cpu_before, start = service_cpu_s(), time.perf_counter()
    try:
        log = {"wandb": setting == "wandb", "wandb_project": "dlx-bench"}
        records = train_quietly(recipe(data, steps, log=log), run_dir)
    finally:
        observe.open_gpu_counters, PhaseTimer.end_step = real_open, real_end_step
    if setting == "nvml":
        assert records[-1]["gpu_util_pct"] == 97.0, "the counters did not reach the records"
    step_s = [r["step_s"] for r in records[warmup:]]
    step_cpu = [b - a for a, b in itertools.pairwise(thread_cpu[warmup:])]
    wall_s, service_s = time.perf_counter() - start, service_cpu_s() - cpu_before
    return {
        "median": statistics.median(step_s),
        "min": min(step_s),
        "cpu": statistics.median(step_cpu),
        "wall": wall_s,
        "service_cpu": service_s,
    }


def overhead_rounds(data: Path, rounds: int, steps: int, warmup: int, tmp: Path) -> dict[str, list[dict]]:
    results: dict[str, list[dict]] = {s: [] for s in SETTINGS}
    for round_index in range(rounds):
        order = SETTINGS[round_index % 3 :] + SETTINGS[: round_index % 3]  # the order rotates
        for setting in order:
            run = one_run(setting, data, steps, warmup, tmp / f"{setting}-{round_index}")
            results[setting].append(run)
            print(
                f"round {round_index + 1}/{rounds} {setting}: step median {1e3 * run['median']:.1f} ms, "
                f"min {1e3 * run['min']:.1f} ms, training-thread CPU {1e3 * run['cpu']:.1f} ms",
                flush=True,
            )
    return results


def log_call_cost(tmp: Path, records: int = 300) -> dict[str, float]:
    """Seconds per record logged: files only (MetricsLogger.log), and files + W&B offline (its observer's
    `on_record`: wandb.log of ~20 numbers)."""
    from dlx.metrics.wandb_sink import WandbSink

    record = {"step": 0, "loss": 3.5, "lr": 1e-3, **{f"phase{i}_s": 0.01 * i for i in range(18)}}
    costs = {}
    for setting in ("files", "wandb"):
        folder = tmp / f"log-{setting}"
        folder.mkdir()
        sink = WandbSink(folder, "dlx-bench", "log-cost", {}, print) if setting == "wandb" else None
        observer = observe.WandbObserver(sink)
        with MetricsLogger(folder) as logger:
            start = time.perf_counter()
            for step in range(1, records + 1):
                logger.log({**record, "step": step})
                observer.on_record({**record, "step": step})
            costs[setting] = (time.perf_counter() - start) / records
        observer.close()
    return costs


def nvml_costs(seconds: float = 5.0, windows: int = 2000) -> dict[str, float]:
    """dlx's side of the GPU counters on the fake: CPU seconds per second the sampling thread takes while the main
    thread sleeps (process CPU time, all threads), and seconds per `window()` call (one per record)."""
    idle_start = time.process_time()
    time.sleep(seconds)
    idle = time.process_time() - idle_start
    counters = gpu_monitor.NvmlCounters(FakeNvml(), 0)
    try:
        start = time.process_time()
        time.sleep(seconds)
        sampling = time.process_time() - start
        start = time.perf_counter()
        for _ in range(windows):
            counters.window()
        window_s = (time.perf_counter() - start) / windows
    finally:
        counters.close()
    return {"thread_cpu_per_s": max(sampling - idle, 0.0) / seconds, "window_s": window_s}


def profile_runs(data: Path, steps: int, tmp: Path) -> list[dict]:
    """The demo with steps 3 and 4 profiled, without and with stacks: trace size, finish time, step times."""
    rows = []
    for with_stack in (False, True):
        run_dir = tmp / f"profile-{with_stack}"
        profile = {"start": 3, "steps": 2, "with_stack": with_stack}
        records = train_quietly(recipe(data, steps, profile=profile), run_dir)
        top = json.loads((run_dir / "profile" / "rank0-top_ops.json").read_text())
        profiled = [r["step_s"] for r in records if r.get("profiled_steps")]
        others = [r["step_s"] for r in records[1:] if not r.get("profiled_steps")]
        rows.append(
            {
                "with_stack": with_stack,
                "trace_mb": top["trace_bytes"] / 1e6,
                "finish_s": top["finish_s"],
                "profiled_ms": [1e3 * s for s in profiled],
                "others_ms": 1e3 * statistics.median(others),
                "top": top["ops"][:3],
            }
        )
    return rows


def ratios(results: dict[str, list[dict]], setting: str, figure: str) -> list[float]:
    return [run[figure] / base[figure] for run, base in zip(results[setting], results["files"], strict=True)]


def report(
    results: dict[str, list[dict]], costs: dict[str, float], nvml: dict[str, float], profiles: list[dict]
) -> list[str]:
    lines = [
        "| setting | step ms, median of runs (median / min step; thread CPU) | ÷ files per round: median step "
        "| min step | training-thread CPU per step |",
        "|---|---|---|---|---|",
    ]
    for setting, runs in results.items():
        median_ms, min_ms, cpu_ms = (1e3 * statistics.median(r[k] for r in runs) for k in ("median", "min", "cpu"))
        per_round = " | ".join(spread(ratios(results, setting, figure)) for figure in ("median", "min", "cpu"))
        lines.append(f"| {setting} | {median_ms:.0f} / {min_ms:.0f}; {cpu_ms:.0f} | {per_round} |")
    service = sum(r["service_cpu"] for r in results["wandb"]) / sum(r["wall"] for r in results["wandb"])
    step_ms = 1e3 * statistics.median(r["median"] for r in results["files"])
    extra_us = 1e6 * (costs["wandb"] - costs["files"])
    lines += [
        "",
        f"One record logged: files {1e6 * costs['files']:.0f} µs, files + W&B offline "
        f"{1e6 * costs['wandb']:.0f} µs: W&B adds {extra_us:.0f} µs per record = "
        f"{100 * extra_us / 1e3 / step_ms:.3f} % of a {step_ms:.0f} ms demo step at log.every 1. W&B's service "
        f"processes used {100 * service:.2f} % of one core over the W&B runs (CPU seconds ÷ wall seconds).",
        "",
        f"GPU counters on the fake pynvml: the sampling thread used {1e6 * nvml['thread_cpu_per_s']:.0f} µs of CPU "
        f"per second ({100 * nvml['thread_cpu_per_s']:.3f} % of a core); one `window()` (per record) took "
        f"{1e6 * nvml['window_s']:.1f} µs. The real NVML calls are not in these figures (no GPU here).",
        "",
        "2-step profile of the demo (steps 3 and 4 of the demo recipe, log.every 1):",
        "",
        "| stacks | trace MB | stop + write s (outside the steps) | profiled steps ms | other steps ms (median) |",
        "|---|---:|---:|---|---:|",
    ]
    for row in profiles:
        profiled = ", ".join(f"{ms:.0f}" for ms in row["profiled_ms"])
        lines.append(
            f"| {'with' if row['with_stack'] else 'without'} | {row['trace_mb']:.1f} | {row['finish_s']:.2f} | "
            f"{profiled} | {row['others_ms']:.0f} |"
        )
    top = ", ".join(f"`{op['name']}` {op['self_pct']:.0f} %" for op in profiles[0]["top"])
    lines += ["", f"Top ops by self host time (without stacks): {top}."]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds of the three settings")
    parser.add_argument("--steps", type=int, default=8, help="optimizer steps per run")
    parser.add_argument("--warmup", type=int, default=3, help="records left out of each run's median")
    parser.add_argument("--data", type=Path, default=DEMO_DATA, help="the demo's dataset (prepared when missing)")
    parser.add_argument("--no-record", action="store_true", help="print only; do not append to BENCHMARKS.md")
    args = parser.parse_args()
    os.environ["WANDB_MODE"] = "offline"
    os.environ.setdefault("WANDB_SILENT", "true")
    header = environment(["src/dlx/metrics", "src/dlx/train", "benchmarks/bench_observe.py"])
    prepare_demo_data(args.data)
    with tempfile.TemporaryDirectory(prefix="dlx-bench-observe-") as tmp:
        results = overhead_rounds(args.data, args.rounds, args.steps, args.warmup, Path(tmp))
        costs = log_call_cost(Path(tmp))
        nvml = nvml_costs()
        profiles = profile_runs(args.data, 8, Path(tmp))
    import wandb

    lines = [
        f"### {datetime.datetime.now().astimezone():%Y-%m-%d %H:%M %Z}",
        "",
        *header,
        f"- wandb {wandb.__version__} (offline); NVML: a fake pynvml (no GPU here), so the nvml row is dlx's own cost",
        "",
        f"Demo recipe (demo preset, seq 256, micro-batch 8, fp32 on this CPU), {args.steps} steps per run, median "
        f"step after {args.warmup}, log.every 1, {args.rounds} interleaved rounds.",
        "",
        *report(results, costs, nvml, profiles),
    ]
    print("\n".join(lines))
    if not args.no_record:
        intro = (
            "What observing a run costs: W&B logging and NVML sampling on step time (target ≤ 1 %), and the size and "
            "time of a 2-step profile. Program: `benchmarks/bench_observe.py`."
        )
        record_section("Observability", intro, lines)


if __name__ == "__main__":
    main()
