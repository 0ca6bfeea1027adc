"""The two small protocols the decode loop sees. No torch, tokenizer or cache crosses them.

A drafter proposes a block of ``gamma`` tokens with a confidence per position; a verifier scores a
block after a committed sequence and owns its KV cache. Both receive the whole committed sequence
each call and keep whatever they cache in sync with it themselves. Neither applies an acceptance
rule or draws a random number: the loop and the policy do (:mod:`vskip.engine.policy.rule`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, Sequence

import numpy as np

from ..policy import Sampling, Verdict  # data types only: no rule crosses into the models

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
    lo, hi = 0, n  # a[:lo] == b[:lo]; the first difference, if any, lies in [lo, hi)
    if list(a[:n]) == list(b[:n]):  # the usual case, compared at C speed: one sequence grows
        return n
    while hi - lo > 16:  # halve the range by slices compared at C speed
        mid = (lo + hi) // 2
        if list(a[lo:mid]) == list(b[lo:mid]):
            lo = mid
        else:
            hi = mid
    while lo < n and a[lo] == b[lo]:
        lo += 1
    return lo


@dataclass
class DraftBlock:
    """One proposed block.

    tokens:      int64   [gamma]   drafted token ids (verifier vocabulary)
    confidence:  float32 [gamma]   raw confidence q_j = p_draft(x̂_j) at the reveal step
    features:    float32 [gamma, len(DRAFT_FEATURES)] or None
    hidden:      [gamma, d_model] LM-head input at the reveal step (array or tensor) or None
    q:           float64 [gamma, V] the drafter's warped distributions over the verifier's
                 vocabulary when asked for them (the speculative rule: the loop draws the block's
                 tokens from them, :mod:`vskip.engine.policy.sampling`), else None
    """

    tokens: np.ndarray
    confidence: np.ndarray
    features: np.ndarray | None = None
    hidden: Any = None
    q: np.ndarray | None = None
    copied: bool = False

    def __post_init__(self):
        assert self.tokens.ndim == 1, self.tokens.shape
        assert self.confidence.shape == self.tokens.shape, (self.confidence.shape, self.tokens.shape)

    @property
    def gamma(self) -> int:
        return int(self.tokens.shape[0])

    def hidden_array(self) -> np.ndarray | None:
        """``hidden`` as a float32 numpy array (a trace keeps it), whatever the drafter returned."""
        h = self.hidden
        if h is None or isinstance(h, np.ndarray):
            return h
        return h.float().cpu().numpy()


@dataclass(frozen=True)
class Call:
    """One verifier call of a batched forward: judge ``block`` after ``seq`` for the sequence held
    in ``slot``; a ``shadow`` call leaves that slot as a real decode would find it."""

    seq: Sequence[int]
    block: Sequence[int]
    shadow: bool = False
    slot: int = 0


class Drafter(Protocol):
    """What the loop and ``vskip compare`` use of a drafter, all of it."""

    #: the longest block it drafts (None: no limit of its own)
    max_gamma: int | None
    #: reveal steps per block (1: the whole block in one forward, which the speculative rule needs)
    steps: int
    #: it drafts from the verifier's hidden states, which the loop has the verifier compute over
    #: the prompt (:meth:`Verifier.prefill`) before the first block
    reads_verifier: bool

    def propose(self, seq: Sequence[int], gamma: int, features: bool = False, sampling: Sampling | None = None,
                slot: int = 0) -> DraftBlock:
        """Draft ``gamma`` tokens to follow ``seq`` (prompt + committed output) of the sequence
        held in ``slot`` (whose cached context it keeps): the drafter's choice at each position;
        with ``sampling`` (only drafters with ``steps == 1``), also its distributions warped by
        those settings, in ``DraftBlock.q``, for the loop to draw from."""

    def propose_many(self, requests: Sequence[tuple[int, Sequence[int], int]], features: bool = False,
                     sampling: Sampling | None = None) -> list[DraftBlock]:
        """:meth:`propose` for each (slot, seq, gamma) of ``requests``, in one forward per reveal
        step where the drafter can (the loop's batch)."""

    def with_steps(self, steps: int) -> "Drafter":
        """A drafter sharing this one's weights that reveals a block in ``steps`` steps (this one
        unchanged); a drafter that drafts in one forward refuses any other number."""

    def warmup(self, seq: Sequence[int], gamma: int) -> None: ...

    def reset(self, slot: int | None = None) -> None:
        """Forget a slot's cached context (a new prompt follows there), or every slot's (None)."""

    def prefill(self, ids: Sequence[int], slot: int = 0) -> None:
        """Encode committed context ``ids`` into ``slot``'s cache ahead of its first block, so that a
        long prompt can be read in chunks over several rounds (the server's chunked prefill); a
        drafter that caches no context does nothing."""

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
    #: whether it keeps a KV cache (:meth:`set_cache`)
    use_cache: bool

    def open_slots(self, n: int) -> None:
        """Hold ``n`` sequences at once (slots 0 .. n - 1), all empty: the batch of the loop."""

    def score_many(self, calls: Sequence[Call]) -> list[Verdict]:
        """Judge each call's ``block`` after its ``seq`` greedily, all in one forward: the argmax
        at each block position and after it, with the drafted tokens' logit gaps and ranks. A
        shadow call must leave its slot as a real decode would find it."""

    def distributions_many(self, calls: Sequence[Call], sampling: Sampling) -> list[np.ndarray]:
        """The warped distributions (float64 [len(block) + 1, V]) at each call's block positions
        and after it, under ``sampling``'s temperature, top-k and top-p; state as
        :meth:`score_many` leaves it."""

    def prefill(self, ids: Sequence[int], slot: int = 0) -> None:
        """Run over committed tokens ``ids`` (a prompt) in ``slot``, so that what it keeps (its
        cache, the hidden states a conditioned drafter reads) holds them."""

    def set_cache(self, on: bool) -> None:
        """Keep a KV cache (on) or recompute the whole sequence every call (off, as the paper)."""

    def warmup(self, seq: Sequence[int], gamma: int) -> None: ...

    def reset(self, slot: int | None = None) -> None:
        """Forget a slot's sequence (a new prompt follows there), or every slot's (None)."""


class Predictor(Protocol):
    """A learned survival predictor mapping a block to scores q_j: marginal or conditional survival,
    or a prefix model's per-position conditional survival ``1 - h_j`` (whose running product is
    ``P(L >= k)``; that kind also has ``threshold(task_id, alpha)``, its calibrated ``lam``)."""

    #: marginal, conditional or prefix
    kind: str
    #: the online calibration's record (the prefix model's thresholds chosen on its own decodes), or None
    online: dict | None

    def scores(self, block: DraftBlock, features: np.ndarray, task_id: str | None = None) -> np.ndarray: ...
