"""report.md for a run: how the numbers are counted, a summary table, the phase shares, the verdict, and plots.

Throughput statistics leave out the first `skip_first` records (warm-up) and those of profiled steps, as the verdict
does; loss uses them all.
"""

from __future__ import annotations

import math
import os
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dlx.atomic import atomic_write_text
from dlx.metrics import flops, plots
from dlx.metrics.logger import TASKS_FILE, read_jsonl
from dlx.metrics.profiler import profile_report_section
from dlx.metrics.stage_report import stages_section
from dlx.metrics.verdict import LOW_MFU, THRESHOLDS, Verdict, steady_records

REPORT_FILE = "report.md"

# (record key, label, format of one value)
SUMMARY_ROWS = [
    ("tokens_per_s", "tokens/s (all devices)", "{:,.0f}"),
    ("tflops", "TFLOPS per device, attention convention", "{:.4g}"),
    ("tflops_dense", "TFLOPS per device, dense convention", "{:.4g}"),
    ("mfu", "MFU, attention convention", "pct"),
    ("mfu_dense", "MFU, dense convention", "pct"),
    ("step_s", "step time (s)", "{:.4g}"),
    ("data_wait_pct", "data wait (% of step)", "{:.1f}"),
]


def write_report(
    run_dir: str | os.PathLike,
    records: Sequence[dict[str, Any]],
    verdict: Verdict,
    header_lines: Sequence[str],
    eval_records: Sequence[dict[str, Any]] = (),
    skip_first: int = 1,
    source_weights: dict[str, float] | None = None,
    events: Sequence[dict[str, Any]] = (),
) -> Path:
    """Write run_dir/report.md with loss.png, throughput.png and phases.png beside it; return the report's path.
    `source_weights`: data.mix's {source name: weight}, for the realised mixture against them. `events`: the run's
    events.jsonl lines (resumes, loss spikes, rollbacks, skipped batches, stops; with data.stages each stage's start
    and end, for the Stages section)."""
    run_dir = Path(run_dir)
    evals = [{"step": r["step"], "loss": r.get("loss", r.get("eval_loss")), "bpb": r.get("bpb")} for r in eval_records]
    tasks = read_jsonl(run_dir / TASKS_FILE)  # eval.tasks: lm-evaluation-harness metrics
    used = steady_records(records, skip_first)
    if records:
        plots.plot_loss(run_dir / "loss.png", records, evals)
        plots.plot_throughput(run_dir / "throughput.png", records)
        plots.plot_phases(run_dir / "phases.png", records)
    if tasks:
        plots.plot_tasks(run_dir / "tasks.png", tasks)
    sections = [
        ["# Run report", "", "```", *header_lines, "```"],
        _conventions(),
        _summary(used, len(records) - len(used)) if used else ["## Summary", "", "No steps were logged."],
        _phases(verdict),
        _losses(records, evals),
        _z_loss(records),
        _mixture(records, eval_records, source_weights or {}),
        stages_section(events, records, eval_records),
        _tasks(tasks),
        _verdict(verdict),
        _events(events),
        profile_report_section(run_dir),
        _figures(bool(tasks)) if records else [],
    ]
    text = "\n\n".join("\n".join(lines) for lines in sections if lines) + "\n"
    path = run_dir / REPORT_FILE
    atomic_write_text(path, text)
    return path


def _conventions() -> list[str]:
    return [
        "## How FLOPs and MFU are counted",
        "",
        f"- **Attention convention** (`tflops`, `mfu`): {flops.CONVENTIONS['attention']}.",
        f"- **Dense convention** (`tflops_dense`, `mfu_dense`): {flops.CONVENTIONS['dense']}.",
        "- L layers, H query heads, Q head dim, T sequence length. Forward is 2 FLOPs per weight per token, backward"
        " twice that. Activation recomputation is not counted: MFU is useful model FLOPs over the device's peak.",
        "- TFLOPS are per device (tokens/s ÷ world size × FLOPs/token). The peak is a ceiling (a GPU's datasheet"
        " entry; on a CPU cores × clock × FLOPs per cycle, see the header), so MFU above 100 % is a bug: it is"
        " reported as it is, never clipped.",
    ]


