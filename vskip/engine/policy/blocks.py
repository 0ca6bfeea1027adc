"""Block length per round (beyond the paper; part of the default preset's shape,
``vskip.defaults.SHAPES``): a long draft block where a long one is likely to be accepted, the base
``gamma`` elsewhere.

Strict SDD pays for every drafted position in the verification's cost, but gains only the
positions it accepts. Long acceptances come from continuations the drafter can copy (a repeated
signature, a docstring restated in code), and they come in runs. Before drafting, the round
knows the drafter's copy-hint match length (how many of the last committed tokens repeat an
earlier stretch) and how the previous verified block ended. :func:`block_length` picks
``gamma_max`` when the match is at least ``min_match`` tokens long or the previous block was
accepted whole, and ``gamma`` otherwise.

After drafting, a verified round may also send the verifier only the drafted prefix it is
likely to accept (:func:`verify_length`): the leading positions whose raw confidence is at
least ``trim``. A verification's cost grows with the positions it scores, and the positions
after a doubtful one are rarely accepted. Both rules change only how many tokens are drafted
and checked, never what Strict SDD commits; a trimmed verification knows L only up to its
length, so traces for predictors are collected without trimming.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...defaults import GAMMA, MAX_GAMMA
from .acceptance import leading_run


@dataclass(frozen=True)
class BlockLength:
    """``gamma``: the base block length; ``gamma_max``: the long block (None: every block has
    ``gamma`` tokens, as in the paper); ``min_match``: copy-hint match length that earns it."""

    gamma: int = GAMMA
    gamma_max: int | None = None
    min_match: int = 8
    trim: float | None = None

    def __post_init__(self):
        if not 1 <= self.gamma <= MAX_GAMMA:
            raise ValueError(f"gamma must lie in 1..{MAX_GAMMA}, got {self.gamma}")
        if self.gamma_max is not None and self.gamma_max > MAX_GAMMA:
            raise ValueError(f"gamma-max must be at most {MAX_GAMMA}, got {self.gamma_max}")
        if self.gamma_max is not None and self.gamma_max < self.gamma:
            raise ValueError(f"gamma-max must be >= gamma ({self.gamma}), got {self.gamma_max}")
        if self.min_match < 1:
            raise ValueError(f"min-match must be >= 1, got {self.min_match}")
        if self.trim is not None and not 0.0 <= self.trim <= 1.0:
            raise ValueError(f"trim must lie in [0, 1], got {self.trim}")

    @property
    def adaptive(self) -> bool:
        return self.gamma_max is not None and self.gamma_max > self.gamma

    @property
    def longest(self) -> int:
        return self.gamma_max if self.adaptive else self.gamma


def block_length(cfg: BlockLength, match_length: int, last_full: bool) -> int:
    """The block length of this round. ``match_length``: the drafter's copy-hint match length
    (0 without a copy prior); ``last_full``: the previous verified block was accepted whole.

    >>> block_length(BlockLength(8, 32, 8), match_length=12, last_full=False)
    32
    >>> block_length(BlockLength(8, 32, 8), match_length=3, last_full=False)
    8
    """
    if cfg.adaptive and (match_length >= cfg.min_match or last_full):
        return int(cfg.gamma_max)
    return cfg.gamma


def verify_length(confidence: np.ndarray, trim: float | None) -> int:
    """How many drafted tokens a verified round sends to the verifier: all without ``trim``,
    else the leading run with confidence at least ``trim`` (at least one token).

    >>> verify_length(np.array([0.9, 0.8, 0.2, 0.95]), 0.5)
    2
    """
    g = int(confidence.shape[0])
    if trim is None or g == 0:
        return g
    return max(1, leading_run(np.asarray(confidence) >= trim))
