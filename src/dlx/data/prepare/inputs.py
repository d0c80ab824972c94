"""Inputs → an ordered list of files, each with the format its documents are read in.

The order is the order of the inputs as given, each input's files sorted by path: it fixes the order of the documents
in the shards, so the same inputs always give the same bytes.
"""

from __future__ import annotations

import glob
import hashlib
import os
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from dlx.errors import UserError

COMPRESSIONS = {".gz": "gz", ".zst": "zst"}
DATA_KINDS = {".jsonl": "jsonl", ".json": "json", ".parquet": "parquet", ".txt": "text"}
# One file = one document: source code (CodeNet's languages and more) and other plain-text formats.
_CODE = (
    ".py .pyi .c .h .cc .cpp .cxx .hpp .hh .hxx .java .js .mjs .ts .tsx .jsx .go .rs .rb .php .cs .swift .kt .kts "
    ".scala .m .mm .sh .bash .zsh .pl .pm .lua .r .jl .hs .ml .mli .sql .f .f90 .f95 .for .pas .d .dart .ex .exs .erl "
    ".clj .cljs .el .lisp .scm .rkt .vb .fs .fsx .v .sv .vhd .asm .s .cob .cbl .groovy .nim .zig .cu .cuh .awk .cr "
    ".bf .md .rst .tex .html .htm .css .scss .xml .yaml .yml .toml .ini .cfg"
)
CODE_SUFFIXES = frozenset(_CODE.split())


@dataclass(frozen=True)
class InputFile:
    path: str
    """Absolute path."""
    size: int
    """Bytes on disk (compressed size for .gz/.zst)."""
    mtime_ns: int
    """Modification time; with path and size it tells whether the inputs changed since a previous run."""
    kind: str
    """How documents are read: `text` (the file is one document), `jsonl`, `json` (lines or array), `parquet`."""
    compression: str | None = None
    """`gz`, `zst` or None."""

    @property
    def splittable(self) -> bool:
        """Workers can read disjoint byte ranges of it (uncompressed JSON lines)."""
        return self.kind == "jsonl" and self.compression is None


def file_kind(path: str, explicit: bool) -> tuple[str, str | None] | None:
    """(kind, compression) from the suffixes; a file named explicitly with an unknown suffix is one text document."""
    name = path.lower()
    compression = None
    for suffix, comp in COMPRESSIONS.items():
        if name.endswith(suffix):
            compression, name = comp, name[: -len(suffix)]
    suffix = os.path.splitext(name)[1]
    if suffix in DATA_KINDS and not (suffix == ".parquet" and compression):
        return DATA_KINDS[suffix], compression
    if suffix in CODE_SUFFIXES or explicit:
        return "text", compression
    return None


def _stat_file(path: str, explicit: bool) -> InputFile | None:
    kind = file_kind(path, explicit)
    if kind is None:
        return None
    st = os.stat(path)
    return InputFile(os.path.abspath(path), st.st_size, st.st_mtime_ns, *kind)


def _walk(folder: str, skip_top: frozenset[str] = frozenset()) -> list[str]:
    """Every non-hidden file under folder, sorted; hidden folders (.git) and __pycache__ are skipped."""
    found = []
    for root, dirs, files in os.walk(folder):
        top = root == folder
        dirs[:] = sorted(
            d for d in dirs if not d.startswith(".") and d != "__pycache__" and not (top and d in skip_top)
        )
        found.extend(os.path.join(root, f) for f in sorted(files) if not f.startswith("."))
    return found


def _expand(spec: str) -> list[tuple[str, bool]]:
    """(path, explicit) for one input: a file, a folder (walked), or a glob (folders it matches are walked)."""
    if os.path.isfile(spec):
        return [(spec, True)]
    if os.path.isdir(spec):
        return [(p, False) for p in _walk(spec)]
    matches = sorted(glob.glob(spec, recursive=True)) if glob.has_magic(spec) else []
    if not matches:
        what = "the glob matches nothing" if glob.has_magic(spec) else "no such file or folder"
        raise UserError(f"input {spec!r}: {what}")
    out = []
    for m in matches:
        if os.path.isfile(m):
            out.append((m, True))
        elif os.path.isdir(m):
            out.extend((p, False) for p in _walk(m))
    return out


def resolve_inputs(specs: list[str] | tuple[str, ...]) -> tuple[list[InputFile], int]:
    """The input files in document order, and how many files in folders were ignored for their suffix."""
    files: list[InputFile] = []
    seen: set[str] = set()
    ignored = 0
    for spec in specs:
        for path, explicit in _expand(spec):
            if os.path.abspath(path) in seen:
                continue
            seen.add(os.path.abspath(path))
            try:
                info = _stat_file(path, explicit)
            except OSError as e:
                raise UserError(f"input {path}: {e.strerror}") from None
            if info is None:
                ignored += 1
            else:
                files.append(info)
    if not files:
        raise UserError(
            f"no input files found in {', '.join(specs)} (known formats: .txt .jsonl .json .parquet, "
            ".gz/.zst of them, and source files)"
        )
    return files, ignored


def stdlib_folder() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def stdlib_inputs() -> list[InputFile]:
    """The running interpreter's standard library .py sources without test/ (and without installed packages)."""
    folder = str(stdlib_folder())
    skip = frozenset({"test", "site-packages", "dist-packages"})
    paths = [p for p in _walk(folder, skip_top=skip) if p.endswith(".py")]
    return [info for p in paths if (info := _stat_file(p, explicit=True)) is not None]


def fingerprint(files: list[InputFile]) -> str:
    """SHA-256 over every file's path, size and mtime: equal fingerprints mean the same inputs in the same order."""
    digest = hashlib.sha256()
    for f in files:
        digest.update(f"{f.path}\0{f.size}\0{f.mtime_ns}\n".encode("utf-8", "surrogateescape"))
    return digest.hexdigest()
