"""Open one split of a prepared dataset for the loader, turning every kind of bad input into one clear UserError."""

from __future__ import annotations

from pathlib import Path

from dlx.data.loader.windows import SplitSpec
from dlx.data.shards import Manifest, open_shard, read_manifest, verify_shards
from dlx.errors import UserError


def open_split(folder: str | Path, split: str, verify: bool) -> tuple[Manifest, SplitSpec]:
    """The manifest and the split's shards; each shard must exist with the size the manifest gives.

    `verify` also checks every file's SHA-256 (reads the whole dataset; worth it once, not on every start).
    """
    manifest = read_manifest(folder)  # UserError when the folder or its manifest is missing or damaged
    shards = manifest.split_shards(split)
    if not shards or manifest.split_tokens(split) == 0:
        raise UserError(f"dataset {folder} has no {split!r} tokens; run `dlx prepare` to fill it")
    if verify:
        problems = verify_shards(folder)
        if problems:
            more = f" (and {len(problems) - 1} more problems)" if len(problems) > 1 else ""
            raise UserError(f"dataset {folder} failed verification: {problems[0]}{more}; run `dlx prepare` again")
    for shard in shards:
        open_shard(folder, shard, manifest.dtype)  # UserError on a missing or truncated file
    spec = SplitSpec(str(Path(folder).resolve()), manifest.dtype, tuple((s.name, s.tokens) for s in shards))
    return manifest, spec
