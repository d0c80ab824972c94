"""The run's data: which datasets it reads (`run_sources`), what they hold (`inspect_dataset`), and its batch sources
(`dlx.data.source.BatchSource`) built from one `LoaderSettings`.

The data section picks the kind, here and nowhere else in `train/`: `data.path` is one prepared dataset (one source,
named by its folder), `data.mix` several by weight (`dlx.data.mixture`), `data.path synthetic` generated tokens (no
source). A dataset given by URL is read through its local mirror (`dlx.data.remote.mirror_dataset`, made once per
process before anything reads it: `mirrored`). Everything downstream reads the sources and the loaders' protocol.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from dlx.data.mixture.sources import cache_shares, mix_sources, open_sources
from dlx.data.remote import mirror_dataset
from dlx.data.shards import TOKENIZER_FILE
from dlx.data.source import BatchSource, LoaderSettings, Source
from dlx.data.stages import StagedLoader
from dlx.data.synthetic import SyntheticLoader
from dlx.errors import UserError
from dlx.train.build.stages import StagePlan, resolve_stages
from dlx.train.config import SYNTHETIC, RunConfig

VAL_SEED_OFFSET = 1_000_003
"""Synthetic validation batches come from another stream than the training ones."""


def run_sources(config: RunConfig) -> tuple[Source, ...]:
    """The prepared datasets the run reads, each URL's mirrored: data.path's as one source of weight 1 named by its
    folder, or data.mix's in their canonical order; none for synthetic data. With data.stages, every stage's, each
    once (weight: the first stage's, 0 for a source it does not read)."""
    if config.data.stages:
        return staged_sources(config)
    if config.data.mix is not None:
        return mirrored(config, mix_sources(config.data.mix, config.data.cache_dir))
    if config.data.path == SYNTHETIC:
        return ()
    return (data_path_source(config),)


def data_path_source(config: RunConfig) -> Source:
    """data.path as one source of weight 1 named by its folder (a URL: by its last part, read from its mirror)."""
    return mirrored(config, mix_sources({config.data.path: 1.0}, config.data.cache_dir))[0]


def mirrored(config: RunConfig, sources: Iterable[Source]) -> tuple[Source, ...]:
    """`sources`, each one in object storage mirrored into its folder first (`mirror_dataset` under data.cache_dir,
    once per process; a message names it as `source_key` does)."""
    sources = tuple(sources)
    for source in sources:
        if source.url is not None and source.path not in _mirrored:
            folder = mirror_dataset(source.url, config.data.cache_dir, source_key(config))
            assert folder == source.path, f"{source.url} is mirrored in {folder}, not {source.path}"
            _mirrored.add(folder)
    return sources


_mirrored: set[Path] = set()
"""The mirror folders fetched by this process."""


def staged_sources(config: RunConfig) -> tuple[Source, ...]:
    """Every dataset of a staged run, each once in the order the stages first read them (mirrored)."""
    plan = resolve_stages(config, 1)
    assert plan is not None
    first = {source.name: source.weight for source in plan.stages[0].sources}
    sources: dict[str, Source] = {}
    for stage in plan.stages:
        for source in stage.sources:
            sources.setdefault(source.name, replace(source, weight=first.get(source.name, 0.0)))
    return mirrored(config, sources.values())


def source_label(config: RunConfig, source: Source) -> str:
    """How a message names a source: `data.path FOLDER` or `data.mix source FOLDER`."""
    return f"{source_key(config)} {source.path}"


def source_key(config: RunConfig) -> str:
    if any(stage.mix for stage in config.data.stages or []):
        return "data.stages source"
    return "data.mix source" if config.data.mix is not None else "data.path"


def reads_several(config: RunConfig) -> bool:
    """data.mix, or a stage with a mix: tokens and validation figures are recorded per source."""
    return config.data.mix is not None or any(stage.mix for stage in config.data.stages or [])


def loader_settings(
    config: RunConfig, device: torch.device | str, rank: int = 0, world_size: int = 1
) -> LoaderSettings:
    """The training loader's settings: data.*, train.seed, and this rank of `world_size` data-parallel replicas."""
    data = config.data
    return LoaderSettings(
        seq_len=data.seq_len,
        micro_batch_size=data.micro_batch_size,
        seed=config.train.seed,
        rank=rank,
        world_size=world_size,
        num_workers=data.num_workers,
        prefetch=data.prefetch,
        shuffle=data.shuffle,
        device=device,
        verify=data.verify,
        cache_bytes=int(data.cache_gb * 1e9),
        cache_downloads=data.cache_downloads,
    )


@dataclass(frozen=True)
class DatasetInfo:
    sources: tuple[Source, ...]
    """The datasets the run reads (`run_sources`); empty for synthetic data."""
    mixture: bool
    """data.mix: tokens and validation loss are also recorded per source."""
    vocab_size: int
    eos_id: int
    tokenizer: Path | None
    """tokenizer.json of the (first) dataset, copied into the run folder for `dlx generate`."""
    val_tokens: int
    """Tokens in the validation split, in the smallest source's (0: no eval possible)."""

    @property
    def path(self) -> Path | None:
        """The (first) dataset folder; None for synthetic data."""
        return self.sources[0].path if self.sources else None


def inspect_dataset(config: RunConfig) -> DatasetInfo:
    """Check the data section against the model before anything is written: every source a complete prepared dataset,
    one tokenizer (by content), fitting the model, with a validation split when eval is on. UserError names the key
    and the fix."""
    sources, mixture = run_sources(config), reads_several(config)
    if not sources:
        return DatasetInfo((), False, config.model.args.vocab_size, 0, None, 1 << 62)
    manifests = open_sources(list(sources), source_key(config))  # UserError naming the source (or both tokenizers)
    vocab_size = manifests[0].vocab_size
    if vocab_size > config.model.args.vocab_size:
        what = "data.mix sources have" if mixture else f"{source_label(config, sources[0])} has"
        raise UserError(f"{what} vocab_size {vocab_size:,}, {_larger_than_model(config, vocab_size)}")
    for source, manifest in zip(sources, manifests, strict=True):
        if config.eval.every and manifest.split_tokens("val") == 0:
            raise UserError(
                f"{source_label(config, source)} has no validation split; set eval.every 0 or prepare it with one"
            )
    tokenizer = sources[0].path / TOKENIZER_FILE
    found = tokenizer if tokenizer.is_file() else None  # preflight refuses a missing one and says how to fix it
    val_tokens = min(m.split_tokens("val") for m in manifests)
    return DatasetInfo(sources, mixture, vocab_size, manifests[0].eos_id, found, val_tokens)


def _larger_than_model(config: RunConfig, vocab_size: int) -> str:
    fix = (
        f"prepare the data with the tokenizer of model.init_from {config.model.init_from}"
        if config.model.init_from
        else f"set --model.vocab_size {vocab_size} (or more)"
    )
    return f"larger than model.vocab_size {config.model.args.vocab_size:,}; {fix}"


def build_train_loader(config: RunConfig, device: torch.device, rank: int = 0, world_size: int = 1) -> BatchSource:
    """The training batch source: loops over epochs, shuffled per epoch from the seed, each rank its own share."""
    settings = loader_settings(config, device, rank, world_size)
    plan = resolve_stages(config, world_size)
    if plan is not None:
        return StagedLoader(plan.spans(), RunStages(config, plan, settings))
    return open_loader(config, settings)


def open_loader(config: RunConfig, settings: LoaderSettings) -> BatchSource:
    """data.mix's, data.path's or synthetic data's batch source with these settings."""
    if config.data.mix is not None:
        from dlx.data.mixture import MixtureLoader

        return MixtureLoader(list(run_sources(config)), settings)
    if config.data.path == SYNTHETIC:
        return SyntheticLoader(config.model.args.vocab_size, settings)
    from dlx.data.loader import TokenLoader

    return TokenLoader(data_path_source(config).path, settings, "train", loop=True)


class RunStages:
    """Each stage's batch source (`dlx.data.stages.StageSources`): a mix stage's sources carry their draws from the
    earlier stages; a data.path stage reads the dataset in its own order; synthetic stages draw their own streams."""

    def __init__(self, config: RunConfig, plan: StagePlan, settings: LoaderSettings):
        self.config, self.plan, self.settings = config, plan, settings
        sources = run_sources(config)
        shares = cache_shares(list(sources), "train", settings.cache_bytes)
        self.cache_shares = {source.name: share for source, share in zip(sources, shares, strict=True)}
        """Each source's share of the cache bound, over every source in object storage of every stage: a source keeps
        its share, and so its window order, in every stage that reads it."""

    def open(self, index: int) -> BatchSource:
        stage = self.plan.stages[index]
        settings = replace(self.settings, seq_len=stage.seq_len, micro_batch_size=stage.micro_batch_size)
        if stage.kind == "mix":
            from dlx.data.mixture import MixtureLoader

            first_draws = self.plan.first_draws(index)
            shares = tuple(self.cache_shares[source.name] for source in stage.sources)
            sources = list(mirrored(self.config, stage.sources))
            return MixtureLoader(sources, settings, stage.source_ids, first_draws, shares)
        if stage.kind == "synthetic":
            settings = replace(settings, seed=settings.seed + index * VAL_SEED_OFFSET * 2)
        return open_loader(self.config, settings)

    def stage_tokens(self, index: int, steps: int | None = None) -> dict[str, int]:
        return self.plan.stage_tokens(index, steps)


def build_eval_loaders(
    config: RunConfig, device: torch.device, rank: int = 0, world_size: int = 1, stage_step: int = 0
) -> dict[str, BatchSource]:
    """{source name: one pass over the start of its validation split, in order, the same batches at every
    evaluation}; synthetic data: {"": its validation stream}. Built in-process (no workers): an evaluation reads a
    few batches, not worth starting processes for. With data.stages, at the seq_len and micro-batch of the stage of
    optimizer step `stage_step`, over every stage's sources."""
    settings = replace(loader_settings(config, device, rank, world_size), seed=0, num_workers=0, shuffle=False)
    plan = resolve_stages(config, world_size)
    if plan is not None:
        stage = plan.at(stage_step)
        settings = replace(settings, seq_len=stage.seq_len, micro_batch_size=stage.micro_batch_size)
    sources = run_sources(config)
    if not sources:
        seed = config.train.seed + VAL_SEED_OFFSET
        return {"": SyntheticLoader(config.model.args.vocab_size, replace(settings, seed=seed), config.eval.batches)}
    from dlx.data.loader import TokenLoader

    shares = cache_shares(list(sources), "val", settings.cache_bytes)  # the bound shared by the sources in buckets
    return {
        s.name: TokenLoader(s.path, replace(settings, cache_bytes=share), "val", loop=False)
        for s, share in zip(sources, shares, strict=True)
    }
