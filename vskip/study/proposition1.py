"""Proposition 1 (A.1): a Monte Carlo of the proof's own construction. Two score processes with
the same positionwise joint distribution with the survival label (a shared latent, and independent
draws per position) have very different prefix frequencies: Pr(L >= K) rho against
Pr(L >= K) rho^K. It checks the construction and the closed forms, not a pair's scores."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..engine.metrics import auroc

# ----------------------------------------------------------------------------- Proposition 1 (A.1)


@dataclass(frozen=True)
class Prop1Result:
    rho: float
    q_lo: float
    q_hi: float
    tau: float
    n: int
    K: np.ndarray  # [m]
    p_L: np.ndarray  # Pr(L >= K)
    shared_closed: np.ndarray  # Pr(L >= K) rho
    shared_sim: np.ndarray
    indep_closed: np.ndarray  # Pr(L >= K) rho^K
    indep_sim: np.ndarray
    z_shared: np.ndarray
    z_indep: np.ndarray
    positionwise_max_diff: float  # largest gap between the two processes' joint cell frequencies
    positionwise_max_z: float
    auroc_shared: np.ndarray  # [gamma] positionwise AUROC of each process
    auroc_indep: np.ndarray


def proposition1(L_values: np.ndarray, gamma: int, rho: float = 0.7, q_lo: float = 0.5, q_hi: float = 0.95,
                 tau: float = 0.9, n: int = 200_000, seed: int = 0) -> Prop1Result:
    """Simulate A.1's construction: ``q_j = q_lo + (q_hi - q_lo) Y_j Z`` with one shared
    ``Z ~ Bernoulli(rho)`` and ``q'_j`` with independent ``Z_j``, ``Y_j = 1{L >= j}``, L drawn
    from the empirical distribution of ``L_values``. Returns the simulated and closed-form
    frequencies of ``min_{j<=K} q_j >= tau`` for K = 1..gamma, with z-scores."""
    if not (0 < q_lo < tau < q_hi < 1 and 0 < rho < 1):
        raise ValueError("Proposition 1 needs 0 < q_lo < tau < q_hi < 1 and 0 < rho < 1")
    L_values = np.asarray(L_values, np.int64)
    if L_values.size == 0:
        raise ValueError("Proposition 1 needs at least one value of L")
    rng = np.random.default_rng(seed)
    L = rng.choice(L_values, size=n)
    j = np.arange(1, gamma + 1)
    Y = L[:, None] >= j[None, :]
    Z = rng.random(n) < rho
    Zj = rng.random((n, gamma)) < rho
    q = np.where(Y & Z[:, None], q_hi, q_lo)
    q2 = np.where(Y & Zj, q_hi, q_lo)
    hi, hi2 = q >= tau, q2 >= tau
    run, run2 = np.logical_and.accumulate(hi, axis=1), np.logical_and.accumulate(hi2, axis=1)
    p_L = (L_values[:, None] >= j[None, :]).mean(0)
    sc, ic = p_L * rho, p_L * rho ** j
    ss, si = run.mean(0), run2.mean(0)
    se = lambda p: np.sqrt(np.maximum(p * (1 - p), 1e-12) / n)  # noqa: E731
    # Positionwise joint distribution of (q_j >= tau, Y_j): four cells, compared process to process.
    gaps, zs = [], []
    for a in (False, True):
        for b in (False, True):
            f1 = ((hi == a) & (Y == b)).mean(0)
            f2 = ((hi2 == a) & (Y == b)).mean(0)
            pooled = (f1 + f2) / 2
            gaps.append(np.abs(f1 - f2))
            zs.append(np.abs(f1 - f2) / np.sqrt(np.maximum(2 * pooled * (1 - pooled), 1e-12) / n))
    a1 = np.array([auroc(q[:, i], Y[:, i]) for i in range(gamma)])
    a2 = np.array([auroc(q2[:, i], Y[:, i]) for i in range(gamma)])
    return Prop1Result(rho, q_lo, q_hi, tau, n, j, p_L, sc, ss, ic, si, (ss - sc) / se(sc), (si - ic) / se(ic),
                       float(np.max(gaps)), float(np.max(zs)), a1, a2)
