"""A long series cut down to the screen: consecutive records in equal-count buckets, each bucket drawn as the min and
max of its values (the envelope), so a spike in any record stays on the chart however many share its pixel column.
The x of a bucket is its first record's (step, tokens, seconds). Values are rounded to `DIGITS` significant digits for
the page: a chart a few hundred pixels tall shows no more.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

DIGITS = 5
"""Significant digits a value keeps on the page."""


def bucket_starts(n: int, points: int) -> np.ndarray:
    """The first index of each of at most `points` buckets over `n` records (every record its own when n ≤ points)."""
    if n <= points:
        return np.arange(n)
    return np.unique(np.linspace(0, n, points + 1)[:-1].astype(np.int64))


def envelope(values: Sequence[float], starts: np.ndarray) -> dict[str, list]:
    """{"v": values} when every bucket holds one value (or equal ones), else {"lo": mins, "hi": maxes}; NaN (a null in
    the file) is left out of a bucket, a bucket of NaN only is null."""
    array = np.asarray(values, dtype=np.float64)
    if len(starts) == 0:
        return {"v": []}
    if len(starts) == len(array):
        return {"v": rounded(array)}
    with np.errstate(invalid="ignore"):
        low, high = np.fmin.reduceat(array, starts), np.fmax.reduceat(array, starts)
    if np.array_equal(low, high, equal_nan=True):
        return {"v": rounded(low)}
    return {"lo": rounded(low), "hi": rounded(high)}


def first_of_bucket(values: Sequence[float], starts: np.ndarray) -> list:
    """Each bucket's first value (its x)."""
    return rounded(np.asarray(values, dtype=np.float64)[starts]) if len(starts) else []


def rounded(values: np.ndarray | Sequence[float]) -> list:
    """Floats at DIGITS significant digits (integers stay whole), NaN and infinities as null."""
    out: list = []
    for value in np.asarray(values, dtype=np.float64).tolist():
        if not math.isfinite(value):
            out.append(None)
        elif value == int(value) and abs(value) < 1e15:
            out.append(int(value))
        else:
            out.append(float(f"{value:.{DIGITS}g}"))
    return out
