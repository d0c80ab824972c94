"""Global deduplication on signatures, in corpus order (never on text): the first document of each exact hash is
kept; with `near`, documents that share a MinHash band with another are joined into clusters (connected components)
and each cluster keeps its first document. The signatures arrive in (unit, ordinal) order, so the result does not
depend on how many workers, tasks or machines produced them."""

from __future__ import annotations

import numpy as np

KEPT, EXACT, NEAR = 0, 1, 2
REASONS = {EXACT: "exact_duplicate", NEAR: "near_duplicate"}


def find_duplicates(sigs: np.ndarray, near: bool) -> tuple[np.ndarray, dict[str, int], np.ndarray]:
    """(reason per document: KEPT, EXACT or NEAR; the near-duplicate cluster size histogram; per document, the
    position of the kept document it duplicates, its own for a kept one)."""
    reason = np.full(sigs.size, EXACT, dtype=np.uint8)  # (docs,)
    _, first, inverse = np.unique(sigs["exact"], return_index=True, return_inverse=True)  # first of each hash
    reason[first] = KEPT
    original = first[inverse.reshape(-1)]  # (docs,) the first copy of each document's exact hash
    if not near or sigs.size == 0:
        return reason, {}, original
    alive = np.flatnonzero(reason == KEPT)  # (alive,) corpus positions
    roots = components(sigs["bands"][alive])  # (alive,) the first member of each one's cluster
    reason[alive[roots != np.arange(alive.size)]] = NEAR
    kept_of = np.arange(sigs.size)
    kept_of[alive] = alive[roots]  # an exact copy's first copy may itself be a near duplicate: follow it
    sizes = np.bincount(roots, minlength=alive.size)
    return reason, size_histogram(sizes[sizes > 1]), kept_of[original]


def components(bands: np.ndarray) -> np.ndarray:
    """For each document (rows of `bands`, (docs, n_bands)), the smallest index of its connected component, where
    two documents are joined when they share a band value in the same band."""
    parent = np.arange(bands.shape[0])

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for band in range(bands.shape[1]):
        keys = bands[:, band]
        order = np.argsort(keys, kind="stable")  # equal keys stay in corpus order: the group's first is its smallest
        sorted_keys = keys[order]
        same = np.flatnonzero(sorted_keys[1:] == sorted_keys[:-1]) + 1  # positions that repeat the key before them
        if same.size == 0:
            continue
        starts = np.flatnonzero(np.r_[True, sorted_keys[1:] != sorted_keys[:-1]])
        group_first = order[starts[np.searchsorted(starts, same, side="right") - 1]]
        for a, b in zip(group_first.tolist(), order[same].tolist(), strict=True):
            ra, rb = find(a), find(b)
            if ra != rb:
                parent[max(ra, rb)] = min(ra, rb)
    return np.array([find(x) for x in range(parent.size)], dtype=np.int64)


def size_histogram(sizes: np.ndarray) -> dict[str, int]:
    """Clusters by size in power-of-two bins: `2`, `3-4`, `5-8`, ..."""
    hist: dict[str, int] = {}
    for size in sorted(sizes.tolist()):
        low = 2 if size == 2 else (1 << (int(size - 1).bit_length() - 1)) + 1
        high = 2 if size == 2 else 1 << int(size - 1).bit_length()
        label = str(low) if low == high else f"{low}-{high}"
        hist[label] = hist.get(label, 0) + 1
    return hist
