"""What the page derives from a run's records: goodput, the mixture per stage, the verdict, the config differences.

Goodput is the time that produced kept steps over the wall-clock: the kept records' steps (Σ step_s × window_steps)
less the updates skipped among them, over the time from the first process's start (a `start` or `resume` event's time
less its `startup_s`, else the first record's time less its own steps) to the last record or event. The rest is
itemised where dlx says what it cost: checkpoints (`checkpoint` events' `save_s`), evaluation (eval.jsonl's `eval_s`),
downstream tasks (`tasks_s`), restarts (from the last record or event before a `resume` to it: the dead process's
unsaved steps, the wait and the start-up), rolled-back steps and skipped updates; `other` is what is left (logging,
samples, untimed work). Records without `time` (an older dlx) have no goodput.
"""

from __future__ import annotations

import math
from typing import Any

from dlx.view.columns import StepColumns


def start_time(columns: StepColumns, events: list[dict[str, Any]]) -> float:
    """Wall-clock of the run's first start (NaN when neither records nor events carry time)."""
    starts = [
        float(e["time"]) - float(e.get("startup_s") or 0.0)
        for e in events
        if e.get("event") in ("start", "resume") and _finite(e.get("time"))
    ]
    if columns.time and math.isfinite(columns.time[0]):
        step_s = columns.values["step_s"][0]
        starts.append(columns.time[0] - (0.0 if math.isnan(step_s) else step_s * columns.window[0]))
    return min(starts) if starts else math.nan


def goodput(
    columns: StepColumns, events: list[dict[str, Any]], evals: list[dict[str, Any]], tasks: list[dict[str, Any]]
) -> dict[str, Any]:
    """{"goodput", "wall_s", "productive_s", "lost": {what: seconds}, "counts": {what: n}}; {"missing": why} when the
    run's files carry no wall-clock time."""
    t0 = start_time(columns, events)
    times = [t for t in columns.time if math.isfinite(t)] + [float(e["time"]) for e in events if _finite(e.get("time"))]
    if math.isnan(t0) or not times:
        return {"missing": "its records carry no wall-clock time (written by a dlx before `time` was logged)"}
    wall = max(times) - t0
    productive = columns.trained_s() - columns.skipped_s
    saves = [e for e in events if e.get("event") == "checkpoint"]
    resumes = [e for e in events if e.get("event") == "resume" and _finite(e.get("time"))]
    lost = {
        "checkpoints": math.fsum(float(e.get("save_s") or 0.0) for e in saves),
        "evaluation": math.fsum(float(r.get("eval_s") or 0.0) for r in evals),
        "tasks": math.fsum(float(r.get("tasks_s") or 0.0) for r in tasks),
        "restarts": math.fsum(restart_cost(e, columns, events) for e in resumes),
        "rolled back": columns.abandoned_s,
        "skipped updates": columns.skipped_s,
    }
    lost["other"] = wall - productive - math.fsum(lost.values())
    counts = {
        "checkpoints": len(saves),
        "evaluation": len(evals),
        "tasks": len(tasks),
        "restarts": len(resumes),
        "rolled back": columns.abandoned_steps,
        "skipped updates": columns.skipped_steps,
    }
    return {
        "goodput": productive / wall if wall > 0 else None,
        "wall_s": wall,
        "productive_s": productive,
        "lost": lost,
        "counts": counts,
    }


def restart_cost(resume: dict[str, Any], columns: StepColumns, events: list[dict[str, Any]]) -> float:
    """Seconds from the last record or event before a resume to the resume (its process's start-up included)."""
    at = float(resume["time"])
    before = [t for t in columns.time if t < at] + [
        float(e["time"]) for e in events if e is not resume and _finite(e.get("time")) and float(e["time"]) < at
    ]
    return at - max(before) if before else float(resume.get("startup_s") or 0.0)


