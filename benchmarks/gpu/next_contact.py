"""The second device session in one call: is `dlx pretrain` itself at 60 % MFU, and against what? Side by side in one
run on one GPU: the ceilings (a large bf16 matmul, every GEMM of one llama3.2-1b step at its real shape, the attention
kernels, the AdamW floor), `dlx pretrain` llama3.2-1b bf16 seq 2048 micro-batch 8 compiled for 30 steps with
TORCH_LOGS=graph_breaks,recompiles, a bare PyTorch loop on the same model and batch, the same run in float8
(torchao, tensorwise), HF LlamaForCausalLM compiled on the same shape, and the seed's table row (fp32, micro-batch 16,
seq 1024, activation checkpointing) for HF Trainer and dlx with `dlx plan`'s estimate, then the comparisons of ROWS:
dlx against torchtitan (peers/side_by_side.py: a `dlx pretrain` run's `train_loop`, then torchtitan's own Trainer
holding the same initial weights, first losses checked equal, llama3.2-1b bf16 compiled at seq 2048, micro-batch 24,
3 warm-up + 8 timed steps each). It prints a table against the targets and writes it into --out ($OUT). The pretrain
runs keep train.attention auto: each times the attention kernels at its own shape before step 1 and applies the
fastest; the table quotes the bf16 run's header line beside the ceilings' own timing. The bare loop applies the kernel
auto picks too, so dlx ÷ bare is the rest of the step.

On a lent device machine (its own torch, no network, only what is under $OUT comes back), from the repository root:

    run(command="DLX_GIT_SHA=<sha> python3 benchmarks/gpu/next_contact.py", carry=["benchmarks/gpu/wheels"],
        timeout_s=600)

benchmarks/gpu/wheels must then hold what `offline_deps.py download` fetches: dlx's own dependencies and torchao
(the `float8` extra, 3.4 MB, one abi3 wheel whose kernels are torch's and Triton's; the H200 image of 2026-12-04 had
torch 2.11, transformers 5.17 and accelerate 1.15, no torchao; torchao 0.18 needs torch >= 2.11) and torchtitan 0.3.0
with the four dependencies its trainer imports (1.7 MB; 62.0 MB in all, of the 67.1 MB the carry takes). A step
whose imports fail says so in its last line and the others run. Each step has its own time limit (`steps`, 570 s in
all), so that one that hangs cannot eat the others'; the eight fixed steps' limits were trimmed from 570 s to 470 s
to make room for the torchtitan row's 100 s. None has run on a GPU yet: the limits are estimates from first_contact's
timings, and the first run shows which are tight. Files brought back (at most 8): results.json (every step's status
and figures), table.md, steps.log, summary.txt, the two pretrain runs' metrics.jsonl.

`--dry-run` runs every step on the CPU with the debug model, no compile, in seconds: the same code paths, float8 and
torchtitan included (torch >= 2.11 runs float8 matmuls on a CPU with oneDNN's reference kernel, about a second a step
here; without torchao that step is refused in one line and the others run). `--only a,b` reruns chosen steps.

The rows of later device calls (`call` 2 or 3 in ROWS) run only when `--only` names them, so each call stays within
its 9.5 minutes: the second, the context-parallel path at degree 1, `dlx tune` and a stage boundary of data.stages;
the third, the first step (cold, warm from the compile cache, resumed; evaluations under compile) and
checkpoint.async's cost to the next step:

    run(command="DLX_GIT_SHA=<sha> python3 benchmarks/gpu/next_contact.py --only cp-path,tune,stages",
        carry=["benchmarks/gpu/wheels"], timeout_s=600)
    run(command="DLX_GIT_SHA=<sha> python3 benchmarks/gpu/next_contact.py --only first-step,async-save",
        carry=["benchmarks/gpu/wheels"], timeout_s=600)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE)]
import offline_deps  # noqa: E402
import run_gpu_bench  # noqa: E402  (puts src/ and benchmarks/ on sys.path)

ROOT = run_gpu_bench.ROOT
TARGETS = {"mfu": 0.60, "bare": 0.98, "hf": 1.15, "float8": 1.10, "float8_loss": 0.02, "plan": 0.15, "titan": 1.05}
TARGETS |= {"cp_path": 0.97, "tune_mfu": 0.576, "tune_s": 600.0, "stage_extra": 1.0}
TORCH_LOGS = "graph_breaks,recompiles"
SEED_ROW = "the seed's row (its A100: HF Trainer 8.9 s/it, 42.73 GB)"


def pretrain_args(dry: bool, seed_row: bool = False) -> list[str]:
    """`dlx pretrain` overrides: the 1B bf16 compiled run, or the seed's fp32 row; the debug model when dry."""
    model, seq, batch, steps = ("debug", 32, 2, 3) if dry else ("llama3.2-1b", 2048, 8, 30)
    precision, every, compiled = "bf16", 1 if dry else 10, not dry
    if seed_row:
        seq, batch, steps, precision, every, compiled = (32 if dry else 1024), 16, (2 if dry else 5), "fp32", 1, False
    argv = ["--model.preset", model, "--model.max_seq_len", str(seq), "--data.seq_len", str(seq)]
    argv += ["--data.micro_batch_size", str(batch), "--train.precision", precision, "--train.max_steps", str(steps)]
    argv += ["--train.compile", str(compiled).lower(), "--log.every", str(every), "--log.progress", "false"]
    argv += ["--train.warmup_ratio", "0", "--checkpoint.keep_last", "1"]
    # no evaluation: its no-grad forward is a graph of its own, compiled once at the first evaluation, which
    # TORCH_LOGS would count as a recompile of the training step's function (tests/integration/test_compile.py pins
    # both)
    argv += ["--eval.every", "0"]
    if seed_row:
        argv += ["--parallel.activation_checkpointing", "full"]
    return argv


