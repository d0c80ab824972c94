"""Batch sources for the trainer: the prepared dataset through `TokenLoader`, or synthetic tokens with the same face.

Both iterate `(inputs, targets)` int64 (micro_batch_size, seq_len) and have `epoch`, `windows_per_epoch`,
`batches_per_epoch`, `vocab_size`, `eos_id`, `state_dict()` / `load_state_dict()` and `close()`.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from dlx import device as dev
from dlx.data.shards import TOKENIZER_FILE, Manifest, read_manifest
from dlx.errors import UserError
from dlx.train.config import SYNTHETIC, RunConfig

VAL_SEED_OFFSET = 1_000_003
"""Synthetic validation batches come from another stream than the training ones."""


class SyntheticLoader:
    """Generated tokens, free to make and deterministic per sequence, with structure a model learns within a few steps:
    each token is either a fresh draw from a Zipf-like distribution (p(k) ∝ 1 / (k + 1)) or, half the time, the
    previous token + 1. So a short test run shows the loss falling.

    Sequence `i` of the stream depends only on (seed, i), and the ranks split the stream as the TokenLoader splits an
    epoch: each micro-batch step takes the next `world_size × micro_batch_size` sequences, rank `r` the `r`-th block.
    So N ranks see exactly the batches one process sees with an N times larger micro-batch, and the position (sequences
    consumed, all ranks together) resumes on any number of ranks."""

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
        self._weights = 1.0 / torch.arange(1, vocab_size + 1, dtype=torch.float)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        return self

    def __next__(self) -> tuple[torch.Tensor, torch.Tensor]:
        step_sequences = self.world_size * self.micro_batch_size
        if self.num_batches is not None and self._consumed >= self.num_batches * step_sequences:
            raise StopIteration
        first = self._consumed + self.rank * self.micro_batch_size
        tokens = torch.stack([self._sequence(first + i) for i in range(self.micro_batch_size)])  # (B, T + 1)
        self._consumed += step_sequences
        return dev.to_device(tokens[:, :-1], self.device), dev.to_device(tokens[:, 1:], self.device)

    def _sequence(self, index: int) -> torch.Tensor:
        generator = torch.Generator().manual_seed(self.seed * 1_000_000_007 + index)
        length = self.seq_len + 1
        fresh = torch.multinomial(self._weights, length, replacement=True, generator=generator)
        is_fresh = torch.rand(length, generator=generator) < 0.5
        is_fresh[0] = True
        position = torch.arange(length)
        # Each position continues from the last fresh draw at or before it: token = draw + distance to it.
        last_fresh = torch.where(is_fresh, position, 0).cummax(dim=0).values
        return (fresh[last_fresh] + position - last_fresh) % self.vocab_size  # (T + 1,)

    def state_dict(self) -> dict:
        return {"kind": SYNTHETIC, "sequences": self._consumed}

    def load_state_dict(self, state: dict) -> None:
        if state.get("kind") != SYNTHETIC or "sequences" not in state:
            raise UserError("the checkpoint's loader state is not from synthetic data; resume with the run's data.path")
        self._consumed = int(state["sequences"])

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
    """Tokens in the validation split (0: no eval possible)."""


def inspect_dataset(config: RunConfig) -> DatasetInfo:
    """Check the data section against the model before anything is written; UserError names the key and the fix."""
    args = config.model.args
    if config.data.path == SYNTHETIC:
        return DatasetInfo(None, args.vocab_size, 0, None, 1 << 62)
    folder = Path(config.data.path)
    manifest: Manifest = read_manifest(folder)
    if not manifest.complete:
        raise UserError(
            f"data.path {folder} is still being prepared (manifest not complete); finish `dlx prepare` first"
        )
    if manifest.vocab_size > args.vocab_size:
        raise UserError(
            f"data.path {folder} has vocab_size {manifest.vocab_size:,}, larger than model.vocab_size "
            f"{args.vocab_size:,}; set --model.vocab_size {manifest.vocab_size} (or more)"
        )
    val_tokens = manifest.split_tokens("val")
    if config.eval.every and val_tokens == 0:
        raise UserError(f"data.path {folder} has no validation split; set eval.every 0 or prepare with a val split")
    tokenizer = folder / TOKENIZER_FILE
    return DatasetInfo(
        folder, manifest.vocab_size, manifest.eos_id, tokenizer if tokenizer.is_file() else None, val_tokens
    )


def build_train_loader(config: RunConfig, device: torch.device, rank: int = 0, world_size: int = 1):
    """The training batch source: loops over epochs, shuffled per epoch from the seed, each rank its own share."""
    data, seed = config.data, config.train.seed
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
    from dlx.data.loader import TokenLoader

    return TokenLoader(
        data.path,
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
