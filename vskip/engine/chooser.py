"""The measuring side of the choice of a lossless round's draft (:mod:`vskip.engine.policy.payoff`).

A :class:`Chooser` measures, on the running machine, what a round costs by the rows it scores
(the mean of the recent rounds of as many rows where there were some, else a least-squares line,
weighted to the recent rounds, of each round's time outside the drafter on its scored rows), what a drafter call costs per sequence, and what the drafter yields per
copy-match bucket; the pure policy turns those and the fitted copy odds into each round's
source. One chooser lives as long as its decoder, so what one prompt measured serves the next.

Only the speed depends on these numbers: a lossless round commits the verifier's own tokens
whatever it drafted. Clock noise can change which source a round takes, never the text.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Sequence

import numpy as np

from .models.copy import Corpus, best_hint, tokenizer_fingerprint
from .policy.payoff import (LONGEST_COPY, CopyOdds, RoundCosts, choose_source, copy_length, copy_value, drafter_value,
                             match_bucket)

#: the copy odds fitted for the embedded verifier, and the corpus of its answers to held-out
#: prompts (scripts/fit_copy_odds.py writes both)
ODDS_FILE = Path(__file__).resolve().parents[1] / "assets" / "copy_odds.json"
CORPUS_FILE = ODDS_FILE.with_name("copy_corpus.json")
#: a scored row's cost relative to a one-row round's fixed part, assumed until rounds of
#: different sizes are measured (a CPU's int8 forward: about 0.13; a GPU's: far less)
PRIOR_ROW_RATIO = 0.15
#: weight of the prior slope against the measured rows' spread (in rows squared)
PRIOR_WEIGHT = 4.0
#: weight kept by a rows count's earlier rounds at each new round, and the weight of rounds it
#: needs before its own mean replaces the line through all of them
ROWS_DECAY = 0.98
TRUSTED = 3.0
#: a round this many times dearer than the line says is left out of the costs
OUTLIER = 3.0
#: how far above the shipped odds a batch's gate reaches (the measured odds may have risen), and
#: how many measured rounds it stands for
GATE_MARGIN = 1.2
GATE_EVERY = 32
#: in a round of several sequences the chooser also measures whole rounds, by the sequences in
#: them, with the copy hints searched (``hints``) and without (``alone``: every sequence verifies
#: its own next token, as ``ar``), and takes the one that commits more tokens per second: each is
#: tried for TRY_ROUNDS rounds first, then the other is tried again for TRY_ROUNDS rounds after
#: RETRY_EVERY of the better one's, and after twice as many each time a trial's own rounds were
#: slower than the better one (up to RETRY_MOST; a trial that was not starts over at RETRY_EVERY): rounds in a
#: batch cost what no model of one sequence says (the search is per sequence, and a batch's rows
#: read every sequence's cache), and a mode that keeps losing costs its trials alone
TRY_ROUNDS = 4
RETRY_EVERY = 64
RETRY_MOST = 1024
MODES = ("hints", "alone")
#: weight a mode's earlier rounds keep at each of its new ones (a trial of 4 rounds is a third of it)
MODE_DECAY = 0.9
#: the weight of a mode's first TRY_ROUNDS rounds, below which it is still being tried
TRIED = 0.99 * sum(MODE_DECAY ** i for i in range(TRY_ROUNDS))
#: the costs are refitted after this many new observations at most (after each of the first few):
#: they drift slowly, and the fit is a round's dearest step of the choice
REFIT_EVERY = 8
#: the shipped copy odds count as this many copy rounds of each bucket beside the ones measured
ODDS_WEIGHT = 20.0
#: a drafter's yield is measured this many times per bucket before it is trusted
EXPLORE = 2
#: a bucket whose drafter does not pay is drafted again after this many of its rounds, then
#: after twice as many, three times, ...
PROBE_EVERY = 256


@lru_cache(maxsize=4)
def load_odds(path: str = str(ODDS_FILE)) -> CopyOdds:
    """The copy odds in ``path`` (default: the shipped ones)."""
    return CopyOdds.from_json(json.loads(Path(path).read_text()))


@lru_cache(maxsize=2)
def load_corpus(path: str = str(CORPUS_FILE)) -> Corpus:
    """The corpus in ``path`` (default: the shipped one)."""
    return Corpus.from_json(json.loads(Path(path).read_text()))


def chooser_for(tokenizer) -> "Chooser":
    """A chooser for a verifier with ``tokenizer``: with the shipped corpus where it was written
    in that tokenizer, without one elsewhere (its ids would mean other tokens)."""
    corpus = load_corpus()
    same = hasattr(tokenizer, "get_vocab") and tokenizer_fingerprint(tokenizer) == corpus.fingerprint
    return Chooser(corpus=corpus if same else None)


@dataclass(frozen=True)
class Source:
    """A round's source: ``kind`` ``copy``, ``drafter`` or ``alone``, and the copy-match
    ``bucket`` it was chosen in; a copy's ``hint`` as far as the budget allows, from ``where``,
    with its ``odds`` (the survival of its first j tokens), of which the first ``k`` pay to verify
    (a skip rule may commit more)."""

    kind: str
    bucket: int
    hint: np.ndarray | None = None
    odds: np.ndarray | None = None
    k: int = 0
    where: str = "context"


#: a round's source where none was searched
ALONE = Source("alone", 0)


class Chooser:
    """Chooses each lossless round's source from measured costs (``decay``: weight kept by the
    earlier rounds at each new one)."""

    def __init__(self, odds: CopyOdds | None = None, decay: float = 0.98, corpus: Corpus | None = None):
        self.odds = odds if odds is not None else load_odds()
        self.corpus = corpus if self.odds.corpus else None  # hints there only with odds for them
        self.decay = decay
        self._sums = np.zeros(5)  # weight, rows, seconds, rows^2, rows * seconds
        self._version, self._costs = 0, None  # observations so far; (the version fitted at, the costs)
        self._fits = 0  # costs fitted so far: what a kept choice was made with
        # per (source, bucket): copy rounds observed, and the survival made of them, kept
        self._seen_version: dict[tuple[str, int], int] = {}
        self._kept: dict = {}
        self._gates: dict = {}
        self._rows = np.zeros((LONGEST_COPY + 1, 2))  # by rows - 1: weight, seconds
        self._draft: float | None = None
        self._yield = np.zeros((len(self.odds.length_edges) + 1, 2))  # per bucket: weight, accepted
        # what the copy rounds showed, per source and bucket: tokens put to the test and found right
        shape = (len(self.odds.length_edges), self.odds.longest)
        self._copied = {src: (np.zeros(shape), np.zeros(shape)) for src in ("context", "corpus")}
        self._since = np.zeros(len(self.odds.length_edges) + 1, dtype=np.int64)
        self._probes = np.ones(len(self.odds.length_edges) + 1, dtype=np.int64)
        # per sequences in a round: per mode, decayed (rounds, tokens, seconds); the rounds since
        # the other mode was last tried, the rounds left of a trial, the rounds between trials now,
        # the better mode when the trial under way began, and that trial's (tokens, seconds)
        self._modes: dict[int, dict] = {}

    # -- what was measured ----------------------------------------------------------------------
    def observe_round(self, rows: int, seconds: float) -> None:
        """A round that scored ``rows`` positions in ``seconds`` (outside the drafter's calls)."""
        if rows < 1 or not np.isfinite(seconds) or seconds <= 0:
            return
        line = self.costs()
        if line is not None and self._sums[0] >= TRUSTED and seconds > OUTLIER * (line.base + line.per_row * rows):
            return  # a round the machine stalled in (another process, a page fault storm): not what rows cost
        self._sums = self.decay * self._sums + np.array([1.0, rows, seconds, rows * rows, rows * seconds])
        self._version += 1
        # every size's mean fades as rounds pass, measured or not, so that a size the chooser
        # stopped asking for (after a round that cost too much) goes back to the line and is tried again
        self._rows *= ROWS_DECAY
        if rows <= len(self._rows):
            self._rows[rows - 1] += [1.0, seconds]

    def observe_draft(self, seconds: float) -> None:
        """A drafter call's time per sequence it drafted for."""
        if np.isfinite(seconds) and seconds >= 0:
            self._draft = seconds if self._draft is None else self.decay * self._draft + (1 - self.decay) * seconds
            self._version += 1

    def observe_yield(self, bucket: int, accepted: int) -> None:
        """A drafter round chosen in ``bucket`` that accepted ``accepted`` drafted tokens."""
        w = self._yield[bucket]
        self._yield[bucket] = [0.9 * w[0] + 1.0, 0.9 * w[1] + accepted]

    def observe_mode(self, sharing: int, mode: str, tokens: int, seconds: float) -> None:
        """A whole round of ``sharing`` sequences in ``mode`` that committed ``tokens`` in ``seconds``."""
        if sharing <= 1 or not np.isfinite(seconds) or seconds <= 0:
            return
        m = self._mode_state(sharing)
        m["seen"][mode] = MODE_DECAY * m["seen"][mode] + np.array([1.0, tokens, seconds])
        if m["held"] is not None and mode != m["held"]:  # a round of the trial under way
            m["trial_sums"] += (tokens, seconds)

    def batch_mode(self, sharing: int) -> str:
        """How a round of ``sharing`` > 1 sequences drafts: ``hints`` (each sequence's hint
        searched and its source chosen by :meth:`choose`) or ``alone`` (none searched: every
        sequence verifies its own next token), by the tokens per second each measured."""
        if sharing <= 1:  # one sequence: its sources are chosen by the costs of its rows alone
            return MODES[0]
        m = self._mode_state(sharing)
        untried = [k for k in MODES if m["seen"][k][0] < TRIED]
        if untried:
            return untried[0]
        rate = {k: v[1] / v[2] for k, v in m["seen"].items()}
        best = max(MODES, key=lambda k: rate[k])
        if m["trial"] > 0:  # trying the other again (to its end, whichever leads meanwhile)
            m["trial"] -= 1
            return next(k for k in MODES if k != m["held"])
        if m["held"] is not None:  # a trial just ended: its rounds alone were slower, or not
            tokens, seconds = m["trial_sums"]
            lost = best == m["held"] and tokens < rate[best] * seconds
            m["every"] = min(2 * m["every"], RETRY_MOST) if lost else RETRY_EVERY
            m["held"] = None
        if m["since"] >= m["every"]:
            other = next(k for k in MODES if k != best)
            m["since"], m["trial"], m["held"], m["trial_sums"] = 0, TRY_ROUNDS - 1, best, np.zeros(2)
            return other
        m["since"] += 1
        return best

    def _mode_state(self, sharing: int) -> dict:
        if sharing not in self._modes:
            self._modes[sharing] = {"seen": {k: np.zeros(3) for k in MODES}, "since": 0, "trial": 0,
                                    "every": RETRY_EVERY, "held": None, "trial_sums": np.zeros(2)}
        return self._modes[sharing]

    def observe_copy(self, source: Source, accepted: int) -> None:
        """A copy round of ``source`` whose first ``accepted`` tokens were the verifier's."""
        seen, hits = self._copied[source.where]
        seen[source.bucket - 1, : min(accepted + 1, source.k)] += 1
        hits[source.bucket - 1, :accepted] += 1
        key = (source.where, source.bucket)
        self._seen_version[key] = self._seen_version.get(key, 0) + 1

    def survival(self, length: int, where: str) -> np.ndarray:
        """The odds of a hint after a match of ``length`` in ``where``: the shipped fit, as
        :data:`ODDS_WEIGHT` observations of each token, with what this chooser's copy rounds
        showed (a verifier or a task other than the fit's moves them). A fresh array."""
        b = match_bucket(length, self.odds.length_edges)
        key = ("survival", where, b)
        stamp = self._seen_version.get((where, b), 0)
        kept = self._kept.get(key)
        if kept is None or kept[0] != stamp:
            kept = self._kept[key] = (stamp, self._survival(length, where))
        return kept[1].copy()

    def _survival(self, length: int, where: str) -> np.ndarray:
        prior = self.odds.row(length, where)
        b = match_bucket(length, self.odds.length_edges)
        if b == 0:
            return prior
        seen, hits = self._copied[where][0][b - 1], self._copied[where][1][b - 1]
        if not seen[0]:
            return prior.copy()
        cond = prior / np.concatenate([[1.0], np.maximum(prior[:-1], 1e-9)])  # P(j-th right | the ones before)
        return np.cumprod((hits + ODDS_WEIGHT * cond) / (seen + ODDS_WEIGHT))

    def costs(self) -> RoundCosts | None:
        """The fitted costs (None before the first round was measured), refitted once
        :data:`REFIT_EVERY` observations came (at first after each one)."""
        step = min(REFIT_EVERY, 1 + self._version // REFIT_EVERY)
        if self._costs is None or self._version - self._costs[0] >= step or \
                (self._costs[1] is None and self._version != self._costs[0]):
            self._costs = (self._version, self._fit())
            self._fits += 1
        return self._costs[1]

    def _fit(self) -> RoundCosts | None:
        w, x, y, xx, xy = self._sums
        if w <= 0:
            return None
        mx, my = x / w, y / w
        base0 = my / (1 + PRIOR_ROW_RATIO * mx)  # the prior: per_row = ratio * base
        sxx, sxy = xx - w * mx * mx, xy - w * mx * my
        slope = (sxy + PRIOR_WEIGHT * PRIOR_ROW_RATIO * base0) / (max(sxx, 0.0) + PRIOR_WEIGHT)
        slope = max(slope, 0.0)
        base = max(my - slope * mx, 0.05 * my)
        by_rows = tuple(float(s / w) if w >= TRUSTED else None for w, s in self._rows)
        return RoundCosts(base=base, per_row=slope, draft=self._draft, by_rows=by_rows)

    def drafter_yield(self, bucket: int) -> float | None:
        """The drafter's mean accepted tokens in ``bucket``, None while it is still measured."""
        w, a = self._yield[bucket]
        return None if w < EXPLORE * 0.9 else float(a / w)

    # -- the choice -----------------------------------------------------------------------------
    def choose(self, seq: Sequence[int], gamma, sharing: int, limit: int, drafter: bool) -> Source:
        """The source of a round after ``seq`` (``gamma``: the drafter's block length, or a function
        that gives it, asked only where the drafter is weighed; ``sharing``:
        sequences in the round's forward; ``limit``: tokens the budget allows beyond the
        verifier's own; ``drafter``: one is loaded)."""
        gate = self._gate(sharing) if sharing > 1 else None
        hint, length, where = best_hint(seq, self.odds.longest, self.corpus if gate is None or gate[1] else None)
        bucket = match_bucket(length, self.odds.length_edges)
        if gate is not None and bucket < gate[0]:  # a batch's round: no copy that short could pay
            return Source("alone", bucket)
        full = self.survival(length, where)
        survival = full.copy() if len(hint) < full.shape[0] else full
        survival[len(hint):] = 0.0  # a corpus answer that ends sooner
        costs = self.costs()
        if costs is None:  # nothing measured yet: the copy where it is likelier right than not
            k = int(np.sum(survival[: max(0, limit)] >= 0.5))
            return self._source(hint, survival, k, bucket, where, limit) if k else Source("alone", bucket)
        expected = self.drafter_yield(bucket) if drafter else None
        # the drafter is tried in rounds of one sequence: in a batch, the whole batch would wait for it
        if drafter and sharing <= 1 and (expected is None or self._since[bucket] >= PROBE_EVERY * self._probes[bucket]):
            self._since[bucket] = 0
            self._probes[bucket] += expected is not None  # the next probe waits longer
            return Source("drafter", bucket)
        g = (gamma() if callable(gamma) else gamma) if expected is not None else 0  # weighed only where known
        kind, k = self._choice(full, survival, expected, g, costs, sharing, limit, (where, bucket), len(hint))
        self._since[bucket] += kind != "drafter"
        if kind == "copy":
            return self._source(hint, survival, k, bucket, where, limit)
        return Source(kind, bucket)

    def _choice(self, full: np.ndarray, survival: np.ndarray, expected: float | None, g: int, costs: RoundCosts,
                sharing: int, limit: int, key: tuple[str, int], shown: int) -> tuple[str, int]:
        """:func:`choose_source` on ``survival`` (``full``, the odds before a short hint cut them),
        with the copy length of ``full`` kept per source and bucket (``key``) and sharing while
        the costs and that bucket's copy rounds stay as they were. It is the same wherever it
        lies within the hint's ``shown`` tokens and the ``limit``: a shorter hint or budget only
        cuts longer lengths, whose value then falls."""
        stamp = (self._fits, self._seen_version.get(key, 0))
        kept = self._kept.get(("k", key, sharing))
        if kept is None or kept[0] != stamp:
            k = copy_length(full, costs, sharing)
            kept = self._kept[("k", key, sharing)] = (stamp, k, copy_value(full, k, costs, sharing))
        _, k, value = kept
        if k > min(shown, limit):  # cut by the hint's end or the budget: chosen afresh
            return choose_source(survival, expected, g, costs, sharing, limit)
        if expected is not None and g > 0 and costs.draft is not None \
                and drafter_value(expected, g, costs, sharing) > value:
            return "drafter", g
        return ("copy", k) if k else ("alone", 0)

    def _gate(self, sharing: int) -> tuple[int, bool] | None:
        """In a round of ``sharing`` sequences, where a copy could pay at all by the shipped odds
        (a margin above them): the least bucket of the sequence's own matches, and whether any
        of the corpus's; None before costs are measured. Spares a batch the search of every
        sequence's hints where none would be taken (the search costs each round, per sequence)."""
        costs = self.costs()
        if costs is None:
            return None
        key = (self._version // GATE_EVERY, sharing)  # the costs drift slowly: refreshed every few rounds
        if self._gates.get("key") != key:
            def pays(rows) -> list[bool]:
                return [copy_length(np.minimum(1.0, GATE_MARGIN * np.asarray(r)), costs, sharing) > 0 for r in rows]

            context = pays(self.odds.survival)
            least = next((b + 1 for b, ok in enumerate(context) if ok), len(context) + 1)
            self._gates = {"key": key, "gate": (least, any(pays(self.odds.corpus)) if self.corpus else False)}
        return self._gates["gate"]

    @staticmethod
    def _source(hint: np.ndarray, survival: np.ndarray, k: int, bucket: int, where: str, limit: int) -> Source:
        n = max(k, min(len(hint), limit))
        return Source("copy", bucket, hint[:n].astype(np.int64), survival[:n].astype(np.float32), k, where)
