"""Acceptance rules of a verified round: Strict SDD, lenience (Eq. 9) and top-k (A.6).

Every rule reads a :class:`Verdict`, the verifier's judgement of one draft block as plain arrays,
and returns the number of draft tokens it accepts. The committed tokens are then the accepted
prefix plus the verifier's token at the first rejected position (the correction) or after the
block (the bonus token when every draft token is accepted). Pure numpy: no torch here.

Worked example (gamma = 4): draft ``[5, 7, 9, 2]``, verifier tokens (argmax) ``[5, 7, 3, 8, 1]``.
Strict accepts ``L = 2`` and commits ``[5, 7, 3]``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from typing import Callable, Union

import numpy as np

#: the largest k of top-k acceptance; draft ranks are exact below it
MAX_TOP_K = 64


@dataclass(frozen=True)
class Verdict:
    """The verifier's view of one block of ``gamma`` draft tokens.

    tokens:     int   [gamma + 1]  the verifier's token at each block position and after the block:
                                   its argmax (greedy), or its draw there under sampling
                                   (:func:`vskip.engine.policy.rule.Rule.verdict`); under the
                                   speculative rule the positions between a rejection and the
                                   bonus position are never read and hold -1
    draft_gap:  float [gamma]      z_j(x̂_j) - max_v z_j(v)  (<= 0; the log-ratio of Eq. 9)
    draft_rank: int   [gamma]      number of tokens whose logit is strictly above the draft's

    ``draft_gap`` and ``draft_rank`` may be given as functions that compute them: only lenient
    and top-k acceptance read them, so a verifier can leave the work to the first read. The rank
    must be exact below :data:`MAX_TOP_K` and may be a lower bound at or above it (top-k
    acceptance only asks whether it is below k).
    """

    tokens: np.ndarray
    gap: Union[np.ndarray, Callable[[], np.ndarray]]
    rank: Union[np.ndarray, Callable[[], np.ndarray]]

    def __init__(self, tokens: np.ndarray, draft_gap, draft_rank):
        object.__setattr__(self, "tokens", tokens)
        object.__setattr__(self, "gap", draft_gap)
        object.__setattr__(self, "rank", draft_rank)
        assert self.tokens.ndim == 1 and self.tokens.shape[0] >= 1, self.tokens.shape
        for given in (draft_gap, draft_rank):
            if not callable(given):
                assert given.shape == (self.gamma,), (given.shape, self.gamma)

    @cached_property
    def draft_gap(self) -> np.ndarray:
        gap = self.gap() if callable(self.gap) else self.gap
        assert gap.shape == (self.gamma,), (gap.shape, self.gamma)
        return gap

    @cached_property
    def draft_rank(self) -> np.ndarray:
        r = self.rank() if callable(self.rank) else self.rank
        assert r.shape == (self.gamma,), (r.shape, self.gamma)
        return r

    @property
    def gamma(self) -> int:
        return int(self.tokens.shape[0]) - 1


def leading_run(ok: np.ndarray) -> int:
    """Length of the leading run of True values."""
    bad = np.flatnonzero(~ok)
    return int(bad[0]) if bad.size else int(ok.shape[0])


def strict_accept(draft: np.ndarray, verdict: Verdict) -> int:
    """Strict SDD: the longest prefix where the draft equals the verifier's argmax (L)."""
    assert draft.shape == (verdict.gamma,), (draft.shape, verdict.gamma)
    return leading_run(np.asarray(draft) == verdict.tokens[:-1])


def lenience_accept(draft: np.ndarray, verdict: Verdict, lenience: float) -> int:
    """Eq. 9: accept x̂_j while z_j(x̂_j) - max_v z_j(v) >= log(l).

    At ``l = 1`` the Strict SDD argmax comparison is used, so ties are handled identically.
    """
    if not 0.0 < lenience <= 1.0:
        raise ValueError(f"lenience must lie in (0, 1], got {lenience}")
    if lenience == 1.0:
        return strict_accept(draft, verdict)
    if np.isnan(verdict.draft_gap).any():  # a sampled verdict: it has draws, no logit gaps
        raise ValueError("lenience acceptance is defined on the verifier's argmax; it takes no --temperature")
    return leading_run(verdict.draft_gap >= math.log(lenience))


def topk_accept(draft: np.ndarray, verdict: Verdict, k: int) -> int:
    """A.6: accept x̂_j while it is among the ``k`` largest verifier logits; ``k = 1`` is strict."""
    if k < 1:
        raise ValueError(f"top-k needs k >= 1, got {k}")
    if k == 1:
        return strict_accept(draft, verdict)
    return leading_run(verdict.draft_rank < k)


def drawn_verdict(drawn: np.ndarray) -> Verdict:
    """The verdict of a sampled round: the verifier's draw at each position (``drawn`` [gamma + 1]).
    It carries no logit gaps or ranks, so only the strict rule may read it (lenience and top-k
    are refused under sampling: their paper meaning is a greedy one)."""
    def no_rank():
        raise ValueError("topk acceptance is defined on the verifier's argmax; it takes no --temperature")

    drawn = np.asarray(drawn, dtype=np.int64)
    return Verdict(drawn, np.full(drawn.shape[0] - 1, np.nan), no_rank)


def committed_tokens(draft: np.ndarray, verdict: Verdict, accepted: int) -> np.ndarray:
    """The accepted draft prefix followed by the verifier's correction or bonus token."""
    return np.concatenate([np.asarray(draft[:accepted]), verdict.tokens[accepted : accepted + 1]])
