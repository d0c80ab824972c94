"""The global deduplication step of a curated prepare, on signatures only: after the scan of a one-machine run, or at
the merge of a run split into tasks (from the signature files the tasks wrote). It decides which documents are
duplicates, counts them into the scan record, recounts the validation statistics over the documents kept, and
hands on the removed documents as (unit, ordinal) pairs, written beside the manifest (DROPS_FILE) before the first
manifest so a resumed run routes the very same documents. Beside them: curation.md (REPORT_FILE) and the audit trail
(REMOVED_FILE: one JSON line per removed document, `curate/audit.py`), the per-document stages' lines first, then the
duplicates', each in corpus order."""

from __future__ import annotations

import io
import zlib
from pathlib import Path

import numpy as np

from dlx.data.curate.audit import duplicate_lines
from dlx.data.curate.dedup import KEPT, REASONS, find_duplicates
from dlx.data.curate.report import render_markdown
from dlx.data.curate.spec import CurateSpec
from dlx.data.curate.stages import count_removed
from dlx.errors import UserError

DROPS_FILE = "curation-drops.npy"
REPORT_FILE = "curation.md"
REMOVED_FILE = "curation-removed.jsonl"
VERDICTS_FILE = "curation-verdicts.npy"
DROP_DTYPE = np.dtype([("unit", "<u4"), ("ordinal", "<u4")])
VERDICT_DTYPE = np.dtype([("unit", "<u4"), ("position", "<u4"), ("verdict", "u1")])
"""A document the per-document stages removed or redacted: its unit, its position among the unit's non-empty
documents, and REMOVED, REDACTED (as prose) or REDACTED_CODE (the documents not listed are kept as they are)."""
REMOVED, REDACTED, REDACTED_CODE = 1, 2, 3


def deduplicate(
    curation: dict, sigs: np.ndarray, spec: CurateSpec, origins: list[list[dict]]
) -> tuple[np.ndarray, np.ndarray, bytes]:
    """(which documents are kept, (docs,) bool; the removed ones, (removed,) of DROP_DTYPE in corpus order; their
    audit lines), counting the removed ones into `curation` per source and reason, with the near-duplicate cluster
    sizes. `origins`: each unit's files, which the signatures index."""
    assert spec.dedup is not None
    reason, clusters, original = find_duplicates(sigs, spec.dedup == "near")
    labels = [label for label, _ in spec.sources] or ["corpus"]
    positions = np.flatnonzero(reason != KEPT)
    for i in positions.tolist():
        head = sigs["head"][i].decode("utf-8", errors="ignore")
        count_removed(curation, labels[sigs["source"][i]], REASONS[reason[i]], int(sigs["bytes"][i]), head)
    if spec.dedup == "near":
        curation["clusters"] = clusters
    names = [REASONS[r] for r in reason[positions].tolist()]
    lines = b"".join(duplicate_lines(sigs, positions, original, names, origins))
    removed = sigs[positions]
    drops = np.zeros(removed.size, dtype=DROP_DTYPE)
    drops["unit"], drops["ordinal"] = removed["unit"], removed["ordinal"]
    return reason == KEPT, drops, lines


def packed(lines: list[bytes]) -> bytes:
    """A unit's audit lines, compressed (a corpus may remove millions of documents)."""
    return zlib.compress(b"".join(lines), 1)


def audit_trail(per_unit: list[bytes], duplicates: bytes) -> bytes:
    """REMOVED_FILE's content: the per-document stages' lines (each unit's `packed`), then the duplicates'."""
    return b"".join(zlib.decompress(blob) for blob in per_unit) + duplicates


def drops_bytes(drops: np.ndarray) -> bytes:
    """DROPS_FILE's (or VERDICTS_FILE's) content: a plain .npy array (read back without pickle)."""
    buffer = io.BytesIO()
    np.save(buffer, drops, allow_pickle=False)
    return buffer.getvalue()


def verdicts_of(counts_verdicts: list[np.ndarray]) -> np.ndarray:
    """The per-unit verdicts of a scan as one array, in (unit, position) order."""
    return np.concatenate(counts_verdicts) if counts_verdicts else np.zeros(0, dtype=VERDICT_DTYPE)


class UnitVerdicts:
    """VERDICTS_FILE, memory-mapped (a worker reads the few pages of each unit it encodes)."""

    def __init__(self, path: str):
        try:
            self.table = np.load(path, mmap_mode="r", allow_pickle=False)
        except (FileNotFoundError, ValueError) as e:
            folder = Path(path).parent
            raise UserError(f"{path} is missing or damaged ({e}); delete {folder} and run prepare again") from None
        self.units = self.table["unit"]

    def __call__(self, unit: int) -> np.ndarray:
        lo, hi = np.searchsorted(self.units, unit, side="left"), np.searchsorted(self.units, unit, side="right")
        return np.asarray(self.table[lo:hi])


def read_drops(out: Path) -> np.ndarray:
    """The removed documents of a curated dataset being written; UserError when the file is gone."""
    try:
        return np.load(out / DROPS_FILE, allow_pickle=False)
    except (FileNotFoundError, ValueError) as e:
        raise UserError(f"{out / DROPS_FILE} is missing or damaged ({e}); delete {out} and run prepare again") from None


class DropIndex:
    """The ordinals removed from each unit's part."""

    def __init__(self, drops: np.ndarray | None):
        self.units = drops["unit"] if drops is not None else np.zeros(0, dtype=np.uint32)
        self.ordinals = drops["ordinal"] if drops is not None else np.zeros(0, dtype=np.uint32)

    def __call__(self, unit: int) -> np.ndarray | None:
        lo, hi = np.searchsorted(self.units, unit, side="left"), np.searchsorted(self.units, unit, side="right")
        return self.ordinals[lo:hi] if hi > lo else None


def report_files(curation: dict, request: dict, drops: np.ndarray | None, removed: bytes) -> dict[str, bytes]:
    """The files beside a curated manifest: the report, the audit trail, and the deduplicated documents' places when
    deduplicated."""
    files = {
        REPORT_FILE: render_markdown(request.get("curation", {}), curation).encode("utf-8"),
        REMOVED_FILE: removed,
    }
    if drops is not None:
        files[DROPS_FILE] = drops_bytes(drops)
    return files
