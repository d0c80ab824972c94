"""Inputs → the files in document order, each with the format its documents are read in, streamed.

The order is the order of the inputs as given, each input's files sorted by path: it fixes the order of the documents
in the shards, so the same inputs always give the same bytes.
"""

from __future__ import annotations

import glob
import hashlib
import os
import sysconfig
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from dlx.data.curate.kinds import CODE_SUFFIXES
from dlx.errors import UserError

COMPRESSIONS = {".gz": "gz", ".zst": "zst"}
DATA_KINDS = {".jsonl": "jsonl", ".json": "json", ".parquet": "parquet", ".txt": "text"}


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


class InputList:
    """The input files in document order, walked afresh by every pass over them (never held as a list).

    `measure()` walks once for the totals (files, bytes, fingerprint) and raises UserError for a missing input; later
    walks raise UserError if they see other files than the first did (the inputs changed while prepare ran). Memory
    is bounded by the largest single folder listing or glob match list (names only), not by the corpus.
    """

    def __init__(self, specs: tuple[str, ...] = (), corpus: str | None = None):
        self.specs, self.corpus = tuple(specs), corpus
        self.files = self.bytes = self.ignored = 0
        self.fingerprint: str | None = None

    def measure(self) -> InputList:
        digest, files, size, ignored = hashlib.sha256(), 0, 0, 0
        for info in self._walk():
            if info is None:
                ignored += 1
                continue
            digest.update(_fingerprint_line(info))
            files, size = files + 1, size + info.size
        if not files:
            raise UserError(
                f"no input files found in {', '.join(self.specs)} (known formats: .txt .jsonl .json .parquet, "
                ".gz/.zst of them, and source files)"
            )
        self.files, self.bytes, self.ignored, self.fingerprint = files, size, ignored, digest.hexdigest()
        return self

    def __iter__(self) -> Iterator[InputFile]:
        digest = hashlib.sha256()
        for info in self._walk():
            if info is not None:
                digest.update(_fingerprint_line(info))
                yield info
        if self.fingerprint is not None and digest.hexdigest() != self.fingerprint:
            raise UserError(
                "the input files changed while prepare ran (added, removed, resized or touched); "
                "rerun the same command once they stay put"
            )

    def _walk(self) -> Iterator[InputFile | None]:
        """Every candidate file in order: an InputFile, or None for a file in a folder with an unread suffix."""
        if self.corpus:
            skip = frozenset({"test", "site-packages", "dist-packages"})
            for path in _walk_folder(str(stdlib_folder()), skip_top=skip):
                if path.endswith(".py"):
                    yield _stat_file(path, explicit=True)
            return
        for path, explicit in _unique_paths(self.specs):
            try:
                yield _stat_file(path, explicit)
            except OSError as e:
                raise UserError(f"input {path}: {e.strerror}") from None


def _stat_file(path: str, explicit: bool) -> InputFile | None:
    kind = file_kind(path, explicit)
    if kind is None:
        return None
    st = os.stat(path)
    return InputFile(os.path.abspath(path), st.st_size, st.st_mtime_ns, *kind)


def _walk_folder(folder: str, skip_top: frozenset[str] = frozenset()) -> Iterator[str]:
    """Every non-hidden file under folder, in sorted order; hidden folders (.git) and __pycache__ are skipped."""
    for root, dirs, files in os.walk(folder):
        top = root == folder
        dirs[:] = sorted(
            d for d in dirs if not d.startswith(".") and d != "__pycache__" and not (top and d in skip_top)
        )
        yield from (os.path.join(root, f) for f in sorted(files) if not f.startswith("."))


def _expand(spec: str) -> Iterator[tuple[str, bool]]:
    """(path, explicit) for one input: a file, a folder (walked), or a glob (folders it matches are walked).

    A glob that matches a folder and also files or folders inside it yields those once, from the folder's walk.
    """
    if os.path.isfile(spec):
        yield spec, True
        return
    if os.path.isdir(spec):
        yield from ((p, False) for p in _walk_folder(spec))
        return
    matches = sorted(glob.glob(spec, recursive=True)) if glob.has_magic(spec) else []
    if not matches:
        what = "the glob matches nothing" if glob.has_magic(spec) else "no such file or folder"
        raise UserError(f"input {spec!r}: {what}")
    walked: set[str] = set()
    for m in matches:
        if any(a in walked for a in _ancestors(os.path.abspath(m))):
            continue
        if os.path.isfile(m):
            yield m, True
        elif os.path.isdir(m):
            walked.add(os.path.abspath(m))
            yield from ((p, False) for p in _walk_folder(m))


def _unique_paths(specs: tuple[str, ...]) -> Iterator[tuple[str, bool]]:
    """Each input's paths in order, a file named by two inputs only the first time.

    Only files under a folder that two inputs reach (the root of one inside or equal to the root of another) are
    remembered to tell repeats, so inputs that do not overlap cost no memory per file.
    """
    roots: dict[str, set[int]] = {}
    for i, spec in enumerate(specs):
        roots.setdefault(_root(spec), set()).add(i)
    overlapping = any(len(owners) > 1 or any(a in roots for a in _ancestors(r)) for r, owners in roots.items())
    seen: set[str] = set()
    for i, spec in enumerate(specs):
        for path, explicit in _expand(spec):
            absolute = os.path.abspath(path)
            if overlapping and _shared(absolute, i, roots):
                if absolute in seen:
                    continue
                seen.add(absolute)
            yield path, explicit


def _root(spec: str) -> str:
    """The folder (or file) every path of an input lies under: a glob's part before its first wildcard."""
    if not glob.has_magic(spec):
        return os.path.abspath(spec)
    parts = spec.split(os.sep)
    plain = next(i for i, part in enumerate(parts) if glob.has_magic(part))
    return os.path.abspath(os.sep.join(parts[:plain]) or (os.sep if spec.startswith(os.sep) else "."))


def _ancestors(path: str) -> Iterator[str]:
    while (parent := os.path.dirname(path)) != path:
        yield parent
        path = parent


def _shared(path: str, spec: int, roots: dict[str, set[int]]) -> bool:
    """The path lies under the root of an input other than `spec`."""
    return any((owners := roots.get(a)) and owners - {spec} for a in (path, *_ancestors(path)))


def stdlib_folder() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def _fingerprint_line(f: InputFile) -> bytes:
    """SHA-256 over these lines (path, size, mtime): equal fingerprints mean the same inputs in the same order."""
    return f"{f.path}\0{f.size}\0{f.mtime_ns}\n".encode("utf-8", "surrogateescape")
