"""Where a lossless round's draft comes from: the choice that pays (beyond the paper).

Strict SDD commits the verifier's own tokens whatever it is shown, so what a round drafts
changes its speed, never its text. Three sources compete each round:

- the **copy hint** alone (:func:`vskip.engine.models.copy.best_hint`): the continuation of the
  longest earlier match of the sequence's suffix, in the sequence itself or, where longer, in a
  corpus of the verifier's own answers to held-out prompts, drafted without any forward. Its
  first ``j`` tokens are all the verifier's with a probability :class:`CopyOdds` tabulates per
  source and match length, fitted on those answers (:func:`vskip.engine.models.copy.fit_copy_odds`);
- the **drafter** (a forward, ``c_D``), whose yield per match length is measured as it runs;
- the **verifier alone** (one row: its own next token, as ``ar``).

A round of ``rows`` scored positions costs ``base + per_row * rows`` (:class:`RoundCosts`: the
forward's fixed part with the loop's own time per round, and each row's arithmetic, measured on
the running machine). Sequences decoded side by side share ``base``. Each source's value is its
expected committed tokens over its share of the round's time (Eq. 8 of the paper per round:
``A / (c_D + c_V(n))``), and the round takes the best. Plain numpy; nothing here measures.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

#: match-length buckets of the copy odds: 1, 2, 3, 4-5, 6-7, 8-11, 12-15, 16-23, 24-31, 32+
ODDS_EDGES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32)
#: the longest copy draft a round sends (the hint's match is searched up to as many tokens)
LONGEST_COPY = 32


def match_bucket(length: int, edges: Sequence[int] = ODDS_EDGES) -> int:
    """The bucket of a copy-hint match ``length``: 0 for no match, else 1 + the index of the
    largest edge at most ``length``.

    >>> [match_bucket(n) for n in (0, 1, 3, 5, 40)]
    [0, 1, 3, 4, 10]
    """
    if length <= 0:
        return 0
    return bisect_right(edges, length)


@dataclass(frozen=True)
class CopyOdds:
    """``survival[b][j - 1]``: the probability that the copy hint's first ``j`` tokens are all the
    verifier's greedy tokens, after a match in bucket ``b + 1`` of ``length_edges``."""

    survival: tuple[tuple[float, ...], ...]
    length_edges: tuple[int, ...] = ODDS_EDGES
    #: the same for a hint copied from a corpus of the verifier's answers (empty: none fitted)
    corpus: tuple[tuple[float, ...], ...] = ()
    meta: dict = field(default_factory=dict, compare=False)

    def __post_init__(self):
        object.__setattr__(self, "length_edges", tuple(int(x) for x in self.length_edges))
        for name in ("survival", "corpus"):
            s = tuple(tuple(float(x) for x in row) for row in getattr(self, name))
            object.__setattr__(self, name, s)
            if name == "corpus" and not s:
                continue
            if len(s) != len(self.length_edges) or not s or len({len(r) for r in s}) != 1 or not s[0]:
                raise ValueError(f"copy odds need one non-empty row of equal length per bucket ({len(self.length_edges)})")
            if any(not 0.0 <= x <= 1.0 for r in s for x in r):
                raise ValueError("every copy odd must lie in [0, 1]")
            if any(a < b for r in s for a, b in zip(r, r[1:])):
                raise ValueError("copy odds must not grow along a row (all of the first j+1 right implies the first j)")
        if self.corpus and len(self.corpus[0]) != len(self.survival[0]):
            raise ValueError("the corpus odds must reach as far as the context's")
        if self.length_edges[0] != 1 or list(self.length_edges) != sorted(set(self.length_edges)):
            raise ValueError("match-length edges start at 1 and increase strictly")

    @property
    def longest(self) -> int:
        return len(self.survival[0])

    def row(self, match_length: int, source: str = "context") -> np.ndarray:
        """The survival row after a match of ``match_length`` in ``source`` (``context`` or
        ``corpus``; all zeros without a match, or for a corpus without odds)."""
        b = match_bucket(match_length, self.length_edges)
        table = self.corpus if source == "corpus" else self.survival
        if b == 0 or not table:
            return np.zeros(self.longest)
        return np.asarray(table[b - 1])

    def to_json(self) -> dict:
        return {"survival": [list(r) for r in self.survival], "length_edges": list(self.length_edges),
                "corpus": [list(r) for r in self.corpus], "meta": self.meta}

    @classmethod
    def from_json(cls, d: dict) -> "CopyOdds":
        return cls(survival=d["survival"], length_edges=d.get("length_edges", ODDS_EDGES), corpus=d.get("corpus", ()),
                   meta=d.get("meta", {}))


