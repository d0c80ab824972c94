"""What `dlx tune` hands back: the winner as a recipe `dlx pretrain` loads, the table of every candidate (markdown) and
the same as one JSON object (`--json`).

tokens/s counts all ranks; MFU is per rank against the peak `dlx bench` uses (`dlx.metrics.meter.peak_for`), in the
attention convention of `dlx.metrics.flops`; predicted figures are the time model's after its last calibration."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
import yaml

from dlx.atomic import atomic_write_text
from dlx.bench.tune.search import TuneResult, run_s
from dlx.bench.tune.select import Candidate
from dlx.bench.tune.space import layout_recipe
from dlx.metrics.flops import training_flops_per_token
from dlx.metrics.meter import peak_for


def candidate_row(c: Candidate, result: TuneResult) -> dict[str, Any]:
    """One candidate as the JSON's `candidates` list holds it."""
    tokens = result.global_batch * result.seq_len
    predicted_tps = tokens / c.predicted_step_s if c.predicted_step_s else None
    record = c.record or {}
    return {
        "layout": c.layout.as_dict(),
        "label": c.layout.label(),
        "predicted_step_s": c.predicted_step_s,
        "measured_step_s": c.measured_step_s,
        "predicted_before_measured_s": c.predicted_before_s,
        "predicted_tokens_per_s": predicted_tps,
        "tokens_per_s": record.get("tokens_per_s"),
        "predicted_mfu": predicted_mfu(predicted_tps, result),
        "mfu": record.get("mfu"),
        "estimate_gb": c.estimate_gb,
        "peak_mem_gb": record.get("peak_mem_gb"),
        "winner": c is result.winner,
        "recipe": c.is_recipe,
        "drop": c.drop,
        "run": c.run.as_dict() if c.run is not None else None,
        "run_measured": c.record is not None and c.run is not None,
        "predicted_run_before_measured_s": c.predicted_run_before_s,
    }


def predicted_mfu(tokens_per_s: float | None, result: TuneResult) -> float | None:
    peak = peak_for(torch.device(result.device), result.precision).tflops
    if tokens_per_s is None or not peak:
        return None
    flops = training_flops_per_token(result.args, result.seq_len).attention
    return tokens_per_s * flops / result.world_size / (peak * 1e12)


def ordered(result: TuneResult) -> list[Candidate]:
    """The winner, the measured by their whole run, the admitted by prediction, then the dropped by estimate."""

    def key(c: Candidate) -> tuple:
        if c is result.winner:
            return (0, 0.0)
        if c.record is not None:
            return (1, run_s(c))
        if c.predicted_step_s is not None:
            return (2, run_s(c))
        return (3, c.estimate_gb if c.estimate_gb is not None else float("inf"))

    return sorted(result.candidates, key=key)


def shown(result: TuneResult, every: bool) -> list[Candidate]:
    """The table's rows: every candidate with `every`, else the winner, the measured and the best unmeasured one."""
    rows = ordered(result)
    if every:
        return rows
    kept = [c for c in rows if c is result.winner or c.record is not None]
    unmeasured = [c for c in rows if c.record is None and c.predicted_step_s is not None and c not in kept]
    return kept + unmeasured[:1]


def tune_json(result: TuneResult, out: Path | None) -> dict[str, Any]:
    """The whole result as one JSON-serialisable object."""
    rates = result.rates
    return {
        "recipe_out": str(out) if out else None,
        "world_size": result.world_size,
        "global_batch": result.global_batch,
        "seq_len": result.seq_len,
        "precision": result.precision,
        "device": result.device,
        "measured": result.measured,
        "elapsed_s": result.elapsed_s,
        "memory_rule": result.rule.describe(),
        "rates": {
            "matmul_tflops": {f"{kind}@{tokens}": value for (kind, tokens), value in rates.matmul_tflops.items()},
            "memory_gbps": rates.memory_gbps,
            "link_gbps": rates.link_gbps,
            "link_measured": rates.link_measured,
            "attention_call_s": {f"{kind}@micro{micro}": value for (kind, micro), value in rates.attention_s.items()},
        },
        "time_model": {
            "coefficients": list(result.model.coefficients),
            "scale": result.model.scale,
            "measured_points": result.model.measured_points,
        },
        "run_shape": asdict(result.shape) if result.shape is not None else None,
        "run_shared_costs": asdict(result.shared) if result.shared is not None else None,
        "winner": candidate_row(result.winner, result),
        "candidates": [candidate_row(c, result) for c in ordered(result)],
    }