def stage_mixtures(config: dict[str, Any], columns: StepColumns) -> list[dict[str, Any]]:
    """Per stage: its steps and, for each source, the requested share (config.yaml's data.mix, or the stage's own
    `mix` in data.stages, carried over when unset) against the realised share of the tokens the stage trained on."""
    from dlx.data.mixture.sources import mix_sources, parse_mix

    data = config.get("data") or {}
    stage_mixes, mix = [], data.get("mix")
    for stage in data.get("stages") or [{}]:
        mix = (stage or {}).get("mix") or mix
        stage_mixes.append(_as_mix(mix, parse_mix))
    stages, previous = [], {}
    for stage in sorted(columns.stage_source_tokens):
        tokens = columns.stage_source_tokens[stage]
        realised = {name: tokens.get(name, 0) - previous.get(name, 0) for name in tokens}
        previous = tokens
        requested_mix = stage_mixes[stage] if stage < len(stage_mixes) else None
        requested = {s.name: s.weight for s in mix_sources(requested_mix)} if isinstance(requested_mix, dict) else {}
        stages.append({"stage": stage, "steps": stage_steps(columns, stage), "sources": shares(requested, realised)})
    return stages


def _as_mix(value: Any, parse_mix: Any) -> dict[str, float] | None:
    """A config's mix as {path: weight}: a mapping as it is, `PATH=W,…` text parsed; None for anything else."""
    if isinstance(value, str):
        try:
            return parse_mix(value)
        except ValueError:
            return None
    return value if isinstance(value, dict) else None


def stage_steps(columns: StepColumns, stage: int) -> list[int]:
    steps = [s for s, st in zip(columns.step, columns.stage, strict=True) if st == stage]
    return [steps[0], steps[-1]] if steps else []


def shares(requested: dict[str, float], realised: dict[str, float]) -> list[dict[str, Any]]:
    total_weight, total_tokens = sum(requested.values()) or 1.0, sum(realised.values()) or 1.0
    names = list(requested) + [n for n in realised if n not in requested]
    return [
        {
            "name": name,
            "requested": requested[name] / total_weight if name in requested else None,
            "realised": realised.get(name, 0) / total_tokens,
            "tokens": realised.get(name, 0),
        }
        for name in names
    ]


VERDICT_RECORDS = 5000
"""Records the page's verdict judges at most: a longer run is judged on an even sample (every k-th record)."""


def verdict(columns: StepColumns, report_lines: list[str]) -> dict[str, Any]:
    """{"lines", "final", "shares", "judged"}: report.md's verdict when the run has ended, else `dlx.metrics.verdict`'s
    over the records so far; `shares` the percent of step time in each phase as the verdict counts them, over
    `judged` records (an even sample of at most VERDICT_RECORDS)."""
    records = columns.verdict_records(VERDICT_RECORDS)
    if not records:
        return {"lines": report_lines, "final": bool(report_lines), "shares": {}, "judged": 0}
    from dlx.metrics.verdict import bottleneck_verdict

    judged = bottleneck_verdict(records)
    shares_pct = {k[:-4]: v for k, v in judged.evidence.items() if k.endswith("_pct") and v is not None}
    result = {"final": bool(report_lines), "shares": shares_pct, "judged": len(records)}
    if report_lines:
        return {**result, "lines": report_lines}
    kind = judged.kind if judged.confident else f"{judged.kind} (tentative)"
    sample = "" if len(records) == len(columns) else f", every {-(-len(columns) // VERDICT_RECORDS)}th record"
    lines = [
        f"{kind}: {judged.reason} (over the records so far{sample}: report.md has the run's own verdict at its end)",
        f"Evidence: {judged.evidence_line()}",
        f"Confidence: {judged.confidence_line()}",
    ]
    return {**result, "lines": lines}


def flat_config(config: dict[str, Any]) -> dict[str, str]:
    """config.yaml as `section.key` → value text."""
    flat = {}
    for section, values in config.items():
        if isinstance(values, dict):
            for key, value in values.items():
                flat[f"{section}.{key}"] = _text(value)
        else:
            flat[str(section)] = _text(values)
    return flat


def config_differences(configs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The keys where any run's config differs from the first run's: [{"key", "values": one per run}]."""
    flats = [flat_config(c) for c in configs]
    keys = sorted({k for f in flats for k in f})
    rows = []
    for key in keys:
        values = [f.get(key) for f in flats]
        if any(v != values[0] for v in values[1:]):
            rows.append({"key": key, "values": values})
    return rows


def _text(value: Any) -> str:
    if isinstance(value, (dict, list)):
        import json

        return json.dumps(value, sort_keys=True)
    return "null" if value is None else str(value)


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
