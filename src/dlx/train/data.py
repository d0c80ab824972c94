"""Batch sources for the trainer: the prepared dataset through `TokenLoader`, several of them by weight through
`MixtureLoader` (data.mix), or synthetic tokens with the same face.

All iterate `(inputs, targets)` int64 (micro_batch_size, seq_len) and have `epoch`, `windows_per_epoch`,
`batches_per_epoch`, `vocab_size`, `eos_id`, `state_dict()` / `load_state_dict()` and `close()`.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from dlx.data.mixture.sources import Source, mix_sources, open_sources
from dlx.data.shards import TOKENIZER_FILE, Manifest, read_manifest
from dlx.errors import UserError
from dlx.train.config import SYNTHETIC, RunConfig

VAL_SEED_OFFSET = 1_000_003
"""Synthetic validation batches come from another stream than the training ones."""
_MASK32 = 0xFFFFFFFF


def _hash32(x: Any) -> Any:
    """A 32-bit integer mixer (int or int64 tensor in [0, 2³²) -> same): the multiplier stays below 2³¹, so int64
    products never overflow and CPU and CUDA give the same bits."""
    x = ((x >> 16) ^ x) * 0x45D9F3B & _MASK32
    x = ((x >> 16) ^ x) * 0x45D9F3B & _MASK32
    return (x >> 16) ^ x


class SyntheticLoader:
    """Generated tokens, free to make and deterministic per sequence, with structure a model learns within a few steps:
    each token is either a fresh draw from a Zipf-like distribution (p(k) ∝ 1 / (k + 1)) or, half the time, the
    previous token + 1. So a short test run shows the loss falling.

    Sequence `i` of the stream depends only on (seed, i), and the ranks split the stream as the TokenLoader splits an
    epoch: each micro-batch step takes the next `world_size × micro_batch_size` sequences, rank `r` the `r`-th block.
    So N ranks see exactly the batches one process sees with an N times larger micro-batch, and the position (sequences
    consumed, all ranks together) resumes on any number of ranks.

    Batches are made on the device itself, from a counter-based integer hash of (seed, sequence, position) and an
    inverse-CDF lookup: a few elementwise kernels queued behind the step, no host sampling, no host-to-device copy, no
    wait (a blocking copy would wait for the queued backward and count it as data wait). Integer arithmetic and a table
    built on the host make the tokens the same on every device."""

    def __init__(
        self,
        vocab_size: int,
        seq_len: int,
        micro_batch_size: int,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
        device: torch.device | str = "cpu",
        num_batches: int | None = None,
    ):
        """`num_batches`: stop after this many micro-batches on this rank (an eval pass); None runs forever."""
        self.vocab_size, self.seq_len, self.micro_batch_size = vocab_size, seq_len, micro_batch_size
        self.seed, self.rank, self.world_size = seed, rank, world_size
        self.device = torch.device(device)
        self.num_batches = num_batches
        self.epoch = 0
        self.windows_per_epoch: int | None = None  # unbounded: no epochs
        self.batches_per_epoch: int | None = None
        self.eos_id = 0
        self._consumed = 0
        """Sequences consumed by all ranks together."""
        weights = 1.0 / torch.arange(1, vocab_size + 1, dtype=torch.float64)
        self._cdf = (weights.cumsum(0) / weights.sum()).to(self.device)  # (vocab,) float64, built on the host
        self._seed_key = _hash32(_hash32(seed & _MASK32) ^ (seed >> 32) & _MASK32)
        positions = torch.arange(seq_len + 1, dtype=torch.int64, device=self.device)
        self._position_keys = _hash32(2 * positions), _hash32(2 * positions + 1)  # (T + 1,) each: draw, coin

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        return self

    def __next__(self) -> tuple[torch.Tensor, torch.Tensor]:
        step_sequences = self.world_size * self.micro_batch_size
        if self.num_batches is not None and self._consumed >= self.num_batches * step_sequences:
            raise StopIteration
        first = self._consumed + self.rank * self.micro_batch_size
        tokens = self._sequences(first)  # (B, T + 1)
        self._consumed += step_sequences
        return tokens[:, :-1], tokens[:, 1:]

    def _sequences(self, first: int) -> torch.Tensor:
        """Sequences first … first + B − 1, (B, T + 1) int64 on the device."""
        index = torch.arange(first, first + self.micro_batch_size, dtype=torch.int64, device=self.device)
        keys = _hash32(_hash32(index & _MASK32) ^ (index >> 32) ^ self._seed_key)[:, None]  # (B, 1)
        draw_keys, coin_keys = self._position_keys
        uniform = (_hash32(keys ^ draw_keys).double() + 0.5) / 2**32  # (B, T + 1) in (0, 1)
        fresh = torch.searchsorted(self._cdf, uniform).clamp_(max=self.vocab_size - 1)  # Zipf-like draws
        is_fresh = _hash32(keys ^ coin_keys) < 2**31
        is_fresh[:, 0] = True
        position = torch.arange(self.seq_len + 1, device=self.device).expand_as(fresh)
        # Each position continues from the last fresh draw at or before it: token = draw + distance to it.
        last_fresh = torch.where(is_fresh, position, 0).cummax(dim=1).values
        return (fresh.gather(1, last_fresh) + position - last_fresh) % self.vocab_size

    def state_dict(self) -> dict:
        return {"kind": SYNTHETIC, "sequences": self._consumed}

    def load_state_dict(self, state: dict) -> None:
        if state.get("kind") != SYNTHETIC or "sequences" not in state:
            raise UserError("the checkpoint's loader state is not from synthetic data; resume with the run's data.path")
        self._consumed = int(state["sequences"])

    def verify_read_shards(self) -> list[str]:
        """No shards: nothing to verify."""
        return []

    def close(self) -> None:
        pass

    def __enter__(self) -> SyntheticLoader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass(frozen=True)
class DatasetInfo:
    path: Path | None
    """The dataset folder; None for synthetic data."""
    vocab_size: int
    eos_id: int
    tokenizer: Path | None
    """tokenizer.json of the dataset, copied into the run folder for `dlx generate`."""
    val_tokens: int
    """Tokens in the validation split (0: no eval possible); with data.mix, in the smallest source's."""
    sources: tuple[Source, ...] = ()
    """The data.mix sources, in their canonical order; empty for one dataset."""


