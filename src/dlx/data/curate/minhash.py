"""MinHash signatures and their LSH bands, in numpy.

Each of bands × rows permutations is h ↦ (a·h + b) mod (2^61 − 1), truncated to 32 bits, over the 32-bit folded
shingle hashes (the universal hashing datatrove and datasketch use); a band is a 64-bit hash of its rows' minima.
Two documents of Jaccard similarity s share at least one band with probability 1 − (1 − s^rows)^bands. The
coefficients come from a fixed seed, so signatures from any worker, task or machine compare.
"""

from __future__ import annotations

import numpy as np

from dlx.data.curate.text import fold32

MERSENNE = np.uint64((1 << 61) - 1)
MAX32 = np.uint64(0xFFFFFFFF)
SEED = 1
MULT = np.uint64(0x100000001B3)


class MinHasher:
    """Signatures of bands × rows minima, reduced to one 64-bit hash per band."""

    def __init__(self, bands: int, rows: int, seed: int = SEED):
        rng = np.random.default_rng(seed)
        n = bands * rows
        self.bands, self.rows = bands, rows
        self.a = rng.integers(1, 1 << 31, size=n, dtype=np.uint64)  # (perms,)
        self.b = rng.integers(0, 1 << 31, size=n, dtype=np.uint64)  # (perms,)

    def signature(self, shingle_hashes: np.ndarray) -> np.ndarray:
        """(bands × rows,) uint32 minima; all-ones for a text without shingles."""
        if shingle_hashes.size == 0:
            return np.full(self.a.size, 0xFFFFFFFF, dtype=np.uint32)
        h = fold32(shingle_hashes)[:, None]  # (shingles, 1)
        perm = ((h * self.a[None, :] + self.b[None, :]) % MERSENNE) & MAX32  # (shingles, perms), no overflow: < 2^63
        return perm.min(axis=0).astype(np.uint32)

    def band_hashes(self, signature: np.ndarray) -> np.ndarray:
        """(bands,) uint64: one hash per band of `rows` minima."""
        rows = signature.astype(np.uint64).reshape(self.bands, self.rows)  # (bands, rows)
        h = np.arange(self.bands, dtype=np.uint64)  # (bands,): the band's number seeds its hash
        with np.errstate(over="ignore"):
            for k in range(self.rows):
                h = h * MULT + rows[:, k] + np.uint64(1)
        return h


def collision_probability(similarity: float, bands: int, rows: int) -> float:
    """Chance that two documents of this Jaccard similarity share a band."""
    return 1.0 - (1.0 - similarity**rows) ** bands


def threshold(bands: int, rows: int) -> float:
    """The similarity at which the banding's S-curve is steepest, about (1/bands)^(1/rows)."""
    return (1.0 / bands) ** (1.0 / rows)