DRY_STEP_S = 180
"""A dry run's limit per step: a CPU shared with other work starts a Python with torch in seconds to a minute."""


@dataclass(frozen=True)
class Row:
    """One comparison added to the table: the step that measures it (its argv, its time limit) and how the table
    judges what it wrote to WORK/<step>.json. Adding a comparison is one entry of ROWS."""

    step: str
    argv: Callable[[Path, bool], list[str]]
    """(work folder, dry run) -> the command; it writes work / f"{step}.json"."""
    seconds: float
    judge: Callable[[dict], tuple[str, str, str, str]]
    """The step's figures ({} when it failed) -> (measure, value, target, verdict)."""
    detail: Callable[[dict], list[str]] = lambda figures: []
    """The step's figures -> lines shown below the table (the figures behind the verdict)."""
    call: int = 1
    """The device call that runs it: 1, the first; 2 or 3 only when `--only` names it (a later call), so that each
    call stays within 9.5 minutes. A dry run runs every row."""


def side_by_side_argv(work: Path, dry: bool) -> list[str]:
    """peers/side_by_side.py: dlx then torchtitan at dlx's best measured shape (the debug model when dry)."""
    argv = [sys.executable, str(ROOT / "benchmarks" / "peers" / "side_by_side.py"), "dry" if dry else "llama3.2-1b"]
    argv += ["--steps", "2" if dry else "8", "--warmup", "1" if dry else "3"]
    return [*argv, "--out", str(work / f"{TITAN}.json")]


def titan_row(figures: dict) -> tuple[str, str, str, str]:
    value = figures.get("dlx_over_titan")
    shown = "—" if value is None else f"{value:.3f}"
    measure = "dlx ÷ torchtitan, tokens/s (llama3.2-1b bf16 compiled, seq 2048, micro-batch 24)"
    return (measure, shown, f"≥ {TARGETS['titan']:.2f}", verdict(value, (value or 0) >= TARGETS["titan"]))


def titan_detail(figures: dict) -> list[str]:
    """Each contender's tokens/s and peak memory (CUDA: the allocator's; CPU: the process's resident set), and the
    first losses the run checked before timing."""
    contenders = figures.get("contenders") or {}
    if not contenders:
        return []
    peak = {kind: c["peak_mem_gb"] if "peak_mem_gb" in c else c["rss_peak_gb"] for kind, c in contenders.items()}
    speeds = "; ".join(
        f"{kind} {c['tokens_per_s']:,.0f} tokens/s, peak {peak[kind]:.1f} GB" for kind, c in contenders.items()
    )
    losses = f"first losses dlx {figures['dlx_first_loss']:.5f}, torchtitan {contenders[TITAN]['first_loss']:.5f}"
    return [f"- dlx against torchtitan: {speeds}; {losses}"]