def _summary(records: list[dict[str, Any]], skipped: int) -> list[str]:
    lines = [
        "## Summary",
        "",
        f"Over {len(records)} logged steps ({skipped} warm-up or profiled record(s) left out).",
        "",
        "| metric | median | mean | min | max |",
        "|---|---:|---:|---:|---:|",
    ]
    for key, label, fmt in SUMMARY_ROWS:
        values = [float(r[key]) for r in records if isinstance(r.get(key), (int, float))]
        if not values:
            lines.append(f"| {label} | n/a | n/a | n/a | n/a |")
            continue
        stats = (statistics.median(values), statistics.fmean(values), min(values), max(values))
        lines.append(f"| {label} | " + " | ".join(_format(v, fmt) for v in stats) + " |")
    peak_mem = max((float(r["peak_mem_gb"]) for r in records if r.get("peak_mem_gb") is not None), default=None)
    lines.append(f"\nPeak memory: {'n/a' if peak_mem is None else f'{peak_mem:.3f} GB'} (method in the header).")
    warnings = sorted({r["warning"] for r in records if r.get("warning")})
    lines += [f"\n**Warning:** {w}" for w in warnings[:1]]
    return lines


def _phases(verdict: Verdict) -> list[str]:
    lines = ["## Where the step time goes", "", "| phase | share of step time |", "|---|---:|"]
    for key, value in verdict.evidence.items():
        if key.endswith("_pct") and value is not None:
            lines.append(f"| {key[:-4]} | {value:.1f} % |")
    return lines


def _losses(records: Sequence[dict[str, Any]], evals: list[dict[str, Any]]) -> list[str]:
    """Train loss (logged steps and their EMA, as loss.png draws them) and validation loss, first / last / best.
    A data mixture's per-source figures belong in the section right after this one."""
    lines = ["## Loss", "", "| loss | first | last | best | last, smoothed |", "|---|---:|---:|---:|---:|"]
    train = [r for r in records if _finite(r.get("loss"))]
    if train:
        ema = plots.smoothed([r["loss"] for r in train])[-1]
        lines.append(f"| train (nats/token) | {_at(train[0])} | {_at(train[-1])} | {_at(_best(train))} | {ema:.4f} |")
    else:
        lines.append("| train (nats/token) | n/a | n/a | n/a | n/a |")
    evaluated = [r for r in evals if _finite(r.get("loss"))]
    if evaluated:
        last = evaluated[-1]
        lines.append(f"| validation (nats/token) | {_at(evaluated[0])} | {_at(last)} | {_at(_best(evaluated))} | |")
        lines.append(f"\nValidation perplexity at step {last['step']}: {_perplexity(last['loss']):,.2f} (e^loss).")
        lines += _bits_per_byte(evaluated)
    else:
        lines.append("| validation | not evaluated (eval.every 0) | | | |")
    lines.append(f"\nThe smoothed column is the EMA (weight {plots.PLOT_SMOOTHING}) over the logged steps.")
    return lines


def _bits_per_byte(evals: list[dict[str, Any]]) -> list[str]:
    """Validation bits per byte, first and last: the figure that compares runs with different tokenizers."""
    measured = [r for r in evals if _finite(r.get("bpb"))]
    if not measured:
        return ["Validation bits per byte: n/a (no byte-level BPE tokenizer with the data)."]
    first, last = measured[0], measured[-1]
    return [
        f"Validation bits per byte: {first['bpb']:.4f} (step {first['step']}) → {last['bpb']:.4f} (step "
        f"{last['step']}): cross-entropy in bits ÷ UTF-8 bytes of the targets, comparable across tokenizers."
    ]


def _tasks(records: Sequence[dict[str, Any]]) -> list[str]:
    """eval.tasks: each lm-evaluation-harness metric at the first and last evaluation, ± its standard error."""
    if not records:
        return []
    first, last = records[0], records[-1]
    lines = [
        "## Downstream tasks",
        "",
        "lm-evaluation-harness metrics on the live model (tasks.jsonl), ± their standard errors.",
        "",
        f"| task/metric | step {first['step']} | step {last['step']} |",
        "|---|---:|---:|",
    ]
    for key in plots.task_metric_keys(records):
        lines.append(f"| {key} | {_with_stderr(first, key)} | {_with_stderr(last, key)} |")
    return lines


