"""Pieces of a prefix scheduler beyond the paper (numpy only): survival of whole prefixes, a
threshold calibrated by conformal risk control, and a cost-aware choice between verifying and
skipping.

- **Prefix survival.** A model that scores a block as per-position hazards ``h_j`` (the chance
  that position ``j`` is the first to disagree, given that the ones before agree) gives
  ``S_k = P(L >= k) = prod_{j <= k} (1 - h_j)``. It is monotone in ``k`` by construction.
  :func:`survival_nll` is the block-level likelihood of an observed ``L`` under it, the training
  objective of such a model.
- **A promised agreement** (:func:`calibrate`). Conformal risk control [Angelopoulos, Bates,
  Fisch, Lei and Schuster, *Conformal Risk Control*, ICLR 2024] picks the smallest threshold
  ``lambda`` with ``n/(n+1) R_n(lambda) + B/(n+1) <= alpha``. Here ``R_n`` is the mean over ``n``
  calibration prompts of a loss that is bounded by ``B = 1`` and does not increase with
  ``lambda``. Then, for a new prompt *exchangeable* with the calibration prompts,
  ``E[loss] <= alpha``.
  - The loss (:func:`prompt_loss`) counts the drafted tokens a skip commits beyond what Strict SDD
    accepts (``max(0, K - L)`` per block), divided by the tokens Strict SDD commits on that prompt
    (``sum(L + 1)``), capped at 1.
  - The guarantee breaks when the prompts are not exchangeable (another task or another drafter).
    It also breaks when the skips change the trajectory so that new blocks no longer look like the
    calibration blocks, because traces of Strict SDD are replayed offline. On-policy traces
    (shadow-verified skips) reduce that gap; they do not remove it.
- **Cost-aware choice** (:func:`choose`). Eq. 7-8 put the price of a verified round at
  ``c_D + c_V`` for an expected ``E[L] + 1`` tokens, and that of a skip of ``k`` tokens at
  ``c_D``. Given the block's survival, :func:`choose` skips the longest admissible prefix
  (``S_k >= lambda``) when ``k / c_D`` beats ``(E[L] + 1) / (c_D + c_V)``, and verifies otherwise.
  The block's own break-even length ``K*`` replaces a fixed ``k_min``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

#: the upper bound of :func:`prompt_loss`
LOSS_BOUND = 1.0


def survival_from_hazards(h: np.ndarray) -> np.ndarray:
    """``S[..., k-1] = P(L >= k) = prod_{j <= k} (1 - h_j)`` from hazards ``h`` [..., gamma]."""
    h = np.clip(np.asarray(h, np.float64), 0.0, 1.0)
    return np.cumprod(1.0 - h, axis=-1)


def survival_nll(h: np.ndarray, L: np.ndarray, eps: float = 1e-7) -> np.ndarray:
    """Negative log-likelihood of each block's accepted length ``L`` [B] under hazards ``h``
    [B, gamma]: the first ``L`` positions survive, then position ``L + 1`` fails (none when
    ``L == gamma``)."""
    h = np.clip(np.asarray(h, np.float64), eps, 1.0 - eps)
    L = np.asarray(L, np.int64)
    B, g = h.shape
    j = np.arange(g)[None, :]
    alive = (j < L[:, None]) * np.log1p(-h)
    fail = np.where(L < g, np.log(h[np.arange(B), np.minimum(L, g - 1)]), 0.0)
    return -(alive.sum(1) + fail)


def skip_lengths(S: np.ndarray, lam: float, k_min: int = 1) -> np.ndarray:
    """The longest ``k`` with ``S_k >= lam`` per block (0 when none, or when shorter than
    ``k_min``). ``S`` is non-increasing in ``k``, so this is how many leading entries pass."""
    S = np.asarray(S, np.float64)
    K = (S >= lam).sum(axis=-1)
    return np.where(K >= k_min, K, 0)


def prompt_loss(S: np.ndarray, L: np.ndarray, lam: float, k_min: int = 1) -> float:
    """One prompt's loss at threshold ``lam``, replayed on its Strict SDD blocks (survival ``S``
    [B, gamma], accepted lengths ``L`` [B]): drafted tokens committed beyond ``L``, over the tokens
    Strict SDD commits, capped at :data:`LOSS_BOUND`. Non-increasing in ``lam``."""
    L = np.asarray(L, np.int64)
    if L.size == 0:
        return 0.0
    K = skip_lengths(S, lam, k_min)
    wrong = np.maximum(K - L, 0).sum()
    return float(min(LOSS_BOUND, wrong / (L + 1).sum()))


@dataclass(frozen=True)
class Calibration:
    """``lam``: the threshold (``inf``: no threshold meets ``alpha``; never skip); ``alpha``;
    ``n``: calibration prompts; ``risk``: their mean loss at ``lam``; ``bound``: the CRC left-hand
    side at ``lam``."""

    lam: float
    alpha: float
    n: int
    risk: float
    bound: float


def risk_curve(prompts: Sequence[tuple[np.ndarray, np.ndarray]], grid: Sequence[float], k_min: int = 1) -> np.ndarray:
    """Mean :func:`prompt_loss` over ``prompts`` (pairs of survival [B, gamma] and L [B]) at each
    threshold of ``grid``: the empirical risk ``R_n(lambda)`` of conformal risk control."""
    return np.array([np.mean([prompt_loss(S, L, lam, k_min) for S, L in prompts]) for lam in grid], np.float64)


def crc_threshold(grid: Sequence[float], risk: Sequence[float], n: int, alpha: float) -> Calibration:
    """The smallest ``lam`` of the ascending ``grid`` with ``n/(n+1) risk(lam) + B/(n+1) <= alpha``
    (``inf`` when none: never skip). ``risk``: :func:`risk_curve` of ``n`` calibration prompts."""
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    if n < 1:
        raise ValueError("no calibration prompts")
    grid, risk = np.asarray(grid, np.float64), np.asarray(risk, np.float64)
    if grid.shape != risk.shape or np.any(np.diff(grid) <= 0):
        raise ValueError("the grid must ascend and match the risk curve")
    bound = n / (n + 1) * risk + LOSS_BOUND / (n + 1)
    ok = np.nonzero(bound <= alpha)[0]
    if ok.size == 0:
        return Calibration(float("inf"), alpha, n, 0.0, LOSS_BOUND / (n + 1))
    i = int(ok[0])  # the loss does not increase with lam, so the smallest passing value keeps the guarantee
    return Calibration(float(grid[i]), alpha, n, float(risk[i]), float(bound[i]))


#: the default threshold grid of :func:`calibrate`
GRID = np.linspace(0.0, 1.0, 201)


def calibrate(prompts: Sequence[tuple[np.ndarray, np.ndarray]], alpha: float, grid: Sequence[float] | None = None,
              k_min: int = 1) -> Calibration:
    """Conformal risk control: the smallest ``lam`` of ``grid`` with
    ``n/(n+1) * mean_i loss_i(lam) + B/(n+1) <= alpha`` over the calibration ``prompts`` (each a
    pair (survival [B, gamma], L [B])). Because the loss does not increase with ``lam``, the
    smallest passing value keeps the guarantee."""
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    if len(prompts) == 0:
        raise ValueError("no calibration prompts")
    grid = np.unique(np.clip(np.asarray(GRID if grid is None else grid, np.float64), 0, 1))
    return crc_threshold(grid, risk_curve(prompts, grid, k_min), len(prompts), alpha)


# ----------------------------------------------------------------------------- online calibration
#
# Calibrated on the policy's own online decodes: each calibration prompt is decoded at every
# threshold of a grid, and its loss at each is the realised disagreement of that decode (drafted
# tokens committed beyond the shadow verifier's L, over the prompt's generated tokens; in [0, 1]).
# Online, that loss need not fall as the threshold rises (a skip changes what follows). Two ways
# keep a guarantee:
# - conformal risk control on the loss's upper envelope from above (:func:`online_envelope`): for
#   every threshold, the largest loss the prompt had at that threshold or any more cautious one of
#   the grid. It does not increase with lambda and bounds the loss at lambda, so CRC on it bounds
#   the expected loss of a new exchangeable prompt, in expectation over calibration and test.
# - Learn then Test [Angelopoulos, Bates, Candes, Jordan and Lei, 2021] with fixed-sequence testing
#   from the most cautious threshold down and the Hoeffding-Bentkus p-value (:func:`hb_pvalue`):
#   with probability at least 1 - delta over the calibration prompts, the chosen threshold's risk
#   is at most alpha. No monotonicity is needed.


def online_envelope(grid: Sequence[float], losses: np.ndarray) -> np.ndarray:
    """``E[i, p] = max_{j : grid[j] >= grid[i]} losses[j, p]`` for losses [thresholds, prompts]: the
    smallest bound of each prompt's loss that does not increase with the threshold."""
    grid, losses = np.asarray(grid, np.float64), np.asarray(losses, np.float64)
    if losses.ndim != 2 or losses.shape[0] != grid.shape[0]:
        raise ValueError("losses must be [thresholds, prompts], one row per grid value")
    order = np.argsort(-grid, kind="stable")
    env = np.maximum.accumulate(losses[order], axis=0)
    out = np.empty_like(env)
    out[order] = env
    return out


