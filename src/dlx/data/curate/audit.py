"""The audit trail of curation: one JSON line per removed document, so that a user can find every removal in the
input and reproduce it. A line holds the document's `file` and where in it (`line`, `element` or `row`, 1-based; the
byte `offset` its line starts at when prepare read the file in byte ranges; `frames_from` and `line` within the zstd
frames or gzip members read from that byte on; nothing more for a file that is one document), the record's `id` and
`url` when it has them, the `reason` (as in curation.md: `language`, `quality.prose.min_width`, `exact_duplicate`,
...), `measured` for a quality rule, and `duplicate_of` (the kept document, located the same way) for a duplicate.

The per-document stages write their lines as they remove (in a worker); duplicates are written at the decision, from
their signatures, which carry each document's place and key (its id, else its url, up to KEY_BYTES).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import numpy as np

AT_CODES = ("", "line", "offset", "row", "element", "frame_line")
"""How a document is located in its file (`prepare.readers.Document.at`), by code."""
KEY_BYTES = 48
KEY_ID, KEY_URL, KEY_CUT = 1, 2, 4


def origin(entry: dict, at: str, where: int) -> dict:
    """A document's place: its file entry (`file`, and `frames_from` for frames) and what `where` counts."""
    if not at:
        return dict(entry)
    return entry | {("line" if at == "frame_line" else at): where}


def key_of(fields: dict[str, str]) -> tuple[bytes, int]:
    """(the record's id, else its url, as UTF-8 of at most KEY_BYTES cut at a character boundary; KEY_ID or KEY_URL,
    plus KEY_CUT when cut), (b"", 0) when it has neither."""
    for name, code in (("id", KEY_ID), ("url", KEY_URL)):
        if name in fields:
            data = fields[name].encode("utf-8")
            if len(data) <= KEY_BYTES:
                return data, code
            return data[:KEY_BYTES].decode("utf-8", errors="ignore").encode("utf-8"), code | KEY_CUT
    return b"", 0


def key_fields(key: bytes, code: int) -> dict[str, str]:
    """The `id` or `url` of a stored key (a cut one ends in `…`)."""
    if not code:
        return {}
    text = key.decode("utf-8", errors="ignore") + ("…" if code & KEY_CUT else "")
    return {"id" if code & KEY_ID else "url": text}


def line(place: dict, reason: str, **more: object) -> bytes:
    """One line of the audit trail."""
    return (json.dumps(place | {"reason": reason} | more, ensure_ascii=False) + "\n").encode("utf-8")


def record_fields(fields: dict[str, str]) -> dict[str, str]:
    """The `id` and `url` of a record, as the audit shows them."""
    return {name: fields[name] for name in ("id", "url") if name in fields}


def duplicate_lines(
    sigs: np.ndarray, removed: np.ndarray, original: np.ndarray, reasons: list[str], origins: list[list[dict]]
) -> Iterator[bytes]:
    """The audit lines of the documents deduplication removed (positions `removed` in `sigs`, each with the
    position of the kept document it duplicates in `original` and its reason)."""

    def place(i: int) -> dict:
        s = sigs[i]
        entry = origins[int(s["unit"])][int(s["file"])]
        at = AT_CODES[int(s["at"])]
        return origin(entry, at, int(s["where"])) | key_fields(bytes(s["key"]), int(s["key_kind"]))

    for i, reason in zip(removed.tolist(), reasons, strict=True):
        yield line(place(i), reason, duplicate_of=place(int(original[i])))


def summarise_file(path: Path) -> dict | None:
    """{documents, by reason, with an id or url} of an audit trail; None when there is none."""
    if not path.is_file():
        return None
    reasons: Counter = Counter()
    keyed = 0
    with path.open(encoding="utf-8") as f:
        for text in f:
            entry = json.loads(text)
            reasons[entry["reason"]] += 1
            keyed += "id" in entry or "url" in entry
    return {"documents": sum(reasons.values()), "reasons": dict(sorted(reasons.items())), "with_id_or_url": keyed}
