"""Interval helpers shared by the reports, the comparisons and the calibration (numpy only)."""

from __future__ import annotations

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


def bootstrap_means(d: np.ndarray, n_boot: int, seed: int) -> np.ndarray:
    """Means of ``n_boot`` resamples (with replacement, over the first axis) of per-prompt values
    ``d``, drawn in one call so that a seed gives the same resamples wherever it is used."""
    d = np.asarray(d, np.float64)
    return d[np.random.default_rng(seed).integers(0, len(d), size=(n_boot, len(d)))].mean(1)