def wave_argv(step: str) -> Callable[[Path, bool], list[str]]:
    """wave_rows.py's worker for `step`, writing work / f"{step}.json"."""
    return lambda work, dry: [
        sys.executable,
        str(HERE / "wave_rows.py"),
        step,
        "dry" if dry else "gpu",
        str(work / f"{step}.json"),
    ]


def cp_path_row(figures: dict) -> tuple[str, str, str, str]:
    value = figures.get("cp_over_plain")
    measure = "context-parallel path at degree 1 ÷ plain path, tokens/s (llama3.2-1b bf16 compiled, 16,384 tokens)"
    return (
        measure,
        shown(value, ".3f"),
        f"≥ {TARGETS['cp_path']:.2f}",
        verdict(value, (value or 0) >= TARGETS["cp_path"]),
    )


def tune_row(figures: dict) -> tuple[str, str, str, str]:
    mfu, seconds = figures.get("mfu"), figures.get("seconds")
    value = None if mfu is None or seconds is None else f"{mfu:.1%} in {seconds:.0f} s"
    met = mfu is not None and mfu >= TARGETS["tune_mfu"] and (seconds or 0) <= TARGETS["tune_s"]
    target = f"≥ {TARGETS['tune_mfu']:.1%} MFU in ≤ {TARGETS['tune_s']:.0f} s"
    measure = "dlx tune recipes/llama3.2-1b.yaml: the winner's MFU, unattended"
    return (measure, value or "—", target, verdict(mfu, met))


def tune_detail(figures: dict) -> list[str]:
    if not figures:
        return []
    return [
        f"- dlx tune's winner: {figures['label']}, {figures['tokens_per_s'] or 0:,.0f} tokens/s; "
        f"{figures['candidates']} candidates, measured: {figures['measured']}"
    ]


def stages_row(figures: dict) -> tuple[str, str, str, str]:
    value = figures.get("extra_steps")
    measure = "stage boundary (seq_len 2,048 → 4,096, RoPE): the crossing step's extra time, in normal steps (1B bf16)"
    target = f"< {TARGETS['stage_extra']:.0f} step"
    return (measure, shown(value, ".2f"), target, verdict(value, value is not None and value < TARGETS["stage_extra"]))


def stages_detail(figures: dict) -> list[str]:
    if not figures:
        return []
    crossing, wait = figures["crossing_s"], figures["crossing_data_wait_s"]
    before, after = figures["stage0_median_s"], figures["stage1_median_s"]
    return [
        f"- stage boundary: crossing step {crossing:.3f} s (data wait {wait:.4f} s); median steps {before:.3f} s at "
        f"2,048 tokens, {after:.3f} s at 4,096"
    ]


def first_step_judge(figures: dict) -> tuple[str, str, str, str]:
    cases = figures.get("first_step") or {}
    seconds = {case: row.get("to_first_step_s") for case, row in cases.items()}
    value = "—" if not seconds else " / ".join(shown(seconds.get(c), ".1f") for c in ("cold", "warm", "resumed"))
    warm, cold = seconds.get("warm"), seconds.get("cold")
    measure = "launch → first logged step, s: cold / warm / resumed (llama3.2-1b bf16 compiled, seq 2048, micro 8)"
    return (measure, value, "warm < cold", verdict(warm, warm is not None and cold is not None and warm < cold))


def first_step_detail(figures: dict) -> list[str]:
    if not figures:
        return []
    headers = "; ".join(f"{case}: {row['header']}" for case, row in (figures.get("first_step") or {}).items())
    evals = ", ".join(f"{s:.1f}" for s in figures.get("eval_s", []))
    named = "; ".join(figures.get("eval_recompiles", [])) or "none"
    return [f"- first step, the header's compile line: {headers}", f"- evaluations compiled, s: {evals}; "
            f"recompiles named: {named}"]  # fmt: skip


def async_save_judge(figures: dict) -> tuple[str, str, str, str]:
    async_save = figures.get("async") or {}
    slowdown = async_save.get("later_next_step_slowdown", async_save.get("next_step_slowdown"))
    measure = "checkpoint.async: the step after a later save ÷ a steady step − 1 (llama3.2-1b bf16, fsdp on 1 GPU)"
    return (measure, shown(slowdown, "+.1%"), "≤ +10 %", verdict(slowdown, (slowdown or 0) <= 0.10))


