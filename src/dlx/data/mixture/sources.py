"""A mixture's sources: `data.mix` parsed and checked, each source named, and each opened as a prepared dataset.

`{PATH: WEIGHT, ...}` in a recipe, `PATH=W,PATH=W` on the command line. Sources are kept in the order of their resolved
paths (not as written), so the same mixture written in another order is the same run. A source is named by its folder
name, or by its path as written when two folders share a name; metrics and eval records use these names.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

from dlx.data.shards import TOKENIZER_FILE, Manifest, read_manifest
from dlx.data.source import Source
from dlx.data.tokenizer_identity import describe_difference, read_identity
from dlx.errors import UserError

MIX_SYNTAX = "data.mix takes PATH=W,PATH=W on the command line or {PATH: W, ...} in a recipe, each W a number > 0"


def parse_mix(text: str) -> dict[str, float]:
    """`PATH=W,PATH=W` → {PATH: W}; ValueError naming the part that does not parse (a path may hold '=' itself)."""
    mix: dict[str, float] = {}
    for part in (p.strip() for p in text.split(",")):
        path, equals, weight = part.rpartition("=")
        if not equals or not path.strip():
            raise ValueError(f"'{part}' is not PATH=W; {MIX_SYNTAX}")
        try:
            value = float(weight)
        except ValueError:
            raise ValueError(f"weight '{weight}' of {path.strip()} is not a number; {MIX_SYNTAX}") from None
        if path.strip() in mix:
            raise ValueError(f"{path.strip()} is given twice; give each dataset once")
        mix[path.strip()] = value
    return mix


def check_mix(mix: dict[str, float]) -> None:
    """Weights positive and finite, at least one source, no folder twice (also spelled differently)."""
    if not mix:
        raise ValueError(f"no datasets given; {MIX_SYNTAX}")
    seen: dict[Path, str] = {}
    for path, weight in mix.items():
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight) or weight <= 0:
            raise ValueError(f"the weight of {path} is {weight!r}; {MIX_SYNTAX}")
        resolved = Path(path).resolve()
        if resolved in seen:
            raise ValueError(f"{seen[resolved]} and {path} are the same folder; give each dataset once")
        seen[resolved] = path


def mix_sources(mix: dict[str, float]) -> list[Source]:
    """The sources of a checked `data.mix`, in the order of their resolved paths, each with its name."""
    paths = sorted(mix, key=lambda p: str(Path(p).resolve()))
    names = [Path(p).resolve().name or str(Path(p).resolve()) for p in paths]
    collide = {n for n in names if names.count(n) > 1}
    return [
        Source(os.path.normpath(p) if n in collide else n, Path(p), float(mix[p]))
        for p, n in zip(paths, names, strict=True)
    ]


def open_sources(sources: list[Source], key: str = "data.mix source") -> list[Manifest]:
    """Each source's manifest; UserError when one is not a complete prepared dataset or the tokenizers differ. `key`:
    how a message names a source before its path (`data.path` for one dataset)."""
    manifests = []
    for source in sources:
        try:
            manifest = read_manifest(source.path)
        except UserError as e:
            raise UserError(f"{key} {source.path}: {e}") from None
        if not manifest.complete:
            raise UserError(
                f"{key} {source.path} is still being prepared (manifest not complete); finish `dlx prepare` first"
            )
        manifests.append(manifest)
    check_same_tokenizer(sources)
    return manifests


def check_same_tokenizer(sources: list[Source]) -> None:
    """Every source was tokenized by one tokenizer, compared by content (`dlx.data.tokenizer_identity`); nothing to
    compare for one source."""
    if len(sources) < 2:
        return
    first = sources[0]
    reference = read_identity(first.path / TOKENIZER_FILE)
    for source in sources[1:]:
        difference = describe_difference(reference, read_identity(source.path / TOKENIZER_FILE))
        if difference is not None:
            raise UserError(
                f"data.mix sources {first.path} and {source.path} have different tokenizers ({difference}); "
                f"prepare both with the same one: dlx prepare ... --tokenizer {first.path / TOKENIZER_FILE}"
            )
