"""`dlx bench`'s outputs: the CSV every point is appended to (which a re-run reads to skip measured points), and the
Markdown table with the columns in the order users compare them (cutoff_len, batch size, accumulation, it/s, memory,
FLOPS).

Units are in the column names: `_s` seconds (mean per optimizer step over the timed steps), `_gb` 1e9 bytes,
`tflops` 1e12 FLOP/s per device, `_pct` percent (the GPU counters of dlx.metrics.gpu_monitor, NVML, CUDA only).
`mfu` and `tflops` count attention (6·N + 12·L·H·Q·T), `mfu_dense` and `tflops_dense`
do not (6·N); see dlx.metrics.flops. `est_mem_gb` is `dlx plan`'s estimate for the same point, beside `peak_mem_gb`.
`optimizer_pct` and `weight_cast_pct` are the step's fixed costs as percentages of `step_s` (dlx.bench.measure).
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from dlx.atomic import atomic_write_text
from dlx.bench.points import BenchPoint
from dlx.metrics.flops import CONVENTIONS

KEY_COLUMNS = (
    *("model", "device", "data", "compile", "document_mask"),
    *("precision", "seq_len", "micro_batch", "grad_accum"),
)
"""What identifies a point: a re-run skips rows whose key is already in the CSV (unless marked `oom_estimate`)."""
COLUMNS = (
    *KEY_COLUMNS,
    "status",
    "it_per_s",
    "tokens_per_s",
    "step_s",
    "data_wait_s",
    "gpu_util_pct",
    "mem_util_pct",
    "tensor_active_pct",
    "dram_active_pct",
    "forward_s",
    "backward_s",
    "optimizer_s",
    "optimizer_pct",
    "weight_cast_pct",
    "peak_mem_gb",
    "est_mem_gb",
    "tflops",
    "tflops_dense",
    "mfu",
    "mfu_dense",
    "peak_tflops",
    "peak_source",
    "steps",
    "note",
)
STATUSES = {
    "ok": "measured",
    "oom": "out of memory on the device (caught, memory released, sweep continued)",
    "oom_estimate": "not run: the estimate exceeds the memory budget (re-evaluated on every run)",
}
INT_COLUMNS = frozenset({"seq_len", "micro_batch", "grad_accum", "steps"})
TEXT_COLUMNS = frozenset(
    {"model", "device", "data", "compile", "document_mask", "precision", "status", "peak_source", "note"}
)
DEFAULTS = {"document_mask": "off"}
"""Key columns added since a CSV may have been written: what its rows measured."""


def row_key(row: dict[str, Any]) -> tuple[str, ...]:
    return tuple(str(row[name]) for name in KEY_COLUMNS)


def point_row(fixed: dict[str, Any], point: BenchPoint, status: str, **values: Any) -> dict[str, Any]:
    """A CSV row: the fixed key columns (model, device, data, compile, document mask), the point, its status and
    whatever was measured (missing columns stay empty)."""
    assert status in STATUSES, status
    row = dict.fromkeys(COLUMNS, "")
    row.update(
        fixed,
        seq_len=point.seq_len,
        micro_batch=point.micro_batch,
        grad_accum=point.grad_accum,
        precision=point.precision,
        status=status,
    )
    row.update({k: v for k, v in values.items() if k in row and v is not None})
    return row


def measured_row(
    fixed: dict[str, Any],
    point: BenchPoint,
    record: dict[str, Any],
    est_mem_gb: float,
    peak_tflops: float | None,
    peak_source: str,
    steps: int,
) -> dict[str, Any]:
    """A row from a ThroughputMeter record; it/s is optimizer steps per second, as HF Trainer reports it."""
    return point_row(
        fixed,
        point,
        "ok",
        it_per_s=1.0 / record["step_s"],
        est_mem_gb=est_mem_gb,
        peak_tflops=peak_tflops,
        peak_source=peak_source,
        steps=steps,
        **{k: record[k] for k in COLUMNS if k in record},
    )


def read_rows(path: Path) -> list[dict[str, Any]]:
    """The rows of an earlier run's CSV, numbers parsed; [] when there is none."""
    if not path.exists():
        return []
    with open(path, newline="") as f:
        return [
            {name: _parse(name, row.get(name) or DEFAULTS.get(name, "")) for name in COLUMNS}
            for row in csv.DictReader(f)
        ]


def _parse(name: str, text: str | None) -> Any:
    if text in (None, "") or name in TEXT_COLUMNS:
        return text or ""
    return int(text) if name in INT_COLUMNS else float(text)


def write_rows(path: Path, rows: Iterable[dict[str, Any]]) -> None:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=COLUMNS, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    atomic_write_text(path, buffer.getvalue())