def inspect_dataset(config: RunConfig) -> DatasetInfo:
    """Check the data section against the model before anything is written; UserError names the key and the fix."""
    args = config.model.args
    if config.data.mix is not None:
        return inspect_mixture(config)
    if config.data.path == SYNTHETIC:
        return DatasetInfo(None, args.vocab_size, 0, None, 1 << 62)
    folder = Path(config.data.path)
    manifest: Manifest = read_manifest(folder)
    if not manifest.complete:
        raise UserError(
            f"data.path {folder} is still being prepared (manifest not complete); finish `dlx prepare` first"
        )
    if manifest.vocab_size > args.vocab_size:
        fix = (
            f"prepare the data with the tokenizer of model.init_from {config.model.init_from}"
            if config.model.init_from
            else f"set --model.vocab_size {manifest.vocab_size} (or more)"
        )
        raise UserError(
            f"data.path {folder} has vocab_size {manifest.vocab_size:,}, larger than model.vocab_size "
            f"{args.vocab_size:,}; {fix}"
        )
    val_tokens = manifest.split_tokens("val")
    if config.eval.every and val_tokens == 0:
        raise UserError(f"data.path {folder} has no validation split; set eval.every 0 or prepare with a val split")
    tokenizer = folder / TOKENIZER_FILE
    return DatasetInfo(
        folder, manifest.vocab_size, manifest.eos_id, tokenizer if tokenizer.is_file() else None, val_tokens
    )