@dataclass(frozen=True)
class RoundCosts:
    """Seconds: ``base``, a round's fixed part (the forward's weights read once, the loop's own
    time), shared by the sequences of a batch; ``per_row``, each scored position; ``draft``, a
    drafter call per sequence (None: not measured yet); ``by_rows``, where measured, a whole
    round's seconds by the rows it scores (index n - 1), which a sequence decoded alone pays as
    they are: a CPU's forward of two rows may cost far more than the line through the others says
    (one row streams the weights; two turn the product into arithmetic)."""

    base: float
    per_row: float
    draft: float | None = None
    by_rows: tuple[float | None, ...] = ()

    def __post_init__(self):
        # filled where not measured from the line, and never below a smaller round's cost
        table, floor = [], 0.0
        for n, c in enumerate(self.by_rows, 1):
            floor = max(floor, self.base + self.per_row * n if c is None else float(c))
            table.append(floor)
        object.__setattr__(self, "_table", tuple(table))

    def round(self, rows: int) -> float:
        """A round of ``rows`` scored positions, alone: measured, else on the line, and never
        below a smaller round's cost."""
        if 0 < rows <= len(self._table):
            return self._table[rows - 1]
        return max(self.base + self.per_row * rows, self._table[-1] if self._table else 0.0)

    def shares(self, most: int, sharing: int = 1) -> np.ndarray:
        """:meth:`share` of rounds of 1 .. ``most`` rows, without a drafter call."""
        rows = np.arange(1, most + 1)
        line = self.base / max(1, sharing) + self.per_row * rows
        if sharing > 1 or not self._table:
            return line
        t = np.asarray(self._table)
        return np.where(rows <= t.size, t[np.minimum(rows, t.size) - 1], np.maximum(self.base + self.per_row * rows, t[-1]))

    def share(self, rows: int, sharing: int = 1, drafted: bool = False) -> float:
        """One sequence's share of a round in which it scores ``rows`` positions beside
        ``sharing - 1`` others (``drafted``: it also paid a drafter call)."""
        own = self.round(rows) if sharing <= 1 else self.base / sharing + self.per_row * rows
        return own + (self.draft or 0.0 if drafted else 0.0)


def conditional(survival: np.ndarray) -> np.ndarray:
    """Each copied token's own odds, given the ones before it are right: ``S_j / S_(j-1)`` (0
    after a zero), the per-position confidence a skip rule reads (:mod:`vskip.engine.policy.signals`:
    raw confidence's geometric mean of them is ``S_k^(1/k)``).

    >>> conditional(np.array([0.9, 0.81, 0.0, 0.0])).round(3).tolist()
    [0.9, 0.9, 0.0, 0.0]
    """
    s = np.asarray(survival, dtype=np.float64)
    before = np.concatenate([[1.0], s[:-1]])
    return np.divide(s, before, out=np.zeros_like(s), where=before > 0)


def copy_value(survival: np.ndarray, k: int, costs: RoundCosts, sharing: int = 1) -> float:
    """Expected committed tokens per second of a round that verifies ``k`` copied tokens: the
    ones accepted plus the verifier's own after them, over ``k + 1`` rows' share."""
    return (1.0 + float(np.sum(survival[:k]))) / costs.share(k + 1, sharing)


def copy_length(survival: np.ndarray, costs: RoundCosts, sharing: int = 1, limit: int | None = None) -> int:
    """The number of copied tokens worth verifying (0: the verifier alone pays more): the ``k``
    of highest :func:`copy_value`, the shortest among equals, at most ``limit``."""
    n = len(survival) if limit is None else max(0, min(limit, len(survival)))
    if n == 0 or survival[0] <= 0.0:
        return 0
    gain = 1.0 + np.concatenate([[0.0], np.cumsum(survival[:n])])
    return int(np.argmax(gain / costs.shares(n + 1, sharing)))


def drafter_value(expected: float, gamma: int, costs: RoundCosts, sharing: int = 1) -> float:
    """Expected committed tokens per second of a drafter round that verifies ``gamma`` drafted
    tokens and accepts ``expected`` of them on average."""
    return (1.0 + expected) / costs.share(gamma + 1, sharing, drafted=True)


def choose_source(survival: np.ndarray, drafter_yield: float | None, gamma: int, costs: RoundCosts,
                  sharing: int = 1, limit: int | None = None) -> tuple[str, int]:
    """This round's source, ``("copy", k)``, ``("drafter", gamma)`` or ``("alone", 0)``: the one of
    highest expected tokens per second (``drafter_yield``: the drafter's mean accepted tokens at
    this match length, None: no drafter; ``limit``: tokens the budget still allows)."""
    k = copy_length(survival, costs, sharing, limit)
    best = ("copy", k) if k else ("alone", 0)
    value = copy_value(survival, k, costs, sharing)
    if drafter_yield is not None and gamma > 0 and costs.draft is not None:
        if drafter_value(drafter_yield, gamma, costs, sharing) > value:
            best = ("drafter", gamma)
    return best
