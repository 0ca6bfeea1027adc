"""Safety guards checked before any skip (§4.1, A.6).

A skip is refused when the candidate prefix contains a forbidden special token or an unverified
end-of-sequence token, when it would create a repetition loop, when any score of the block is
invalid (NaN or outside [0, 1]), or when the block was shortened because the output is about to
reach its length limit. Each guard returns the reason it refused, or None.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class GuardConfig:
    """Repetition is a run of ``max_run`` equal tokens, or the last ``loop_repeats`` copies of a
    period-``p`` pattern (``2 <= p <= max_period``) ending inside the prefix."""

    max_run: int = 8
    max_period: int = 8
    loop_repeats: int = 4


@dataclass(frozen=True)
class GuardContext:
    """What the guards need besides the prefix: the tokens already committed (a tail is enough),
    the ids no skip may commit, and whether this block is shorter than gamma; and the costs
    measured so far, which the prefix policy weighs."""

    history: np.ndarray
    forbidden_ids: frozenset[int]
    eos_ids: frozenset[int]
    shortened: bool = False
    c_D: float | None = None  # measured seconds per draft block, so far (the prefix policy's costs)
    c_V: float | None = None  # measured seconds per verifier call, so far


def invalid_scores(q: np.ndarray) -> bool:
    q = np.asarray(q, dtype=np.float64)
    return bool(np.any(~np.isfinite(q)) or np.any(q < 0.0) or np.any(q > 1.0))


def _has_run(seq: np.ndarray, start: int, max_run: int) -> bool:
    """A run of ``max_run`` equal tokens ending at or after index ``start``."""
    if seq.shape[0] < max_run:
        return False
    same = seq[1:] == seq[:-1]
    run = 1
    for i in range(1, seq.shape[0]):
        run = run + 1 if same[i - 1] else 1
        if run >= max_run and i >= start:
            return True
    return False


def _has_loop(seq: np.ndarray, start: int, cfg: GuardConfig) -> bool:
    """The sequence ends, at some index >= start, in ``loop_repeats`` copies of a short pattern."""
    n = seq.shape[0]
    for end in range(max(start, 0), n):
        for p in range(2, cfg.max_period + 1):
            span = p * cfg.loop_repeats
            lo = end + 1 - span
            if lo < 0:
                break
            window = seq[lo : end + 1]
            if np.all(window[p:] == window[:-p]):
                return True
    return False


def repetition(history: np.ndarray, prefix: np.ndarray, cfg: GuardConfig) -> bool:
    """Would committing ``prefix`` after ``history`` complete a repetition loop?"""
    keep = max(cfg.max_run, cfg.max_period * cfg.loop_repeats)
    tail = np.asarray(history[-keep:], dtype=np.int64)
    seq = np.concatenate([tail, np.asarray(prefix, dtype=np.int64)])
    start = tail.shape[0]
    return _has_run(seq, start, cfg.max_run) or _has_loop(seq, start, cfg)


def check_guards(prefix: np.ndarray, q: np.ndarray, ctx: GuardContext, cfg: GuardConfig) -> str | None:
    """The first guard that refuses the skip of ``prefix``, or None when all pass."""
    if ctx.shortened:
        return "shortened"
    if invalid_scores(q):
        return "invalid_score"
    toks = set(int(t) for t in prefix)
    if toks & ctx.eos_ids:
        return "eos"
    if toks & ctx.forbidden_ids:
        return "special"
    if repetition(ctx.history, prefix, cfg):
        return "repetition"
    return None