def _num(value: float | None, fmt: str) -> str:
    return "" if value is None else format(value, fmt)


def markdown_lines(result: TuneResult, every: bool = False) -> list[str]:
    """The table (the winner, the measured and the best unmeasured candidate; `every`: all of them), with how it was
    made above it."""
    how = "measured here" if result.measured else f"ranked by the model only (no {result.world_size} ranks here)"
    run = (
        f"the whole run ({result.shape.describe()}): warm-up + steps + evaluations + task evaluations + saves"
        if result.shape is not None
        else "the step alone (the run's length is unknown: no train.max_steps and no dataset here)"
    )
    lines = [
        f"- world size {result.world_size}, global batch {result.global_batch} × {result.seq_len} tokens, "
        f"{result.precision}, {result.device}; {how}; {result.elapsed_s:.0f} s",
        f"- ranked by {run}",
        f"- memory rule: {result.rule.describe()}",
        f"- time model coefficients ({result.model.describe()}) after {result.model.measured_points} measured",
        "",
        "| layout | whole run s | predicted step s | measured step s | tokens/s | MFU % | estimate GB | peak GB | "
        "why dropped |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    rows = shown(result, every)
    for c in rows:
        lines.append(table_row(candidate_row(c, result)))
    hidden = len(result.candidates) - len(rows)
    if hidden:
        lines += ["", f"{hidden} more candidate(s), predicted slower or dropped: `dlx tune ... --all` lists them"]
    return lines


def table_row(row: dict[str, Any]) -> str:
    name = f"**{row['label']}**" if row["winner"] else row["label"]
    name += " (the recipe's)" if row["recipe"] else ""
    tps = row["tokens_per_s"] or row["predicted_tokens_per_s"]
    tps_text = "" if tps is None else f"{tps:,.0f}" + ("" if row["tokens_per_s"] else " (pred.)")
    mfu = row["mfu"] if row["mfu"] is not None else row["predicted_mfu"]
    run = row["run"]
    run_text = "" if run is None else f"{run['total_s']:,.1f}" + ("" if row["run_measured"] else " (pred.)")
    return (
        f"| {name} | {run_text} | {_num(row['predicted_step_s'], '.4g')} | {_num(row['measured_step_s'], '.4g')} | "
        f"{tps_text} | {_num(None if mfu is None else 100 * mfu, '.1f')} | {_num(row['estimate_gb'], '.3g')} | "
        f"{_num(row['peak_mem_gb'], '.3g')} | {row['drop'] or ('winner' if row['winner'] else '')} |"
    )


def tuned_recipe_text(result: TuneResult, source: str) -> str:
    """The recipe with the winner's keys set, a comment on where it came from above it."""
    winner = result.winner
    how = (
        f"measured {winner.measured_step_s:.4g} s per step"
        if winner.measured_step_s is not None
        else f"predicted {winner.predicted_step_s:.4g} s per step (not measured)"
    )
    if winner.run is not None:
        how += f", {winner.run.total_s:,.1f} s for the whole run"
    header = [
        f"# Tuned by `dlx tune {source}`: {winner.layout.label()}",
        f"# {how}, for world size {result.world_size}; every candidate in the .md beside this file.",
    ]
    body = yaml.safe_dump(layout_recipe(result.raw, winner.layout), sort_keys=False, default_flow_style=False)
    return "\n".join(header) + "\n" + body


def write_outputs(result: TuneResult, source: str, out: Path) -> list[Path]:
    """OUT (the recipe), OUT.md (the table of every candidate) and OUT.json, each written atomically."""
    import json

    table = out.with_suffix(".md")
    data = out.with_suffix(".json")
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out, tuned_recipe_text(result, source))
    atomic_write_text(table, f"# dlx tune {source}\n\n" + "\n".join(markdown_lines(result, every=True)) + "\n")
    atomic_write_text(data, json.dumps(tune_json(result, out), indent=1) + "\n")
    return [out, table, data]