def async_save_detail(figures: dict) -> list[str]:
    return [
        f"- {mode} save: the first blocks {s['blocking_s']:.2f} s, next step {s['next_step_slowdown']:+.1%}; a later "
        f"one {s.get('later_blocking_s', float('nan')):.2f} s, next step {s.get('later_next_step_slowdown', 0):+.1%}; "
        f"steady step {s['steady_step_s']:.2f} s"
        for mode, s in figures.items()
    ]


TITAN = "torchtitan"
ROWS = [
    Row(TITAN, side_by_side_argv, 100, titan_row, titan_detail),
    Row("cp-path", wave_argv("cp-path"), 180, cp_path_row, call=2),
    Row("tune", wave_argv("tune"), 240, tune_row, tune_detail, call=2),
    Row("stages", wave_argv("stages"), 150, stages_row, stages_detail, call=2),
    Row("first-step", wave_argv("first-step"), 330, first_step_judge, first_step_detail, call=3),
    Row("async-save", wave_argv("async-save"), 200, async_save_judge, async_save_detail, call=3),
]
"""The comparisons run after the eight fixed steps, in this order."""


def steps(work: Path, dry: bool, later: bool = False) -> list[tuple[str, list[str], float]]:
    """(name, argv, seconds allowed) in the order they run; the most wanted figures first, then ROWS (with `later`,
    the second call's rows too)."""
    python, shape = sys.executable, "dry" if dry else "gpu"
    worker = [python, str(HERE / "next_steps.py")]
    pretrain = [python, "-m", "dlx", "pretrain", "--run-dir"]
    plan = [python, "-m", "dlx", "plan", "debug" if dry else "llama3.2-1b", "--seq-len", "32" if dry else "1024"]
    plan += ["--micro-batch", "16", "--precision", "fp32", "--activation-checkpointing", "full", "--json"]
    chosen = [
        ("ceilings", [*worker, "ceilings", shape, str(work / "ceilings.json")], 40),
        ("pretrain-bf16", [*pretrain, str(work / "bf16"), *pretrain_args(dry)], 120),
        ("bare", [*worker, "bare", shape, str(work / "bare.json")], 55),
        ("pretrain-float8", [*pretrain, str(work / "float8"), *pretrain_args(dry), "--train.float8", "true"], 95),
        ("hf-compiled", [*worker, "hf-compiled", shape, str(work / "hf-compiled.json")], 65),
        ("seed-dlx", [*pretrain, str(work / "seed-dlx"), *pretrain_args(dry, seed_row=True)], 45),
        ("seed-hf", [*worker, "seed-hf", shape, str(work / "seed-hf.json")], 40),
        ("plan", plan, 10),
    ]
    chosen += [(row.step, row.argv(work, dry), row.seconds) for row in ROWS if row.call == 1 or dry or later]
    return [(name, argv, DRY_STEP_S if dry else seconds) for name, argv, seconds in chosen]


def records(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]


def pretrain_figures(run: Path, log_text: str) -> dict:
    """MFU per window, tokens/s after the first window (compile), the last loss, what Dynamo logged, and the
    header's attention line (the kernel train.attention auto measured and applied)."""
    rows = records(run)
    steady = rows[1:] or rows
    attention = [line.strip() for line in log_text.splitlines() if line.strip().startswith("attention:")]
    return {
        "attention": attention[0] if attention else None,  # the header's: train.attention auto's measured pick
        "mfu_windows": [r["mfu"] for r in rows],
        "tokens_per_s": statistics.median(r["tokens_per_s"] for r in steady),
        "peak_mem_gb": max(r["peak_mem_gb"] for r in rows),
        "it_per_s": 1 / statistics.median(r["step_s"] for r in steady),
        "loss": rows[-1]["loss"],
        "step": rows[-1]["step"],
        "graph_breaks": log_text.count("Graph break"),
        "recompiles": log_text.count("Recompiling function"),
    }


