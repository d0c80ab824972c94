"""`SyntheticLoader`: generated tokens with the face of a prepared dataset's loader (`dlx.data.source.BatchSource`),
for benchmarks and tests (`data.path synthetic`)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from dlx.data import SYNTHETIC
from dlx.data.source import DamagedState, LoaderSettings
from dlx.errors import UserError

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

    epoch = 0
    windows_per_epoch: int | None = None  # unbounded: no epochs
    batches_per_epoch: int | None = None
    eos_id = 0
    bos_id: int | None = None

    def __init__(self, vocab_size: int, settings: LoaderSettings = LoaderSettings(), num_batches: int | None = None):
        """`num_batches`: stop after this many micro-batches on this rank (an eval pass); None runs forever. Of
        `settings`, seq_len, micro_batch_size, seed, rank, world_size and device apply."""
        self.vocab_size, self.seq_len, self.micro_batch_size = vocab_size, settings.seq_len, settings.micro_batch_size
        seed, self.rank, self.world_size = settings.seed, settings.rank, settings.world_size
        self.seed, self.device, self.num_batches = seed, torch.device(settings.device), num_batches
        self._consumed = 0
        """Sequences consumed by all ranks together."""
        weights = 1.0 / torch.arange(1, vocab_size + 1, dtype=torch.float64)
        self._cdf = (weights.cumsum(0) / weights.sum()).to(self.device)  # (vocab,) float64, built on the host
        self._seed_key = _hash32(_hash32(seed & _MASK32) ^ (seed >> 32) & _MASK32)
        positions = torch.arange(self.seq_len + 1, dtype=torch.int64, device=self.device)
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

    def load_state_dict(self, state: dict, steps_done: int | None = None) -> None:
        if state.get("kind") != SYNTHETIC or "sequences" not in state:
            raise UserError("the checkpoint's loader state is not from synthetic data; resume with the run's data.path")
        if type(state["sequences"]) is not int or state["sequences"] < 0:
            raise DamagedState(f"the synthetic loader state is damaged: sequences={state['sequences']!r}")
        self._consumed = state["sequences"]

    def warm(self) -> None:
        """Nothing to start: batches are made on demand."""

    @property
    def worker_pids(self) -> list[int]:
        return []  # made in the calling thread

    def source_tokens(self) -> dict[str, int]:
        return {}

    def new_source_epochs(self) -> list[tuple[str, int]]:
        return []

    def verify_read_shards(self) -> list[str]:
        """No shards: nothing to verify."""
        return []

    def close(self, at_once: bool = False) -> None:
        pass

    def __enter__(self) -> SyntheticLoader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