def crc_online(grid: Sequence[float], losses: np.ndarray, alpha: float) -> Calibration:
    """Conformal risk control on :func:`online_envelope` of online losses [thresholds, prompts]."""
    grid = np.asarray(grid, np.float64)
    order = np.argsort(grid)
    risk = online_envelope(grid, losses).mean(axis=1)
    return crc_threshold(grid[order], risk[order], np.asarray(losses).shape[1], alpha)


def hb_pvalue(risk: float, n: int, alpha: float) -> float:
    """The Hoeffding-Bentkus p-value of ``H0: E[loss] > alpha`` from the mean ``risk`` of ``n``
    losses in [0, 1] (Bates, Angelopoulos, Lei, Malik and Jordan, 2021, Prop. 3 and 5)."""
    from scipy.stats import binom

    if not 0.0 < alpha < 1.0 or n < 1:
        raise ValueError("alpha must lie in (0, 1) and n >= 1")
    r = min(max(float(risk), 0.0), alpha)
    h1 = (r * np.log(r / alpha) if r > 0 else 0.0) + ((1 - r) * np.log((1 - r) / (1 - alpha)) if r < 1 else 0.0)
    hoeffding = float(np.exp(-n * h1))
    bentkus = float(np.e * binom.cdf(np.ceil(n * float(risk)), n, alpha))
    return min(hoeffding, bentkus, 1.0)


