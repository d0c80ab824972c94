"""A mixture's sources: `data.mix` parsed and checked, each source named, and each opened as a prepared dataset.

`{PATH: WEIGHT, ...}` in a recipe, `PATH=W,PATH=W` on the command line; a PATH is a local folder or the URL of a
dataset in object storage (s3://, gs://, hf://). Each source is identified by its key (`dataset_key`: a URL as written
without its trailing slash, a folder resolved), and sources are kept in the order of their keys (not as written), so
the same mixture written in another order is the same run (local folders, whose keys begin with `/`, come before
URLs). A source is named by its folder name or a URL's last part, or by its path as written when two names collide;
metrics and eval records use these names.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np

from dlx.data.loader.cache import share_cache
from dlx.data.remote import mirror_folder
from dlx.data.shards import TOKENIZER_FILE, Manifest, read_manifest
from dlx.data.source import Source
from dlx.data.storage import basename, is_url
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
    """Weights positive and finite, at least one source, no dataset twice (also spelled differently)."""
    if not mix:
        raise ValueError(f"no datasets given; {MIX_SYNTAX}")
    seen: dict[str, str] = {}
    for path, weight in mix.items():
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight) or weight <= 0:
            raise ValueError(f"the weight of {path} is {weight!r}; {MIX_SYNTAX}")
        key = dataset_key(path)
        if key in seen:
            same = "dataset" if is_url(path) else "folder"
            raise ValueError(f"{seen[key]} and {path} are the same {same}; give each dataset once")
        seen[key] = path


def dataset_key(path: str) -> str:
    """What identifies a dataset as written: a URL without its trailing slash, a local folder resolved."""
    return path.rstrip("/") if is_url(path) else str(Path(path).resolve())


def source_name(path: str) -> str:
    """A dataset's name unless it collides: a URL's last part, a folder's name (the resolved path for `/`)."""
    key = dataset_key(path)
    return basename(key) if is_url(path) else Path(key).name or key


def mix_sources(mix: dict[str, float], cache_dir: str | Path = "") -> list[Source]:
    """The sources of a checked `data.mix`, in the order of their keys, each with its name. A URL's source reads its
    local mirror under `cache_dir` (`dlx.data.remote.mirror_folder`; fetched by `mirror_dataset`, not here)."""
    paths = sorted(mix, key=dataset_key)
    names = [source_name(p) for p in paths]
    collide = {n for n in names if names.count(n) > 1}
    return [_source(p, p_name not in collide, float(mix[p]), cache_dir) for p, p_name in zip(paths, names, strict=True)]


def _source(path: str, unique: bool, weight: float, cache_dir: str | Path) -> Source:
    if is_url(path):
        url = path.rstrip("/")
        return Source(basename(url) if unique else url, mirror_folder(url, cache_dir), weight, url)
    return Source(source_name(path) if unique else os.path.normpath(path), Path(path), weight)


def cache_shares(sources: list[Source], split: str, cache_bytes: int) -> list[int]:
    """Each source's share of a cache bound of `cache_bytes` per split and rank: the bound divided between the sources
    in object storage by the size of their `split` (`dlx.data.loader.cache.share_cache`; read from their mirrors'
    manifests); 0 for a local source."""
    remote = [i for i, source in enumerate(sources) if source.url is not None]
    sizes = [_split_bytes(read_manifest(sources[i].path), split) for i in remote]
    shares = [0] * len(sources)
    for i, share in zip(remote, share_cache(sizes, cache_bytes), strict=True):
        shares[i] = share
    return shares


def _split_bytes(manifest: Manifest, split: str) -> int:
    return sum(shard.tokens for shard in manifest.split_shards(split)) * np.dtype(manifest.dtype).itemsize


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
