"""Prefix scores of the three confidence signals (§4.2) and the prefix selection of Eq. 3.

Given position scores ``q_1..q_gamma`` in [0, 1]:

- the local score ``B_k = min_{j<=k} q_j`` is shared by every signal;
- raw confidence:        ``C_k = (prod_{j<=k} q_j)^(1/k)`` (geometric mean);
- marginal survival:     ``C_k = min_{j<=k} a_j``  (running minimum, so ``B_k = C_k``);
- conditional survival:  ``C_k = prod_{j<=k} s_j``, computed in log space.

Eq. 4 orders them: ``prod q <= min q <= (prod q)^(1/k)``.
"""

from __future__ import annotations

import numpy as np

SIGNALS = ("raw", "marginal", "conditional")
#: the signals that come from a trained survival predictor
LEARNED = ("marginal", "conditional")


def local_scores(q: np.ndarray) -> np.ndarray:
    """``B_k = min_{j<=k} q_j`` for k = 1..gamma (along the last axis)."""
    return np.minimum.accumulate(np.asarray(q, dtype=np.float64), axis=-1)


def _log_cumsum(q: np.ndarray) -> np.ndarray:
    """``sum_{j<=k} log q_j`` along the last axis; a zero score gives ``-inf``, so every product
    (and geometric mean) through it is exactly 0."""
    with np.errstate(divide="ignore"):
        return np.cumsum(np.log(q), axis=-1)


def prefix_scores(signal: str, q: np.ndarray) -> np.ndarray:
    """``C_k`` for k = 1..gamma under ``signal`` (one of :data:`SIGNALS`), along the last axis."""
    q = np.asarray(q, dtype=np.float64)
    if signal == "raw":
        return np.exp(_log_cumsum(q) / np.arange(1, q.shape[-1] + 1))
    if signal == "marginal":
        return local_scores(q)
    if signal == "conditional":
        return np.exp(_log_cumsum(q))
    raise ValueError(f"unknown signal {signal!r}; expected one of {', '.join(SIGNALS)}")


def select_prefix(B: np.ndarray, C: np.ndarray, eta_b: float, eta_c: float) -> int:
    """Eq. 3: ``K̂ = max{k : B_k >= eta_b, C_k >= eta_c}``, with ``max ∅ = 0``."""
    ok = np.flatnonzero((B >= eta_b) & (C >= eta_c))
    return int(ok[-1]) + 1 if ok.size else 0


def feasible_prefix(signal: str, q: np.ndarray, eta_b: float, eta_c: float) -> int:
    """The longest prefix passing both score gates (before ``k_min``, staleness or guards)."""
    return select_prefix(local_scores(q), prefix_scores(signal, q), eta_b, eta_c)