def _with_stderr(record: dict[str, Any], key: str) -> str:
    value, stderr = record.get(key), record.get(f"{key}_stderr")
    if not _finite(value):
        return "n/a"
    return f"{value:.4f}" + (f" ± {stderr:.4f}" if _finite(stderr) else "")


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def _best(records: list[dict[str, Any]]) -> dict[str, Any]:
    return min(records, key=lambda r: r["loss"])


def _at(record: dict[str, Any]) -> str:
    return f"{record['loss']:.4f} (step {record['step']})"


def _perplexity(loss: float) -> float:
    return math.exp(loss) if loss < 700 else math.inf


def _z_loss(records: Sequence[dict[str, Any]]) -> list[str]:
    """train.z_loss: the last logged z-loss term, which the logged loss leaves out."""
    last = next((r for r in reversed(records) if isinstance(r.get("z_loss"), (int, float))), None)
    if last is None:
        return []
    return [
        f"- Final z-loss: {last['z_loss']:.4g} at step {last['step']} (train.z_loss × the mean squared "
        "log-partition of the logits; added to the minimised loss, not to the loss above)."
    ]


def _mixture(
    records: Sequence[dict[str, Any]], eval_records: Sequence[dict[str, Any]], weights: dict[str, float]
) -> list[str]:
    """data.mix: each source's share of the training tokens against its weight, and its last validation loss."""
    last = next((r for r in reversed(records) if r.get("source_tokens")), None)
    if not weights or last is None:
        return []
    tokens, total_weight = last["source_tokens"], sum(weights.values())
    total_tokens = sum(tokens.values()) or 1
    evaluated = next((r for r in reversed(eval_records) if r.get("source_loss")), None)
    eval_note = f", validation loss at step {evaluated['step']}" if evaluated else ""
    lines = [
        "## Data mixture",
        "",
        f"Training tokens each data.mix source supplied up to step {last['step']}, against its weight{eval_note}.",
        "",
        "| source | weight | share of tokens | tokens | val loss |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, weight in weights.items():
        loss = evaluated["source_loss"].get(name) if evaluated else None
        lines.append(
            f"| {name} | {weight / total_weight:.2%} | {tokens.get(name, 0) / total_tokens:.2%} | "
            f"{tokens.get(name, 0):,} | {'n/a' if loss is None else f'{loss:.4f}'} |"
        )
    return lines


def _verdict(verdict: Verdict) -> list[str]:
    thresholds = ", ".join(f"{kind} at ≥ {share:.0%}" for kind, share in THRESHOLDS.items())
    return [
        "## Bottleneck verdict",
        "",
        f"**{verdict.kind}**{'' if verdict.confident else ' (tentative)'}: {verdict.reason}.",
        "",
        f"- Evidence: {verdict.evidence_line()}",
        f"- Confidence: {verdict.confidence_line()}",
        f"- Try: {verdict.suggestion}",
        *([f"- Straggler: {verdict.straggler}"] if verdict.straggler else []),
        f"- Rules: {thresholds} of step time (overhead = unaccounted + communication); otherwise compute-bound, "
        f"with MFU below {LOW_MFU:.0%} called low. The largest excess over its threshold wins.",
    ]


def _events(events: Sequence[dict[str, Any]]) -> list[str]:
    if not events:
        return []
    lines = ["## Events", "", "| step | event | details |", "|---:|---|---|"]
    for event in events:
        details = ", ".join(f"{k} {v}" for k, v in event.items() if k not in ("event", "step"))
        lines.append(f"| {event.get('step', '')} | {event.get('event', '')} | {details} |")
    return lines


def _figures(tasks: bool = False) -> list[str]:
    lines = [
        "## Plots",
        "",
        "![loss](loss.png)",
        "",
        "![throughput and MFU](throughput.png)",
        "",
        "![phase times per step](phases.png)",
    ]
    return lines + (["", "![downstream tasks](tasks.png)"] if tasks else [])


def _format(value: float, fmt: str) -> str:
    return f"{100 * value:.1f} %" if fmt == "pct" else fmt.format(value)
