"""The curation report: per source, documents and bytes in, removed per reason, kept; the languages detected, the
PII redacted, up to five removed examples per reason and the near-duplicate cluster sizes. `summarise` is the JSON
form (`dlx data info --json` under `curation`), `render_markdown` the curation.md beside the manifest."""

from __future__ import annotations

import json
from pathlib import Path


def summarise(params: dict, counts: dict) -> dict:
    """Parameters and counts, with kept documents and bytes per source and over all sources."""
    sources = {}
    total = {"in": [0, 0], "removed": [0, 0], "kept": [0, 0]}
    for name, c in counts.get("sources", {}).items():
        removed = [sum(r[i] for r in c["removed"].values()) for i in (0, 1)]
        kept = [c["in"][0] - removed[0], c["in"][1] - removed[1]]
        sources[name] = {**c, "kept": kept}
        for key, pair in (("in", c["in"]), ("removed", removed), ("kept", kept)):
            total[key] = [total[key][0] + pair[0], total[key][1] + pair[1]]
    return {
        "stages": params,
        "total": total,
        "sources": sources,
        "examples": counts.get("examples", {}),
        "clusters": counts.get("clusters", {}),
    }


def summary_lines(params: dict, counts: dict) -> list[str]:
    """A few lines for `dlx data info`."""
    s = summarise(params, counts)
    lines = [f"  curation          {', '.join(k for k in s['stages'] if k != 'sources') or 'none'}"]
    for name, c in s["sources"].items():
        removed = ", ".join(f"{reason} {docs:,}" for reason, (docs, _) in sorted(c["removed"].items())) or "none"
        lines.append(f"    {name}: {c['in'][0]:,} in, {c['kept'][0]:,} kept; removed: {removed}")
    return lines


def removed_lines(path: Path, removed: dict | None) -> list[str]:
    """`dlx data info`'s lines on the audit trail (`audit.summarise_file`'s summary of `path`)."""
    if removed is None:
        return [f"    removed list: {path.name} is missing (a dataset curated before the audit trail existed)"]
    reasons = ", ".join(f"{reason} {n:,}" for reason, n in removed["reasons"].items()) or "none"
    return [
        f"    removed list: {path} ({removed['documents']:,} documents, {removed['with_id_or_url']:,} with an id or "
        f"url; {reasons}): one JSON line each, with its file, place, reason and what it duplicates"
    ]


def render_markdown(params: dict, counts: dict) -> str:
    """curation.md: what each stage did, per source."""
    s = summarise(params, counts)
    out = ["# Curation", "", "## Stages", ""]
    out += [f"- **{stage}**: {value}" for stage, value in s["stages"].items()] or ["- none"]
    out += ["", "## Per source", "", "| source | reason | documents | bytes |", "|---|---|---:|---:|"]
    for name, c in s["sources"].items():
        out.append(f"| {name} | in | {c['in'][0]:,} | {c['in'][1]:,} |")
        out += [f"| {name} | removed: {r} | {d:,} | {b:,} |" for r, (d, b) in sorted(c["removed"].items())]
        out.append(f"| {name} | kept | {c['kept'][0]:,} | {c['kept'][1]:,} |")
    for key, title in (("kinds", "Document kinds"), ("languages", "Languages detected"), ("redacted", "PII redacted")):
        rows = [(n, k, v) for n, c in s["sources"].items() for k, v in sorted(c.get(key, {}).items())]
        if rows:
            out += ["", f"## {title}", "", "| source | kind | count |", "|---|---|---:|"]
            out += [f"| {n} | {k} | {v:,} |" for n, k, v in rows]
    if s["clusters"]:
        out += ["", "## Near-duplicate clusters by size", "", "| size | clusters |", "|---|---:|"]
        out += [f"| {size} | {n:,} |" for size, n in s["clusters"].items()]
    if s["examples"]:
        out += ["", "## Removed examples (first characters; a quality rule's measured value in brackets)", ""]
        for reason, examples in sorted(s["examples"].items()):
            out.append(f"- {reason}")
            out += ["  - `" + e.replace("`", "'") + "`" for e in examples]
    return "\n".join(out) + "\n"


def decontamination_note(folder: Path, tasks: list[str]) -> str | None:
    """One line naming the eval tasks the dataset in `folder` was not decontaminated against; None when it was
    against all of them, or when `folder` holds no manifest."""
    try:
        manifest = json.loads((folder / "manifest.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    curation = manifest.get("source", {}).get("request", {}).get("curation") or {}
    done = set(curation.get("decontaminate", {}).get("tasks", []))
    missing = [task for task in tasks if task not in done]
    if not missing:
        return None
    return (
        f"Tasks not decontaminated from the training data {folder}: {', '.join(missing)} (their documents may be in "
        f"it; prepare with --decontaminate {','.join(missing)})"
    )