def inspect_mixture(config: RunConfig) -> DatasetInfo:
    """data.mix: every source a complete prepared dataset, one tokenizer (by content), fitting the model."""
    sources = mix_sources(config.data.mix)
    manifests = open_sources(sources)  # UserError naming the source, or both sources whose tokenizers differ
    vocab_size = manifests[0].vocab_size
    if vocab_size > config.model.args.vocab_size:
        fix = (
            f"prepare the data with the tokenizer of model.init_from {config.model.init_from}"
            if config.model.init_from
            else f"set --model.vocab_size {vocab_size} (or more)"
        )
        raise UserError(
            f"data.mix sources have vocab_size {vocab_size:,}, larger than model.vocab_size "
            f"{config.model.args.vocab_size:,}; {fix}"
        )
    for source, manifest in zip(sources, manifests, strict=True):
        if config.eval.every and manifest.split_tokens("val") == 0:
            raise UserError(
                f"data.mix source {source.path} has no validation split; set eval.every 0 or prepare it with one"
            )
    val_tokens = min(m.split_tokens("val") for m in manifests)
    first = sources[0].path
    return DatasetInfo(
        first, vocab_size, manifests[0].eos_id, first / TOKENIZER_FILE, val_tokens, sources=tuple(sources)
    )


def build_train_loader(config: RunConfig, device: torch.device, rank: int = 0, world_size: int = 1):
    """The training batch source: loops over epochs, shuffled per epoch from the seed, each rank its own share."""
    data, seed = config.data, config.train.seed
    if data.mix is not None:
        from dlx.data.mixture import MixtureLoader

        sources = mix_sources(data.mix)
        return MixtureLoader(
            sources,
            data.seq_len,
            data.micro_batch_size,
            seed,
            rank,
            world_size,
            data.num_workers,
            data.prefetch,
            data.shuffle,
            device,
            data.verify,
        )
    if data.path == SYNTHETIC:
        return SyntheticLoader(
            config.model.args.vocab_size, data.seq_len, data.micro_batch_size, seed, rank, world_size, device
        )
    from dlx.data.loader import TokenLoader

    return TokenLoader(
        data.path,
        split="train",
        seq_len=data.seq_len,
        micro_batch_size=data.micro_batch_size,
        seed=seed,
        rank=rank,
        world_size=world_size,
        num_workers=data.num_workers,
        prefetch=data.prefetch,
        shuffle=data.shuffle,
        loop=True,
        device=device,
        verify=data.verify,
    )


def build_eval_loader(config: RunConfig, device: torch.device, rank: int = 0, world_size: int = 1):
    """One pass over the start of the validation split, in order, the same batches at every evaluation.
    Built in-process (no workers): an evaluation reads a few batches, not worth starting processes for."""
    data, args = config.data, config.model.args
    if data.path == SYNTHETIC:
        seed = config.train.seed + VAL_SEED_OFFSET
        return SyntheticLoader(
            args.vocab_size, data.seq_len, data.micro_batch_size, seed, rank, world_size, device, config.eval.batches
        )
    return _val_loader(data.path, config, device, rank, world_size)


def build_source_eval_loaders(config: RunConfig, device: torch.device, rank: int = 0, world_size: int = 1) -> dict:
    """data.mix: {source name: the validation loader of that source}, each as `build_eval_loader` builds one."""
    sources = mix_sources(config.data.mix or {})
    return {s.name: _val_loader(s.path, config, device, rank, world_size) for s in sources}


def _val_loader(path, config: RunConfig, device: torch.device, rank: int, world_size: int):
    from dlx.data.loader import TokenLoader

    data = config.data
    return TokenLoader(
        path,
        split="val",
        seq_len=data.seq_len,
        micro_batch_size=data.micro_batch_size,
        seed=0,
        rank=rank,
        world_size=world_size,
        num_workers=0,
        shuffle=False,
        loop=False,
        device=device,
        verify=data.verify,
    )
