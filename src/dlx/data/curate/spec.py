"""What curation was asked to do: validated once, recorded in the manifest (`source.request.curation`)."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from dlx.data.curate.decontam import DEFAULT_NGRAM, TaskIndex, build_index
from dlx.data.curate.kinds import KINDS
from dlx.data.curate.language import check_languages
from dlx.data.curate.minhash import threshold
from dlx.data.curate.pii import DEFAULT_KINDS, PII_KINDS
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
    """`redact`: replace the PII of `pii_kinds` by placeholders."""
    pii_kinds: Mapping[str, tuple[str, ...]] = field(default_factory=lambda: dict(DEFAULT_KINDS))
    """The PII kinds redacted in each kind of document (`prose`, `code`)."""
    input_kinds: tuple[tuple[str, str], ...] = ()
    """(input label, `code` or `prose`) for the inputs whose documents are declared of one kind (`kinds.py`)."""
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
            record["pii"] = {"mode": self.pii, "kinds": {kind: list(self.pii_kinds[kind]) for kind in KINDS}}
        if self.input_kinds:
            record["kinds"] = {"inputs": dict(self.input_kinds)}
        if self.tasks:
            record["decontaminate"] = {
                "tasks": list(self.tasks.names),
                "ngram": self.tasks.n,
                "task_documents": list(self.tasks.documents),
                "sha256": self.tasks.fingerprint(),
            }
        return record

    def input_kind(self, source: str) -> str | None:
        """The kind declared for an input's documents, None when undeclared."""
        return next((kind for label, kind in self.input_kinds if label == source), None)

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
    input_kinds: Mapping[str, str] | None = None,
    pii_kinds: Mapping[str, Sequence[str]] | None = None,
) -> CurateSpec:
    """A validated CurateSpec; UserError naming the option for an unknown stage or a value out of range.
    `quality`: True for DEFAULT_RULES, a path for a YAML file of rules. `input_kinds`: input label → kind;
    `pii_kinds`: document kind → the PII kinds redacted in it (the kinds not named keep DEFAULT_KINDS)."""
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
        pii_kinds=checked_pii_kinds(pii_kinds or {}),
        input_kinds=checked_input_kinds(input_kinds or {}, [label for label, _ in sources or ()]),
    )


def checked_pii_kinds(given: Mapping[str, Sequence[str]]) -> dict[str, tuple[str, ...]]:
    """DEFAULT_KINDS with the document kinds `given` replaced; UserError naming an unknown kind."""
    kinds = dict(DEFAULT_KINDS)
    for doc_kind, pii in given.items():
        if doc_kind not in KINDS:
            raise UserError(f"--pii-kinds {doc_kind}=...: {doc_kind!r} is no document kind; use {' or '.join(KINDS)}")
        for name in pii:
            if name not in PII_KINDS:
                raise UserError(
                    f"--pii-kinds {doc_kind}=...: {name!r} is unknown; the kinds are {', '.join(PII_KINDS)}"
                )
        kinds[doc_kind] = tuple(dict.fromkeys(pii))
    return kinds


def checked_input_kinds(given: Mapping[str, str], labels: list[str]) -> tuple[tuple[str, str], ...]:
    """(label, kind) per declared input; UserError for an input not given or a kind not known."""
    for label, kind in given.items():
        if kind not in KINDS:
            raise UserError(f"--kind {label}={kind}: the kind is {' or '.join(KINDS)}")
        if labels and label not in labels:
            raise UserError(f"--kind {label}={kind}: {label!r} is not one of the inputs ({', '.join(labels)})")
    return tuple(given.items())


def parse_assignments(values: Sequence[str], option: str) -> dict[str, list[str]]:
    """`NAME=A,B` strings (each given once) as {NAME: [A, B]}; UserError naming `option` for another shape."""
    parsed: dict[str, list[str]] = {}
    for value in values:
        name, sep, rest = value.rpartition("=")
        if not sep or not name or name in parsed:
            raise UserError(f"{option} {value!r}: give NAME=VALUE, each NAME once")
        parsed[name] = [part.strip() for part in rest.split(",") if part.strip()]
    return parsed
