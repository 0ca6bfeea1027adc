"""The drafter's copy prior: a pointer mixture over the drafter's own context.

Code answers repeat their context: names, signatures, whole lines of the prompt. A small drafter
learns that late. The copy prior gives it the continuation of the longest earlier match of the
sequence's suffix (prompt-lookup style) as a *hint* per block position, and mixes it in::

    p(x_k) = (1 - lam[l, k]) * p_D(x_k) + lam[l, k] * 1{x_k = h_k}

``l`` is the match length, ``k`` the block position, and ``lam`` a small table fitted by maximum
likelihood on distillation data (:func:`fit_lambda`). The mixture is still a distribution, so the
drafter's confidence (its top probability at the reveal step) keeps its meaning for the skip
policies. The hint reads only the committed sequence the drafter is given, never the verifier.

Pure numpy; the drafter applies it inside its reveal steps. The same hint also drafts a lossless
round alone where it pays (:mod:`vskip.engine.policy.payoff`), with odds :func:`fit_copy_odds` fits.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Sequence

import numpy as np

from ..policy.acceptance import leading_run
from ..policy.payoff import LONGEST_COPY, ODDS_EDGES, CopyOdds, match_bucket

#: file name of a fitted copy prior beside a drafter
COPY_FILE = "copy_prior.json"

#: default bucket edges: match lengths 1, 2, 3, 4, 5-7, 8-15, 16+ and block positions
LENGTH_EDGES = (1, 2, 3, 4, 5, 8, 16)
OFFSET_EDGES = (0, 1, 2, 3, 4, 6, 8, 12, 16, 24)


def suffix_match(seq: Sequence[int] | np.ndarray, max_len: int = 32) -> tuple[int, int]:
    """The longest suffix of ``seq`` (at most ``max_len`` tokens) that also occurs earlier and is
    followed there by at least one token; ties go to the most recent occurrence.

    Returns ``(length, start)``: the match length (0 if even the last token never occurred before)
    and the index where the copied continuation starts (the token after the earlier occurrence)."""
    a = np.asarray(seq, dtype=np.int64)
    n = a.shape[0]
    if n < 2:
        return 0, -1
    # ends[i]: index of the last token of a candidate earlier occurrence (always < n - 1)
    ends = np.flatnonzero(a[:-1] == a[-1])
    if ends.size == 0:
        return 0, -1
    length, ends = _grow(a, ends, a, max_len)
    return length, int(ends[-1]) + 1


#: at most this many candidate ends of a match are compared over its whole length at once
GROW_AT_ONCE = 64


def _grow(a: np.ndarray, ends: np.ndarray, s: np.ndarray, max_len: int, length: int = 1) -> tuple[int, np.ndarray]:
    """``(length, ends)``: the longest suffix of ``s`` that ends in ``a`` at some of ``ends`` (each
    already holding ``s``'s last ``length`` tokens), at most ``max_len``; and the ends where it
    occurs, in order. Many ends are narrowed a token at a time; a few are compared at once over
    the whole remaining length (fewer numpy calls: a round pays each one's overhead)."""
    most = min(max_len, s.shape[0])
    while length < most and ends.size > GROW_AT_ONCE:
        back = ends - length
        keep = ends[(back >= 0) & (a[np.maximum(back, 0)] == s[-1 - length])]
        if keep.size == 0:
            return length, ends
        ends, length = keep, length + 1
    if length >= most or ends.size == 0:
        return length, ends
    offset = np.arange(length, most)
    back = ends[:, None] - offset
    same = (back >= 0) & (a[np.maximum(back, 0)] == s[-1 - offset])
    run = np.where(same.all(1), most - length, same.argmin(1))  # each end's run of matching tokens
    best = run.max()
    return length + int(best), ends[run == best]


def copy_hint(seq: Sequence[int] | np.ndarray, gamma: int, max_len: int = 32) -> tuple[np.ndarray, int]:
    """Hint tokens for the next ``gamma`` positions and the match length behind them.

    The copied run continues past the end of ``seq`` by repeating itself (a match that ends right
    before the suffix describes a period), so every position gets a hint when there is a match.
    With no match the hint is all -1 and the length 0."""
    a = np.asarray(seq, dtype=np.int64)
    length, start = suffix_match(a, max_len)
    if length == 0:
        return np.full(gamma, -1, dtype=np.int64), 0
    period = a.shape[0] - start  # >= 1
    idx = start + np.arange(gamma) % period
    return a[idx], length


def bucket_index(value: int | np.ndarray, edges: Sequence[int]) -> int | np.ndarray:
    return np.searchsorted(np.asarray(edges), value, side="right") - 1


@dataclass(frozen=True)
class CopyPrior:
    """The fitted mixture weights. ``lam[i][j]`` applies to match lengths in bucket i (edges
    ``length_edges``) at block positions in bucket j (edges ``offset_edges``)."""

    lam: tuple[tuple[float, ...], ...]
    length_edges: tuple[int, ...] = LENGTH_EDGES
    offset_edges: tuple[int, ...] = OFFSET_EDGES
    max_len: int = 32
    meta: dict = field(default_factory=dict)

    def __post_init__(self):
        lam = tuple(tuple(float(x) for x in row) for row in self.lam)
        object.__setattr__(self, "lam", lam)
        object.__setattr__(self, "length_edges", tuple(int(x) for x in self.length_edges))
        object.__setattr__(self, "offset_edges", tuple(int(x) for x in self.offset_edges))
        if len(lam) != len(self.length_edges) or any(len(r) != len(self.offset_edges) for r in lam):
            raise ValueError(f"lam must be {len(self.length_edges)} x {len(self.offset_edges)}")
        if any(not 0.0 <= x <= 1.0 for r in lam for x in r):
            raise ValueError("every lam must lie in [0, 1]")
        if self.length_edges[0] != 1 or self.offset_edges[0] != 0:
            raise ValueError("length edges start at 1 and offset edges at 0")
        if list(self.length_edges) != sorted(set(self.length_edges)) or list(self.offset_edges) != sorted(set(self.offset_edges)):
            raise ValueError("bucket edges must increase strictly")

    def weights(self, length: int, gamma: int) -> np.ndarray:
        """Mixture weight per block position for a match of ``length`` (0: no match, all 0)."""
        if length <= 0:
            return np.zeros(gamma)
        row = np.asarray(self.lam[int(bucket_index(length, self.length_edges))])
        return row[bucket_index(np.arange(gamma), self.offset_edges)]

    def hint(self, seq: Sequence[int], gamma: int) -> tuple[np.ndarray, np.ndarray]:
        """(hint tokens [gamma], mixture weights [gamma]) for a block after ``seq``."""
        h, length = copy_hint(seq, gamma, self.max_len)
        return h, self.weights(length, gamma)

    def to_json(self) -> dict:
        return {"lam": [list(r) for r in self.lam], "length_edges": list(self.length_edges),
                "offset_edges": list(self.offset_edges), "max_len": self.max_len, "meta": self.meta}

    @classmethod
    def from_json(cls, d: dict) -> "CopyPrior":
        return cls(lam=d["lam"], length_edges=d.get("length_edges", LENGTH_EDGES),
                   offset_edges=d.get("offset_edges", OFFSET_EDGES), max_len=d.get("max_len", 32),
                   meta=d.get("meta", {}))


def fit_lambda(p_target: np.ndarray, is_hint: np.ndarray, iters: int = 200, tol: float = 1e-9) -> float:
    """Maximum-likelihood weight of the mixture ``(1 - lam) * p_target + lam * is_hint`` by EM.

    p_target: the drafter's probability of the true next token at each sample; is_hint: whether
    the hint was that token. The likelihood is concave in lam, so EM reaches the optimum. A
    sample with neither (a true token outside the head, a wrong hint) has likelihood 0 at every
    lam and says nothing about it: it is left out."""
    p = np.asarray(p_target, dtype=np.float64)
    b = np.asarray(is_hint, dtype=np.float64)
    informative = (p > 0) | (b > 0)
    p, b = p[informative], b[informative]
    if p.size == 0:
        return 0.0
    if not b.any():
        return 0.0
    lam = 0.5
    for _ in range(iters):
        mix = (1 - lam) * p + lam * b
        r = np.divide(lam * b, mix, out=np.zeros_like(p), where=mix > 0)
        new = float(r.mean())
        if abs(new - lam) < tol:
            lam = new
            break
        lam = new
    return float(np.clip(lam, 0.0, 1.0))


def mixture_nll(p_target: np.ndarray, is_hint: np.ndarray, lam: np.ndarray | float, floor: float = 1e-12) -> float:
    """Mean negative log-likelihood of the true tokens under the mixture (``floor`` stands in for a
    zero probability, e.g. a token outside the drafter's head)."""
    mix = (1 - np.asarray(lam)) * np.asarray(p_target) + np.asarray(lam) * np.asarray(is_hint, dtype=np.float64)
    return float(-np.log(np.maximum(mix, floor)).mean())


#: the token that parts two answers in a corpus (no vocabulary has a negative id)
APART = -1
#: a corpus search is kept per suffix of this many tokens, for this many suffixes at most
SHORT, SHORT_KEPT = 3, 50_000


@dataclass(frozen=True)
class Corpus:
    """The verifier's own greedy answers to prompts outside every evaluation set, end to end with
    :data:`APART` between them: a second place to copy from (beyond the paper; retrieval drafts,
    as REST does with a datastore). A suffix of the sequence found here is continued by what
    followed it there. ``fingerprint``: the tokenizer it was written in
    (:func:`tokenizer_fingerprint`); a verifier with another one never reads it."""

    tokens: np.ndarray
    fingerprint: str
    meta: dict = field(default_factory=dict, compare=False)

    def __post_init__(self):
        a = np.asarray(self.tokens, dtype=np.int64)
        if a.ndim != 1 or (a < APART).any():
            raise ValueError("a copy corpus is one row of token ids, -1 between answers")
        object.__setattr__(self, "tokens", a)
        object.__setattr__(self, "answer", np.cumsum(a == APART))  # the answer each position belongs to
        # every position followed by a token of its answer, grouped by its token, in order
        pos = np.flatnonzero((a[:-1] != APART) & (a[1:] != APART))
        pos = pos[np.argsort(a[pos], kind="stable")]
        first, at = np.unique(a[pos], return_index=True)
        object.__setattr__(self, "_index", (first, np.append(at, pos.size), pos))
        object.__setattr__(self, "_short", {})  # the search of a suffix's last SHORT tokens, kept

    def match(self, seq: Sequence[int] | np.ndarray, max_len: int = LONGEST_COPY,
              skip: int | None = None) -> tuple[int, int]:
        """``(length, start)``: the longest suffix of ``seq`` (at most ``max_len`` tokens) found
        in the corpus and followed there by a token of the same answer; of its occurrences, the
        last of those whose next two tokens are the commonest there; ``start``, where its
        continuation begins (``(0, -1)``: none). ``skip``: leave out the
        answer of that index (a fit's own answer)."""
        s = np.asarray(seq[-max_len:], dtype=np.int64)  # a match is at most its last max_len
        if s.shape[0] == 0 or max_len < 1:
            return 0, -1
        if skip is not None or max_len < SHORT:
            return self._search(s, max_len, skip)
        # Most rounds ask again for a suffix whose last few tokens were asked before. Where its
        # match stops within them, the answer is theirs alone; else their occurrences (a few where
        # the whole corpus holds the last token thousands of times) are grown further. The
        # corpus's arrays are out of the cache after every forward: each step read fewer of them.
        key = tuple(s[-SHORT:].tolist())
        known = self._short.get(key)
        if known is None:
            if len(self._short) >= SHORT_KEPT:
                self._short.clear()
            known = self._short[key] = self._search(s[-SHORT:], SHORT, grown=len(key) == SHORT)
        if isinstance(known, tuple):  # the match stopped within the last few tokens: final
            return known
        length, ends = _grow(self.tokens, known, s, max_len, SHORT)
        return length, self._commonest(ends)

    def _search(self, s: np.ndarray, max_len: int, skip: int | None = None, grown: bool = False):
        """The search of :meth:`match` from the corpus's index. ``grown``: where the whole of
        ``s`` is found, its ends (for a longer suffix to grow) instead of ``(length, start)``."""
        first, at, pos = self._index
        i = int(np.searchsorted(first, s[-1]))
        if i == first.size or first[i] != s[-1]:
            return 0, -1
        ends = pos[at[i]: at[i + 1]]
        if skip is not None:
            ends = ends[self.answer[ends] != skip]
        if ends.size == 0:
            return 0, -1
        length, ends = _grow(self.tokens, ends, s, max_len)
        if grown and length == s.shape[0]:
            return ends
        return length, self._commonest(ends)

    def _commonest(self, ends: np.ndarray) -> int:
        """Of the answers that hold a match at ``ends``, where the continuation most of them share
        (its next two tokens) begins, at its last occurrence: a pattern common to many answers
        goes on as most do."""
        if ends.size == 1:
            return int(ends[0]) + 1
        a = self.tokens
        nxt = (a[ends + 1] + 1) * (1 << 32) + (a[np.minimum(ends + 2, a.size - 1)] + 1)  # -1, an answer's end, too
        _, inverse, counts = np.unique(nxt, return_inverse=True, return_counts=True)
        return int(ends[counts[inverse] == counts.max()][-1]) + 1

    def hint(self, start: int, n: int) -> np.ndarray:
        """Up to ``n`` tokens from ``start``, to the end of their answer."""
        run = self.tokens[start: start + n]
        cut = np.flatnonzero(run == APART)
        return run[: cut[0]] if cut.size else run

    def to_json(self) -> dict:
        return {"tokens": self.tokens.tolist(), "fingerprint": self.fingerprint, "meta": self.meta}

    @classmethod
    def from_json(cls, d: dict) -> "Corpus":
        return cls(np.asarray(d["tokens"], dtype=np.int64), d["fingerprint"], d.get("meta", {}))

    @classmethod
    def of_answers(cls, answers: Iterable[Sequence[int]], fingerprint: str, meta: dict | None = None) -> "Corpus":
        tokens: list[int] = []
        for ans in answers:
            tokens += [int(t) for t in ans] + [APART]
        return cls(np.asarray(tokens, dtype=np.int64), fingerprint, meta or {})


def tokenizer_fingerprint(tokenizer) -> str:
    """A digest of a tokenizer's vocabulary (every token string and its id)."""
    import hashlib
    import json

    vocab = sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1])
    return hashlib.sha256(json.dumps(vocab, ensure_ascii=False).encode()).hexdigest()[:16]