def markdown_table(rows: list[dict[str, Any]], header: list[str]) -> str:
    """The header lines (command, versions, how each number is counted), then one table per model/device/compile."""
    lines = [*header, "", *_conventions(rows), ""]
    groups: dict[tuple[str, ...], list[dict[str, Any]]] = {}
    for row in rows:
        key = (row["model"], row["device"], row["data"], row["compile"], row["document_mask"])
        groups.setdefault(key, []).append(row)
    for (model, device, data, compiled, masked), group in groups.items():
        mask = ", document mask" if masked == "on" else ""
        lines += [f"### {model} on {device}, {data} data{mask}, compile {compiled}", "", *_table(group), ""]
    return "\n".join(lines)


def _conventions(rows: list[dict[str, Any]]) -> list[str]:
    peaks = {(r["precision"], r["peak_tflops"], r["peak_source"]) for r in rows if r["status"] == "ok"}
    lines = [
        f"- TFLOPS and MFU: {CONVENTIONS['attention']}; dense: {CONVENTIONS['dense']}; per device",
        *(f"- peak for {p}: {t:.4g} TFLOPS ({src})" for p, t, src in sorted(peaks, key=str) if t != ""),
        "- step ms: mean over the timed steps, split into forward / backward / optimizer (data wait and the rest make "
        "up the difference); est. GB: `dlx plan`'s estimate for the same point",
        "- fixed %: the optimizer phase (clipping, AdamW, zero_grad, the wait for the loss) + autocast's weight casts "
        "(once per micro-step), as shares of the step",
        *(f"- {status}: {meaning}" for status, meaning in STATUSES.items() if status != "ok"),
        "- GPU / mem %: NVML utilization.gpu (time any kernel ran) / .memory (time device memory was read or "
        "written); tensor / DRAM %: NVML GPM tensor-core activity / DRAM bandwidth share (Hopper or newer); "
        "means over the timed steps",
    ]
    if not any(isinstance(r["gpu_util_pct"], float) for r in rows if r["status"] == "ok"):
        lines.append(
            "- GPU columns n/a: NVML samples NVIDIA GPUs only, and needs nvidia-ml-py (pip install 'dlx[nvml]')"
        )
    over = sorted({r["precision"] for r in rows if isinstance(r["mfu"], float) and r["mfu"] > 1.0})
    if over:
        lines.append(
            f"- MFU above 100 % ({', '.join(over)}): training ran faster than the peak it is divided by, which a "
            "ceiling rules out: the peak entry or the FLOPs count is wrong for this device (a bug to report)"
        )
    return lines


def _table(rows: list[dict[str, Any]]) -> list[str]:
    lines = [
        "| precision | seq len | micro-batch | grad accum | it/s | tokens/s | step ms (fwd / bwd / opt) "
        "| fixed % (opt + cast) | data wait ms | GPU / mem % | tensor / DRAM % | peak mem GB (est.) | TFLOPS "
        "| MFU (dense) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        start = f"| {r['precision']} | {r['seq_len']} | {r['micro_batch']} | {r['grad_accum']} |"
        if r["status"] != "ok":
            mark = "OOM" if r["status"] == "oom" else "OOM (est.)"
            lines.append(f"{start} {mark} | | | | | | | {_gb(r['est_mem_gb'])} | | {r['note']} |")
            continue
        phases = " / ".join(f"{1e3 * r[f'{p}_s']:.0f}" for p in ("forward", "backward", "optimizer"))
        lines.append(
            f"{start} {r['it_per_s']:.3g} | {r['tokens_per_s']:,.0f} | {1e3 * r['step_s']:.0f} ({phases}) "
            f"| {_fixed(r)} | {_ms(r['data_wait_s'])} | {_pair(r, 'gpu_util_pct', 'mem_util_pct')} "
            f"| {_pair(r, 'tensor_active_pct', 'dram_active_pct')} "
            f"| {_gb(r['peak_mem_gb'])} ({_gb(r['est_mem_gb'])}) | {r['tflops']:.3g} | {_pct(r['mfu'])} "
            f"({_pct(r['mfu_dense'])}) |"
        )
    return lines


def _fixed(row: dict[str, Any]) -> str:
    """`12.3 (11.0 + 1.3)`; empty for rows from a CSV written before the columns existed."""
    opt, cast = row["optimizer_pct"], row["weight_cast_pct"]
    if not isinstance(opt, float) or not isinstance(cast, float):
        return ""
    return f"{opt + cast:.1f} ({opt:.1f} + {cast:.1f})"


def _ms(seconds: Any) -> str:
    return f"{1e3 * seconds:.1f}" if isinstance(seconds, float) else ""


def _pair(row: dict[str, Any], first: str, second: str) -> str:
    """Two GPU counters as `97 / 41`; n/a where NVML gave none (see the conventions above the table)."""
    return " / ".join(f"{row[key]:.0f}" if isinstance(row[key], float) else "n/a" for key in (first, second))


def _gb(value: Any) -> str:
    return f"{value:.3g}" if isinstance(value, float) else ""


def _pct(value: Any) -> str:
    return f"{100 * value:.1f}%" if isinstance(value, float) else "n/a"