def figures(name: str, work: Path, log_text: str) -> dict:
    """What a finished step measured, read from what it wrote."""
    if name in ("pretrain-bf16", "pretrain-float8", "seed-dlx"):
        return pretrain_figures(work / name.removeprefix("pretrain-"), log_text)
    if name == "plan":
        return json.loads(log_text[log_text.rindex("\n{") :])
    return json.loads((work / f"{name}.json").read_text())


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def shown(value: float | None, form: str) -> str:
    return "—" if value is None else format(value, form)


def verdict(value: float | None, met: bool) -> str:
    return "not measured" if value is None else ("met" if met else "MISSED")


def target_rows(results: dict) -> list[tuple[str, str, str, str]]:
    """(measure, value, target, verdict) for every target of the run."""
    figure = {name: step.get("figures", {}) for name, step in results.items()}
    bf16, float8 = figure.get("pretrain-bf16", {}), figure.get("pretrain-float8", {})
    seed_dlx, seed_hf, plan = figure.get("seed-dlx", {}), figure.get("seed-hf", {}), figure.get("plan", {})
    windows = (bf16.get("mfu_windows") or [])[1:]  # the first window holds the compilation
    low = min((w for w in windows if w is not None), default=None)
    bare = ratio(bf16.get("tokens_per_s"), figure.get("bare", {}).get("tokens_per_s"))
    hf = ratio(bf16.get("tokens_per_s"), figure.get("hf-compiled", {}).get("tokens_per_s"))
    speedup = ratio(float8.get("tokens_per_s"), bf16.get("tokens_per_s"))
    loss_gap = abs(ratio(float8.get("loss"), bf16.get("loss")) - 1) if float8.get("loss") and bf16.get("loss") else None
    plan_gap = abs(ratio(plan.get("total_gb"), seed_dlx.get("peak_mem_gb")) - 1) if plan and seed_dlx else None
    peaks = (seed_dlx.get("peak_mem_gb"), seed_hf.get("peak_mem_gb"))

    graph = (bf16.get("graph_breaks"), bf16.get("recompiles"))
    return [
        (
            "dlx pretrain MFU, lowest 10-step window after the first",
            shown(low, ".1%"),
            "≥ 60 %",
            verdict(low, (low or 0) >= 0.6),
        ),
        (
            "graph breaks / recompiles logged",
            "—" if None in graph else f"{graph[0]} / {graph[1]}",
            "0 / 0 after step 1",
            verdict(graph[0], graph == (0, 0)),
        ),
        ("dlx ÷ bare loop, tokens/s", shown(bare, ".3f"), "≥ 0.98", verdict(bare, (bare or 0) >= 0.98)),
        ("dlx ÷ HF compiled, tokens/s", shown(hf, ".3f"), "≥ 1.15", verdict(hf, (hf or 0) >= 1.15)),
        ("float8 ÷ bf16, tokens/s", shown(speedup, ".3f"), "≥ 1.10", verdict(speedup, (speedup or 0) >= 1.10)),
        (
            "float8 loss vs bf16 at the last step",
            shown(loss_gap, ".2%"),
            "within 2 %",
            verdict(loss_gap, loss_gap is not None and loss_gap <= 0.02),
        ),
        (
            "seed row peak GB, dlx / HF Trainer",
            "—" if None in peaks else f"{peaks[0]:.2f} / {peaks[1]:.2f}",
            "dlx below HF",
            verdict(peaks[0], None not in peaks and peaks[0] < peaks[1]),
        ),
        (
            "seed row it/s, dlx / HF Trainer",
            f"{shown(seed_dlx.get('it_per_s'), '.3f')} / {shown(seed_hf.get('it_per_s'), '.3f')}",
            SEED_ROW,
            "",
        ),
        (
            "dlx plan vs dlx's measured peak",
            shown(plan_gap, ".1%"),
            "within 15 %",
            verdict(plan_gap, plan_gap is not None and plan_gap <= 0.15),
        ),
        *(row.judge(figure.get(row.step, {})) for row in ROWS),
    ]


def accumulation_line(figures: dict) -> str:
    return (
        f"- the loss's output-weight gradient over {figures['chunks']} chunks: "
        f"{'one GEMM into fp32' if figures.get('one_gemm') else 'the fp32 path this torch allows'} "
        f"{figures['fused_ms']:.1f} ms, product then add {figures['separate_ms']:.1f} ms; they differ by "
        f"{figures['relative_difference']:.2g} of the largest element (bf16 rounding ≤ 2⁻⁸)"
    )


