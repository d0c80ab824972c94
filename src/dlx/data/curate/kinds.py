"""What kind a document is, `code` or `prose`: declared when its input says so, detected only for the rest.

A document's kind decides which quality rules judge it, whether language identification applies (never to code),
which PII is redacted and how its near-duplicate shingles are cut. In order, the first that answers decides:
1. the input it came from, declared with `--kind INPUT=code|prose` (`CurateSpec.input_kinds`);
2. its record's fields: a `lang`/`language` naming a programming language, or a `path`/`max_stars_repo_path` with a
   source-code suffix (The Stack and other code corpora);
3. its file's suffix, for a file that is one document (`.py`, `.c`, `.h`, ...; markup meant as prose, `.md`, `.rst`,
   `.tex`, `.txt`, is left to detection);
4. detection on the text (`code.looks_like_code`).
"""

from __future__ import annotations

import os

KINDS = ("prose", "code")
_ONE_DOCUMENT = (
    ".py .pyi .c .h .cc .cpp .cxx .hpp .hh .hxx .java .js .mjs .ts .tsx .jsx .go .rs .rb .php .cs .swift .kt .kts "
    ".scala .m .mm .sh .bash .zsh .pl .pm .lua .r .jl .hs .ml .mli .sql .f .f90 .f95 .for .pas .d .dart .ex .exs .erl "
    ".clj .cljs .el .lisp .scm .rkt .vb .fs .fsx .v .sv .vhd .asm .s .cob .cbl .groovy .nim .zig .cu .cuh .awk .cr "
    ".bf .md .rst .tex .html .htm .css .scss .xml .yaml .yml .toml .ini .cfg"
)
CODE_SUFFIXES = frozenset(_ONE_DOCUMENT.split())
"""Files prepare reads as one document each (besides `.txt`): source code (CodeNet's languages and more) and other
plain-text formats."""
PROSE_SUFFIXES = frozenset((".md", ".rst", ".tex", ".txt", ".org", ".adoc"))
"""One-document files that are read as prose, not declared code, although prepare reads them like source files."""
SOURCE_SUFFIXES = CODE_SUFFIXES - PROSE_SUFFIXES
_LANGUAGES = """
python c c++ cpp java javascript typescript go rust ruby php c# csharp swift kotlin scala objective-c objective-c++
shell bash zsh powershell perl lua r julia haskell ocaml sql fortran pascal delphi dart elixir erlang clojure
emacs-lisp lisp scheme racket visual-basic f# verilog systemverilog vhdl assembly cobol groovy nim zig cuda awk
crystal html css scss xml yaml toml json makefile dockerfile cmake jupyter-notebook batchfile tex markdown
"""
CODE_LANGUAGES = frozenset(_LANGUAGES.split())
"""Values of a record's `lang`/`language` field that declare code (compared in lower case; The Stack's names)."""
PATH_FIELDS = ("path", "max_stars_repo_path")
LANGUAGE_FIELDS = ("lang", "language")


def suffix_kind(path: str) -> str | None:
    """`code` for a file whose suffix is a programming or configuration language's, None otherwise."""
    name = path.lower()
    for compressed in (".gz", ".zst"):
        name = name.removesuffix(compressed)
    return "code" if os.path.splitext(name)[1] in SOURCE_SUFFIXES else None


def record_kind(fields: dict[str, str]) -> str | None:
    """`code` when a record's fields declare it (a programming language, or a source file's path), None otherwise."""
    for name in LANGUAGE_FIELDS:
        if name in fields and fields[name].strip().lower() in CODE_LANGUAGES:
            return "code"
    for name in PATH_FIELDS:
        if name in fields and suffix_kind(fields[name]):
            return "code"
    return None


def declared_kind(
    input_kind: str | None, file_path: str, one_document_file: bool, fields: dict[str, str]
) -> str | None:
    """The kind a document is declared to be, or None when only detection can tell: its input's declared kind, then
    its record's fields, then (for a file that is one document) its suffix."""
    if input_kind is not None:
        return input_kind
    if fields and (kind := record_kind(fields)):
        return kind
    return suffix_kind(file_path) if one_document_file else None