def ltt_fixed_sequence(grid: Sequence[float], losses: np.ndarray, alpha: float, delta: float) -> tuple[float, list[float]]:
    """Learn then Test: test ``E[loss(lambda)] > alpha`` at each threshold from the most cautious
    down, each at level ``delta``, and stop at the first not rejected. Returns the last threshold
    rejected (``inf``: none, never skip) and the p-values in ``grid``'s order (None where not
    reached)."""
    if not 0.0 < delta < 1.0:
        raise ValueError(f"delta must lie in (0, 1), got {delta}")
    grid, losses = np.asarray(grid, np.float64), np.asarray(losses, np.float64)
    n = losses.shape[1]
    p = np.full(grid.shape, np.nan)
    lam = float("inf")
    for i in np.argsort(-grid, kind="stable"):
        p[i] = hb_pvalue(float(losses[i].mean()), n, alpha)
        if p[i] > delta:
            break
        lam = float(grid[i])
    return lam, [None if np.isnan(x) else float(x) for x in p]


#: why :func:`choose` verifies or skips: a skip, no prefix meeting the threshold, or an admissible
#: skip no longer than the block's break-even length
SKIP, NO_PREFIX, BREAK_EVEN = "skip", "no_prefix", "break_even"


@dataclass(frozen=True)
class Choice:
    K: int  # tokens to skip with (0: verify)
    k_star: float  # the block's break-even skip length (Eq. 8 with A = E[L] + 1)
    reason: str  # SKIP, NO_PREFIX or BREAK_EVEN


def choose(S: np.ndarray, lam: float, c_D: float, c_V: float, k_min: int = 1) -> Choice:
    """Verify or skip one block (survival ``S`` [gamma]) by expected tokens per second: skip the
    longest prefix with ``S_k >= lam`` when ``k / c_D > (E[L] + 1) / (c_D + c_V)``, that is when
    ``k > K* = (E[L] + 1) c_D / (c_D + c_V)``; verify otherwise. ``E[L] = sum_k S_k``."""
    if c_D <= 0 or c_V <= 0:
        raise ValueError("c_D and c_V must be positive")
    S = np.asarray(S, np.float64)
    k_star = (float(S.sum()) + 1.0) * c_D / (c_D + c_V)
    k = int(skip_lengths(S[None, :], lam, k_min)[0])
    if k == 0:
        return Choice(0, k_star, NO_PREFIX)
    if k <= k_star:
        return Choice(0, k_star, BREAK_EVEN)
    return Choice(k, k_star, SKIP)