def table(results: dict) -> list[str]:
    lines = ["| measure | value | target | verdict |", "|---|---|---|---|"]
    lines += [f"| {' | '.join(row)} |" for row in target_rows(results)]
    ceilings = results.get("ceilings", {}).get("figures")
    if ceilings:
        lines += [
            "",
            f"- matmul {ceilings['matmul_side']}³: {ceilings['matmul_tflops']:.4g} TFLOPS",
            f"- {ceilings['attention']}",
            f"- AdamW floor: {ceilings['adamw_floor_s'] * 1e3:.1f} ms for {ceilings['adamw_params']:,} params",
            accumulation_line(ceilings["loss_accumulation"]),
            "",
            "| GEMM | M | N | K | TFLOPS |",
            "|---|---|---|---|---|",
        ]
        lines += [f"| {g['gemm']} | {g['m']} | {g['n']} | {g['k']} | {g['tflops']:.4g} |" for g in ceilings["gemms"]]
    for row in ROWS:
        details = row.detail(results.get(row.step, {}).get("figures", {}))
        lines += ["", *details] if details else []
    attention = results.get("pretrain-bf16", {}).get("figures", {}).get("attention")
    if attention:
        lines += ["", f"- dlx pretrain bf16, its header: {attention}"]
    lines += ["", "| step | status | seconds |", "|---|---|---|"]
    lines += [f"| {name} | {step['status']} | {step['seconds']:.0f} |" for name, step in results.items()]
    return lines


def run_steps(work: Path, chosen: list[str], out: Path, dry: bool) -> int:
    deps = work / "deps"
    if not dry:
        offline_deps.unpack_missing(offline_deps.WHEELS, deps)
    env = {**run_gpu_bench.child_env(deps if not dry else None), "TORCH_LOGS": TORCH_LOGS}
    results: dict[str, dict] = {}
    for name, argv, seconds in steps(work, dry):
        if name not in chosen:
            continue
        log_path = work / f"{name}.log"
        start = time.monotonic()
        with open(log_path, "w") as log:
            status = run_gpu_bench.run_within(argv, env, seconds, log)
        step = {"status": status, "seconds": time.monotonic() - start, "command": argv}
        try:
            step["figures"] = figures(name, work, log_path.read_text()) if status == "ok" else {}
        except (OSError, KeyError, ValueError) as error:
            step["figures"], step["status"] = {}, f"{status}, no figures ({error})"
        if status != "ok":
            step["last_line"] = (log_path.read_text().strip().splitlines() or [""])[-1][:300]
        results[name] = step
        print(f"{name}: {step['status']} in {step['seconds']:.0f} s", flush=True)
    collect(work, out, results)
    return 0


def collect(work: Path, out: Path, results: dict) -> None:
    """At most 8 files into `out`."""
    out.mkdir(parents=True, exist_ok=True)
    lines = table(results)
    print("\n".join(lines))
    (out / "results.json").write_text(json.dumps(results, indent=2, default=str) + "\n")
    (out / "table.md").write_text("\n".join(lines) + "\n")
    logs = sorted(work.glob("*.log"))
    (out / "steps.log").write_text("".join(f"===== {p.stem}\n{p.read_text()}\n" for p in logs))
    summary = [f"{name}: {step['status']} in {step['seconds']:.0f} s" for name, step in results.items()]
    (out / "summary.txt").write_text("\n".join(summary) + "\n")
    for run in ("bf16", "float8"):
        if (work / run / "metrics.jsonl").is_file():
            shutil.copy(work / run / "metrics.jsonl", out / f"metrics-{run}.jsonl")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="every step on the CPU with the debug model")
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "runs/next-contact")))
    parser.add_argument("--only", help="comma-separated step names to run (a rerun of those that failed)")
    args = parser.parse_args(argv)
    names = [name for name, _, _ in steps(Path("WORK"), args.dry_run, later=bool(args.only))]
    chosen = [name for name in names if not args.only or name in args.only.split(",")]
    if not chosen:
        return run_gpu_bench.fail(f"--only names no step; choose from {', '.join(names)}")
    with tempfile.TemporaryDirectory(prefix="dlx-next-contact-") as tmp:
        return run_steps(Path(tmp), chosen, args.out, args.dry_run)


if __name__ == "__main__":
    sys.exit(main())