#: a match in the sequence itself this long is not searched for in the corpus (rarely beaten there,
#: and the search is the round's dearest step outside the forward)
CORPUS_BELOW = 8


def best_hint(seq: Sequence[int], n: int, corpus: Corpus | None = None, skip: int | None = None
              ) -> tuple[np.ndarray, int, str]:
    """The hint for the next ``n`` positions: ``(tokens, match length, source)``, from the
    sequence itself (``context``, :func:`copy_hint`) or, where its match there is shorter than
    :data:`CORPUS_BELOW` and the corpus has a longer one, from ``corpus`` (``corpus``; fewer
    tokens where its answer ends). No match: ``context`` with length 0."""
    a = np.asarray(seq, dtype=np.int64)  # once for both searches
    hint, length = copy_hint(a, n, LONGEST_COPY)
    if corpus is not None and length < CORPUS_BELOW:
        found, start = corpus.match(a, LONGEST_COPY, skip)
        if found > length:
            return corpus.hint(start, n), found, "corpus"
    return hint, length, "context"


def fit_copy_odds(answers: Iterable[tuple[Sequence[int], Sequence[int]]], longest: int = LONGEST_COPY,
                  edges: Sequence[int] = ODDS_EDGES, prior: float = 1.0, corpus: Corpus | None = None) -> CopyOdds:
    """Copy odds from (prompt, answer) pairs, each answer the verifier's own greedy tokens: at
    every answer position, the hint after what precedes it (:func:`best_hint`), its match
    length and source, and how many of its tokens the answer goes on with (capped at ``longest``
    and at the answer's end, where the position counts only up to what the answer shows).
    ``corpus``: the answers themselves, in order, end to end: each answer's hints from the
    corpus leave that answer out. ``prior``: pseudo-counts of a hint half right, which keep an
    empty bucket's odds off 0 and 1."""
    if prior <= 0:
        raise ValueError(f"the copy odds' prior must be positive (an untested bucket's odds), got {prior}")
    hits = {src: np.zeros((len(edges), longest)) for src in ("context", "corpus")}
    seen = {src: np.zeros((len(edges), longest)) for src in ("context", "corpus")}
    positions = 0
    for i, (prompt, answer) in enumerate(answers):
        seq = [int(t) for t in prompt]
        ans = [int(t) for t in answer]
        for t in range(len(ans)):
            hint, length, src = best_hint(seq, longest, corpus, skip=i)
            b = match_bucket(length, edges)
            if b:
                shown = min(longest, len(ans) - t)
                run = leading_run(hint[:shown] == np.asarray(ans[t: t + len(hint[:shown])]))
                tested = min(run + 1, shown, len(hint))  # j = 1 .. run + 1 were put to the test
                seen[src][b - 1, :tested] += 1
                hits[src][b - 1, :run] += 1
                positions += 1
            seq.append(ans[t])

    def survival(src):  # P(first j right) = prod over i <= j of P(i-th right | the ones before right)
        return np.cumprod((hits[src] + 0.5 * prior) / (seen[src] + prior), axis=1).round(4).tolist()

    return CopyOdds(survival=survival("context"), length_edges=tuple(edges),
                    corpus=survival("corpus") if corpus is not None else (),
                    meta={"positions": positions, "tested": seen["context"].astype(int).tolist(),
                          **({"tested_corpus": seen["corpus"].astype(int).tolist()} if corpus is not None else {})})
