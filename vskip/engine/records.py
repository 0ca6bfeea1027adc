"""What a decode takes and returns: a job (a prompt and its own settings), its tokens, a record per
round, the timings and (for the studies) the A.7 inputs of each block, and what a round of the
loop did to a sequence. The loop that fills them is :mod:`vskip.engine.decode`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Sequence

import numpy as np

if TYPE_CHECKING:
    from .policy import PolicyConfig
    from .settings import DecodeConfig


@dataclass(frozen=True)
class RoundRecord:
    """One round. ``K``: committed skip length (0 on a verified round); ``L``: strict accepted
    length (from the shadow verifier on skipped rounds, None without it); ``accepted``: draft tokens
    committed; ``committed``: all tokens committed (with the correction or bonus token);
    ``relaxed``: committed by a lossy rule (a skip, lenience or top-k), the set A of §3.2."""

    round: int
    verified: bool
    K: int
    K_hat: int
    L: int | None
    accepted: int
    committed: int
    relaxed: bool
    reason: str
    gamma: int


@dataclass
class BlockTrace:
    """The A.7 inputs of one block: features [gamma, 19], hidden [gamma, d], raw confidence
    [gamma], and the strict accepted length L (None on an unshadowed skip)."""

    round: int
    features: np.ndarray
    hidden: np.ndarray | None
    confidence: np.ndarray
    L: int | None
    K: int


@dataclass
class DecodeResult:
    tokens: list[int]
    rounds: list[RoundRecord]
    decode_seconds: float
    draft_seconds: float
    verify_seconds: float
    predict_seconds: float
    shadow_seconds: float
    verifier_calls: int
    draft_blocks: int
    stop: str
    traces: list[BlockTrace] = field(default_factory=list)

    @property
    def generated_tokens(self) -> int:
        return len(self.tokens)

    @property
    def skipped_rounds(self) -> int:
        return sum(1 for r in self.rounds if not r.verified)

    @property
    def policy_seconds(self) -> float:
        """T_policy of Eq. 7: decode time outside drafting and verification forwards."""
        return max(0.0, self.decode_seconds - self.draft_seconds - self.verify_seconds)


def agreement(rounds: Sequence[RoundRecord]) -> tuple[float, float]:
    """(StrictToken, FullPrefix) of Eqs. 1–2 over the rounds where a relaxed rule committed a
    nonempty draft prefix and L is known (:func:`vskip.engine.metrics.agreement_from_rounds`). Both are
    1 when there is no such round."""
    from .metrics import agreement_from_rounds

    st, fp, _ = agreement_from_rounds(rounds)
    return st, fp


@dataclass(frozen=True)
class Job:
    """One prompt to decode (token ids); ``task_id`` and ``sample`` (the index of a sampled
    completion) key its random numbers. ``policy`` and ``cfg``: this job's own settings, checked
    where they were made (a server's request); None: the loop's."""

    prompt: Sequence[int]
    task_id: str | None = None
    sample: int = 0
    policy: PolicyConfig | None = None
    cfg: DecodeConfig | None = None


@dataclass(frozen=True)
class Step:
    """What one round did to one sequence: the tokens it ``committed`` and the round's ``record``,
    and when the sequence is done, its ``result`` (None while it runs); ``error``: the failure that
    ended this sequence alone (its result then holds what it had committed)."""

    job: "Job"
    slot: int
    committed: list[int]
    record: RoundRecord | None = None
    result: DecodeResult | None = None
    error: BaseException | None = None
