"""Block length per round (beyond the paper; opt-in): a long draft block where a long one is
likely to be accepted, the base ``gamma`` elsewhere.

Strict SDD pays for every drafted position in the verification's cost, but gains only the
positions it accepts. Long acceptances come from continuations the drafter can copy (a repeated
signature, a docstring restated in code), and they come in runs. Before drafting, the round
knows the drafter's copy-hint match length (how many of the last committed tokens repeat an
earlier stretch) and how the previous verified block ended. :func:`block_length` picks
``gamma_max`` when the match is at least ``min_match`` tokens long or the previous block was
accepted whole, and ``gamma`` otherwise. It changes only how many tokens are drafted, never
what Strict SDD commits.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class BlockLength:
    """``gamma``: the base block length; ``gamma_max``: the long block (None: every block has
    ``gamma`` tokens, as in the paper); ``min_match``: copy-hint match length that earns it."""

    gamma: int = 16
    gamma_max: int | None = None
    min_match: int = 8

    def __post_init__(self):
        if self.gamma < 1:
            raise ValueError(f"gamma must be >= 1, got {self.gamma}")
        if self.gamma_max is not None and self.gamma_max < self.gamma:
            raise ValueError(f"gamma-max must be >= gamma ({self.gamma}), got {self.gamma_max}")
        if self.min_match < 1:
            raise ValueError(f"min-match must be >= 1, got {self.min_match}")

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
