"""The two small protocols the decode loop sees. No torch, tokenizer or cache crosses them.

A drafter proposes a block of ``gamma`` tokens with a confidence per position; a verifier scores a
block after a committed sequence and owns its KV cache. Both receive the whole committed sequence
each call and keep whatever they cache in sync with it themselves.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, Sequence

import numpy as np

from ..policy import Draw, Verdict

#: Per-position drafter features of A.7, in column order (the loop adds block position,
#: generated length, segment position and the two dataset indicators: 19 in all).
DRAFT_FEATURES = (
    "reveal_step",
    "reveal_rank",
    "reveal_parallelism",
    "late_reveal",
    "p_top1",
    "log_p_top1",
    "entropy",
    "neg_entropy",
    "margin",
    "top5_mass",
    "p_top1_step0",
    "neg_entropy_step0",
    "delta_p_top1",
    "delta_neg_entropy",
)


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix: how much of a cache built for ``a`` serves ``b``."""
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


@dataclass
class DraftBlock:
    """One proposed block.

    tokens:      int64   [gamma]   drafted token ids (verifier vocabulary)
    confidence:  float32 [gamma]   raw confidence q_j = p_draft(x̂_j) at the reveal step
    features:    float32 [gamma, len(DRAFT_FEATURES)] or None
    hidden:      [gamma, d_model] LM-head input at the reveal step (array or tensor) or None
    q:           float64 [gamma, V] the distributions a *sampled* draft was drawn from
                 (:mod:`vskip.engine.policy.sampling`, speculative rule), else None
    """

    tokens: np.ndarray
    confidence: np.ndarray
    features: np.ndarray | None = None
    hidden: Any = None
    q: np.ndarray | None = None

    def __post_init__(self):
        assert self.tokens.ndim == 1, self.tokens.shape
        assert self.confidence.shape == self.tokens.shape, (self.confidence.shape, self.tokens.shape)

    @property
    def gamma(self) -> int:
        return int(self.tokens.shape[0])


class Drafter(Protocol):
    def propose(self, seq: Sequence[int], gamma: int, features: bool = False, draw: Draw | None = None) -> DraftBlock:
        """Draft ``gamma`` tokens to follow ``seq`` (prompt + committed output): the drafter's
        choice at each position, or with a ``draw`` tokens sampled from its warped distributions,
        returned in ``DraftBlock.q`` (only drafters that draft a block in one forward)."""

    def warmup(self, seq: Sequence[int], gamma: int) -> None: ...

    def reset(self) -> None:
        """Forget any cached context (a new prompt follows)."""

    def match_length(self, seq: Sequence[int]) -> int:
        """How many of the last tokens of ``seq`` the drafter can continue by copying (its copy
        hint's match length; 0 when it does not copy). Read before drafting, to choose a block
        length (:mod:`vskip.engine.policy.blocks`)."""


class Verifier(Protocol):
    eos_ids: frozenset[int]
    #: ids no skip may commit (special tokens)
    special_ids: frozenset[int]
    #: longest sequence the model accepts
    max_length: int

    def score(self, seq: Sequence[int], block: Sequence[int], shadow: bool = False, draw: Draw | None = None) -> Verdict:
        """Judge ``block`` after ``seq``: argmax at each block position and after it, or with a
        ``draw`` (:mod:`vskip.engine.policy.sampling`) the token drawn there with its uniform number
        (under the speculative rule, the tokens it commits: ``speculative_draws``). A shadow call must leave the verifier's state as a real decode would find it."""

    def warmup(self, seq: Sequence[int], gamma: int) -> None: ...

    def reset(self) -> None: ...


class Predictor(Protocol):
    """A learned survival predictor mapping a block to scores q_j: marginal or conditional survival,
    or a prefix model's per-position conditional survival ``1 - h_j`` (whose running product is
    ``P(L >= k)``; that kind also has ``threshold(task_id, alpha)``, its calibrated ``lam``)."""

    def scores(self, block: DraftBlock, features: np.ndarray, task_id: str | None = None) -> np.ndarray: ...
