"""Interval helpers shared by the reports, the comparisons and the calibration (numpy only)."""

from __future__ import annotations

from typing import Iterator

import numpy as np


def percentile_interval(values: np.ndarray, level: float = 0.95) -> tuple[float, float] | None:
    """The central ``level`` interval of bootstrap ``values`` (non-finite ones dropped; None when
    none is left)."""
    values = np.asarray(values, np.float64)
    values = values[np.isfinite(values)]
    if not values.size:
        return None
    a = (1.0 - level) / 2.0
    lo, hi = np.quantile(values, [a, 1.0 - a])
    return float(lo), float(hi)


def resample_indices(n: int, n_boot: int, seed: int, max_elements: int | None = None) -> Iterator[np.ndarray]:
    """The indices of ``n_boot`` bootstrap resamples (with replacement) of ``n`` prompts, as
    [k, n] blocks in order: one block, or blocks of at most ``max_elements // n`` resamples to
    bound memory. Every bootstrap over prompts draws here; the block sizes are part of the random
    stream, so a caller keeps the ``max_elements`` it was measured with. No prompts give empty
    resamples (their statistics are NaN, and the intervals then None), as before."""
    rng = np.random.default_rng(seed)
    step = n_boot if max_elements is None or n < 1 else max(1, min(n_boot, max_elements // n))
    for start in range(0, n_boot, step):
        yield rng.integers(0, n, size=(min(n_boot, start + step) - start, n))


def bootstrap_means(d: np.ndarray, n_boot: int, seed: int) -> np.ndarray:
    """Means of ``n_boot`` resamples (with replacement, over the first axis) of per-prompt values
    ``d``, drawn in one block so that a seed gives the same resamples wherever it is used."""
    d = np.asarray(d, np.float64)
    return d[next(resample_indices(len(d), n_boot, seed))].mean(1)
