"""The page: `static/view.html` with uPlot's script and style, the page's own script and style, and (for `--out`) the
payload inlined, so the file asks no other host for anything. The server sends the same page with no payload inside:
its script then fetches `data.json` and follows it.
"""

from __future__ import annotations

import datetime
import json
import math
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

from dlx.atomic import atomic_write_text

PLACEHOLDERS = ("/*UPLOT_CSS*/", "/*VIEW_CSS*/", "/*DATA*/", "/*UPLOT_JS*/", "/*VIEW_JS*/")
"""In the order they appear in view.html."""


@cache
def _static(name: str) -> str:
    return resources.files("dlx.view").joinpath("static", name).read_text(encoding="utf-8")


def page_html(payload: dict[str, Any] | None) -> str:
    """The whole page; with `payload`, the page draws it and fetches nothing."""
    parts = {
        "/*UPLOT_CSS*/": _static("uplot/uPlot.min.css"),
        "/*VIEW_CSS*/": _static("view.css"),
        "/*UPLOT_JS*/": _static("uplot/uPlot.iife.min.js"),
        "/*VIEW_JS*/": _static("view.js"),
        "/*DATA*/": "" if payload is None else payload_json(payload).replace("<", "\\u003c"),
    }
    template = _static("view.html")
    pieces = [template]
    for placeholder in PLACEHOLDERS:  # split on each placeholder once, so no inserted text is searched again
        head, _, tail = pieces.pop().partition(placeholder)
        pieces += [head, parts[placeholder], tail]
    return "".join(pieces)


def payload_json(payload: dict[str, Any]) -> str:
    """Strict JSON (a NaN or infinity becomes null: JSON.parse takes no NaN), compact."""
    try:
        return json.dumps(payload, separators=(",", ":"), allow_nan=False)
    except ValueError:
        return json.dumps(_finite(payload), separators=(",", ":"), allow_nan=False)


def _finite(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


def write_page(path: Path, payload: dict[str, Any]) -> int:
    """`--out`: the self-contained page, written whole or not at all; returns its size in bytes."""
    stamped = {**payload, "written": datetime.datetime.now().astimezone().isoformat(timespec="seconds")}
    html = page_html(stamped)
    atomic_write_text(path, html)
    return len(html.encode("utf-8"))
