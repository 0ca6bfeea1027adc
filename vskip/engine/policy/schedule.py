"""The skip policy of §4.1 (Eq. 3 with ``k_min``, ``s_max`` and the guards) and the periodic
baseline of A.4, as one pure decision function.

Every method of the paper is a :class:`PolicyConfig` of the same decode loop:

========== ==================================================================
``ar``          the verifier alone, plain greedy (no drafter)
``strict``      Strict SDD: verify every block, accept the argmax-matching prefix
``lenience``    verify every block, Eq. 9 acceptance with ``lenience`` = l
``topk``        verify every block, top-k acceptance (A.6)
``periodic``    attempt a ``period_k``-token skip every ``period`` rounds (A.4)
``raw``         skip on raw drafter confidence (geometric-mean prefix score)
``marginal``    skip on learned marginal survival (running minimum)
``conditional`` skip on learned conditional survival (log-space product)
========== ==================================================================
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ...defaults import PAPER_GATES, POLICIES, POLICY_PARAMETERS  # noqa: E402 - importable without numpy
from .acceptance import MAX_TOP_K
from .guards import GuardConfig, GuardContext, check_guards, invalid_scores
from .signals import LEARNED, SIGNALS, feasible_prefix

#: where the prefix policy's survival P(L >= k) comes from: the running product of the drafter's
#: confidences, or a trained prefix survival model (:mod:`vskip.study.prefix.model`)
PREFIX_SURVIVAL = ("confidence", "model")

#: Paper defaults (§5.1, A.3, A.6): thresholds per signal when none are given.
DEFAULT_GATES = {"raw": PAPER_GATES, "marginal": (0.90, 0.90), "conditional": (0.90, 0.90)}


_P = POLICY_PARAMETERS


@dataclass(frozen=True)
class PolicyConfig:
    """One method of the paper and its parameters. Names follow the paper."""

    name: str = "strict"
    # the parameters, in the order and with the defaults of defaults.POLICY_PARAMETERS (one
    # declaration: their methods, flags and help live there; a test holds the two together)
    eta_b: float = _P["eta_b"].default
    eta_c: float = _P["eta_c"].default
    k_min: int = _P["k_min"].default
    period: int = _P["period"].default
    period_k: int = _P["period_k"].default
    lam: float = _P["lam"].default
    cost_ratio: float | None = _P["cost_ratio"].default
    s_max: int = _P["s_max"].default
    survival: str = _P["survival"].default
    alpha: float | None = _P["alpha"].default
    lenience: float = _P["lenience"].default
    top_k: int = _P["top_k"].default
    guards: GuardConfig = field(default_factory=GuardConfig)

    def __post_init__(self):
        if self.name not in POLICIES:
            raise ValueError(f"unknown policy {self.name!r}; expected one of {', '.join(POLICIES)}")
        for key in ("eta_b", "eta_c"):
            v = getattr(self, key)
            if not (isinstance(v, (int, float)) and 0.0 <= v <= 1.0):
                raise ValueError(f"{key} must lie in [0, 1], got {v}")
        if not 0.0 < self.lenience <= 1.0:
            raise ValueError(f"lenience must lie in (0, 1], got {self.lenience}")
        if not 1 <= self.top_k <= MAX_TOP_K:
            raise ValueError(f"top-k must lie in 1..{MAX_TOP_K}, got {self.top_k}")
        if self.k_min < 0:
            raise ValueError(f"k_min must be >= 0, got {self.k_min}")
        if self.s_max < 1:
            raise ValueError(f"s_max must be >= 1, got {self.s_max}")
        if self.period < 1 or self.period_k < 1:
            raise ValueError("the periodic baseline needs period >= 1 and period_k >= 1")
        if not (0.0 < self.lam <= 1.0 or self.lam == math.inf):
            raise ValueError(f"lam must lie in (0, 1] (or be inf: never skip), got {self.lam}")
        if self.survival not in PREFIX_SURVIVAL:
            raise ValueError(f"survival must be one of {', '.join(PREFIX_SURVIVAL)}, got {self.survival!r}")
        if self.survival == "model" and self.name != "prefix":
            raise ValueError("a prefix survival model serves --policy prefix only")
        if self.alpha is not None:
            if self.survival != "model":
                raise ValueError("--alpha needs a calibrated prefix survival model (--policy prefix --predictor DIR)")
            if not 0.0 < self.alpha < 1.0:
                raise ValueError(f"alpha must lie in (0, 1), got {self.alpha}")
        if self.cost_ratio is not None and not self.cost_ratio > 0:
            raise ValueError(f"cost-ratio must be > 0, got {self.cost_ratio}")

    @classmethod
    def make(
        cls,
        name: str,
        eta_b: float | None = None,
        eta_c: float | None = None,
        eta_m: float | None = None,
        epsilon: float | None = None,
        **kw,
    ) -> "PolicyConfig":
        """Resolve the paper's parameterisations: ``eta_m`` sets both gates of marginal survival,
        ``epsilon`` sets ``eta_c = 1 - epsilon`` for conditional survival."""
        b, c = DEFAULT_GATES.get(name, PAPER_GATES)
        if eta_m is not None:
            b = c = eta_m
        if epsilon is not None:
            if not 0.0 <= epsilon <= 1.0:
                raise ValueError(f"epsilon must lie in [0, 1], got {epsilon}")
            c = 1.0 - epsilon
        b = b if eta_b is None else eta_b
        c = c if eta_c is None else eta_c
        return cls(name=name, eta_b=b, eta_c=c, **kw)

    @property
    def signal(self) -> str | None:
        """The confidence signal that schedules skips, or None for methods without one."""
        return self.name if self.name in SIGNALS else None

    @property
    def may_skip(self) -> bool:
        return self.name in SIGNALS or self.name in ("periodic", "prefix")

    @property
    def uses_drafter(self) -> bool:
        return self.name != "ar"

    @property
    def learned(self) -> bool:
        """Its skip signal comes from a trained survival predictor."""
        return self.predictor_kind is not None

    @property
    def predictor_kind(self) -> str | None:
        """The kind of trained predictor it reads (``vskip train-predictor --kind``), or None."""
        if self.name in LEARNED:
            return self.name
        return "prefix" if self.name == "prefix" and self.survival == "model" else None

    @property
    def lossy_acceptance(self) -> bool:
        """A verified round may accept drafted tokens the verifier would not (lenience, top-k)."""
        return self.name in ("lenience", "topk")

    def summary(self) -> dict:
        """The parameters that matter for this method (for file names and reports)."""
        d = {"policy": self.name} | {k: getattr(self, k) for k in policy_params(self.name)}
        if d.get("alpha", 0) is None:
            del d["alpha"]
        return d


def policy_params(name: str) -> tuple[str, ...]:
    """The parameters that matter for method ``name``, as :meth:`PolicyConfig.summary` keys them
    (the fields of ``defaults.POLICY_PARAMETERS`` that name the method, in their order)."""
    return tuple(k for k, p in POLICY_PARAMETERS.items() if p.field and name in p.methods)


@dataclass(frozen=True)
class Decision:
    """``K``: committed skip length (0 means a strict round); ``K_hat``: the candidate length;
    ``reason``: why (``skip``, ``verify``, ``stale``, ``no_prefix``, ``k_min``, ``not_scheduled``
    or the refusing guard)."""

    K: int
    K_hat: int
    reason: str


def decide(
    cfg: PolicyConfig,
    D: int,
    round_index: int,
    tokens: np.ndarray,
    q: np.ndarray | None,
    ctx: GuardContext,
) -> Decision:
    """Decide one round (§4.1). ``D`` counts unverified tokens committed since the last verifier
    call; ``round_index`` counts rounds from 0; ``q`` holds the position scores of the block."""
    if not cfg.may_skip:
        return Decision(0, 0, "verify")
    gamma = int(tokens.shape[0])
    if cfg.name == "periodic":
        if (round_index + 1) % cfg.period != 0:
            return Decision(0, 0, "not_scheduled")
        k_hat = min(cfg.period_k, gamma)
    elif cfg.name == "prefix":
        assert q is not None and q.shape == (gamma,), (None if q is None else q.shape, gamma)
        if invalid_scores(q):
            return Decision(0, 0, "invalid_score")
        k_hat, reason = _prefix_choice(cfg, q, ctx)
        if k_hat == 0:
            return Decision(0, 0, reason)
    else:
        assert q is not None and q.shape == (gamma,), (None if q is None else q.shape, gamma)
        if invalid_scores(q):
            return Decision(0, 0, "invalid_score")
        k_hat = feasible_prefix(cfg.name, q, cfg.eta_b, cfg.eta_c)
    if D >= cfg.s_max:
        return Decision(0, k_hat, "stale")
    if k_hat == 0:
        return Decision(0, 0, "no_prefix")
    if cfg.signal and k_hat < cfg.k_min:
        return Decision(0, k_hat, "k_min")
    scores = q[:k_hat] if q is not None else np.ones(k_hat)
    refused = check_guards(tokens[:k_hat], scores, ctx, cfg.guards)
    if refused:
        return Decision(0, k_hat, refused)
    return Decision(k_hat, k_hat, "skip")


def _prefix_choice(cfg: PolicyConfig, q: np.ndarray, ctx: GuardContext) -> tuple[int, str]:
    """The prefix policy (beyond the paper; :mod:`vskip.engine.policy.prefix`): survival ``P(L >= k)``
    as the running product of ``q`` (the drafter's confidences, or a prefix model's per-position
    conditional survival ``1 - h_j``), the longest prefix with
    survival at least ``lam``, skipped only when longer than the block's own break-even length
    ``K* = (E[L] + 1) c_D / (c_D + c_V)``. The costs are ``cost_ratio`` = c_D / c_V when given
    (deterministic), else those measured so far in the run (none yet: verify)."""
    from .prefix import choose

    if cfg.cost_ratio is not None:
        c_D, c_V = cfg.cost_ratio, 1.0
    elif ctx.c_D and ctx.c_V:
        c_D, c_V = ctx.c_D, ctx.c_V
    else:
        return 0, "no_costs"
    ch = choose(np.cumprod(np.asarray(q, np.float64)), cfg.lam, c_D, c_V)
    return ch.K, ch.reason


def break_even_length(A: float, c_D: float, c_V: float) -> float:
    """Eq. 8: a skip of length K beats a strict round locally only when ``K > K* = A c_D/(c_D+c_V)``."""
    if c_D < 0 or c_V < 0 or (c_D + c_V) == 0 or not math.isfinite(A):
        raise ValueError("break-even length needs non-negative costs with c_D + c_V > 0")
    return A * c_D / (c_D + c_V)
