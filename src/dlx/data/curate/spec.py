"""What curation was asked to do: validated once, recorded in the manifest (`source.request.curation`)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from dlx.data.curate.decontam import DEFAULT_NGRAM, TaskIndex, build_index
from dlx.data.curate.language import check_languages
from dlx.data.curate.minhash import threshold
from dlx.data.curate.quality import load_rules
from dlx.errors import UserError

DEDUP_MODES = ("exact", "near")
PII_MODES = ("redact",)
DEFAULT_SHINGLE = 5
DEFAULT_BANDS = 14
DEFAULT_ROWS = 8


@dataclass(frozen=True)
class CurateSpec:
    """The curation stages of one prepare run; every field off/empty means none runs."""

    dedup: str | None = None
    """`exact` (normalised-text hash) or `near` (exact, then MinHash LSH clusters); None: no deduplication."""
    shingle: int = DEFAULT_SHINGLE
    """Shingle length for MinHash: characters (CJK), words, or code tokens."""
    bands: int = DEFAULT_BANDS
    """LSH bands: documents sharing any band are near-duplicates."""
    rows: int = DEFAULT_ROWS
    """MinHash values per band."""
    languages: tuple[str, ...] = ()
    """Keep documents identified as one of these ISO 639-1 codes (code documents are kept whatever their text)."""
    quality: dict | None = None
    """Quality rules {prose: {...}, code: {...}}; None: no quality filter."""
    pii: str | None = None
    """`redact`: replace e-mail, IP, phone and PRC ID numbers by placeholders."""
    tasks: TaskIndex | None = field(default=None, compare=False)
    """Decontamination index of evaluation task documents; None: no decontamination."""
    sources: tuple[tuple[str, str], ...] = ()
    """(label, absolute path prefix) per input, for counting per source."""

    @property
    def active(self) -> bool:
        return bool(self.dedup or self.languages or self.quality or self.pii or self.tasks)

    def record(self) -> dict | None:
        """The parameters of every stage that runs, for the manifest; None when none runs."""
        if not self.active:
            return None
        record: dict = {"sources": [label for label, _ in self.sources]}
        if self.dedup:
            record["dedup"] = {"mode": self.dedup, "normalise": "NFKC, whitespace collapsed"}
            if self.dedup == "near":
                record["dedup"] |= {"shingle": self.shingle, "bands": self.bands, "rows": self.rows}
                record["dedup"]["threshold"] = round(threshold(self.bands, self.rows), 4)
        if self.languages:
            record["languages"] = {"keep": list(self.languages), "model": "py3langid"}
        if self.quality:
            record["quality"] = self.quality
        if self.pii:
            record["pii"] = {"mode": self.pii, "kinds": ["email", "ip", "prc_id", "phone"]}
        if self.tasks:
            record["decontaminate"] = {
                "tasks": list(self.tasks.names),
                "ngram": self.tasks.n,
                "task_documents": list(self.tasks.documents),
                "sha256": self.tasks.fingerprint(),
            }
        return record

    def source_of(self, path: str) -> str:
        """The label of the input a file came from (the first whose path prefix holds it)."""
        for label, prefix in self.sources:
            if path == prefix or path.startswith(prefix.rstrip(os.sep) + os.sep):
                return label
        return self.sources[0][0] if self.sources else "corpus"


def build_spec(
    *,
    dedup: str | None = None,
    shingle: int = DEFAULT_SHINGLE,
    bands: int = DEFAULT_BANDS,
    rows: int = DEFAULT_ROWS,
    languages: list[str] | None = None,
    quality: bool | str | None = None,
    pii: str | None = None,
    task_texts: dict[str, list[str]] | None = None,
    decontaminate_ngram: int = DEFAULT_NGRAM,
    sources: list[tuple[str, str]] | None = None,
) -> CurateSpec:
    """A validated CurateSpec; UserError naming the option for an unknown stage or a value out of range.
    `quality`: True for DEFAULT_RULES, a path for a YAML file of rules."""
    if dedup is not None and dedup not in DEDUP_MODES:
        raise UserError(f"--dedup {dedup!r} is unknown; choose one of: {', '.join(DEDUP_MODES)}")
    if pii is not None and pii not in PII_MODES:
        raise UserError(f"--pii {pii!r} is unknown; choose one of: {', '.join(PII_MODES)}")
    for name, value, low, high in (
        ("--near-shingle", shingle, 1, 64),
        ("--near-bands", bands, 1, 1024),
        ("--near-rows", rows, 1, 64),
        ("--decontaminate-ngram", decontaminate_ngram, 4, 64),
    ):
        if not low <= value <= high:
            raise UserError(f"{name} must be between {low} and {high}, got {value}")
    rules = None if not quality else load_rules(None if quality is True else str(quality))
    index = build_index(task_texts, decontaminate_ngram) if task_texts else None
    return CurateSpec(
        dedup=dedup,
        shingle=shingle,
        bands=bands,
        rows=rows,
        languages=check_languages(languages) if languages is not None else (),
        quality=rules,
        pii=pii,
        tasks=index,
        sources=tuple(sources or ()),
    )
