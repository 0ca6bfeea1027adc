"""Sampling settings and the random numbers of a sampled decode.

At temperature 0 every decode is greedy, as in the paper. Above it the verifier *samples*: its
logits are divided by the temperature, cut to the ``top_k`` largest and then to the smallest set
of mass ``top_p`` (the order of transformers' warpers), and its token at a position is drawn by
inverse CDF (in token-id order) from one uniform number.

That number belongs to the *output position*, not to a stream: ``u_t`` is a function of the
seed, the prompt's key and the index ``t`` of the generated token (:meth:`Sampling.uniforms`).
So a resumed run draws what an unbroken one draws, and the loop's acceptance rule for sampling is
the same as for greedy decoding: a verified round compares the drafted tokens with the verifier's
own draws at those positions (made with ``u_t``) and commits the agreeing prefix and the
verifier's draw after it. Every committed token is then the verifier's own draw given the
committed prefix, exactly as ``ar`` draws it: Strict SDD is lossless in distribution for any
drafter (and, with the same seed, commits the same tokens as ``ar`` up to floating-point ties).
The chance of accepting a drafted token is the verifier's probability of it, p(x̂).

With ``speculative=True`` the drafter samples its draft instead, and a verified round uses the
standard rule of speculative sampling (:func:`speculative_draws`): accept with min(1, p/q),
resample from the residual. It accepts more (1 - TV(p, q) instead of p(x̂)) when the drafter's
distribution resembles the verifier's, and it is exact only when each position's q depends on the
context alone (docs/sampling.md); the tokens are then no longer ``ar``'s tokens for the same seed,
only distributed as them.

Pure numpy, like the rest of the policy.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ...defaults import MAX_SEED

#: the random-number streams of a position (:meth:`Sampling.uniforms`)
VERIFIER, DRAFTER, ACCEPT = 0, 1, 2


@dataclass(frozen=True)
class Sampling:
    """``temperature`` (0: greedy), ``top_p`` in (0, 1], ``top_k`` (0: no cut; named
    ``--sample-top-k`` on the command line, apart from top-k *acceptance*), ``seed``."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int = 0
    #: the drafter *samples* its draft from its own warped distribution q and a verified round
    #: accepts a drafted token x with probability min(1, p(x)/q(x)), resampling from the residual
    #: on rejection (``--speculative-sampling``); False: the drafter proposes its argmax and a
    #: round keeps the drafted tokens that equal the verifier's own draws
    speculative: bool = False

    def __post_init__(self):
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            raise ValueError(f"--temperature must be a finite number >= 0, got {self.temperature}")
        if not (math.isfinite(self.top_p) and 0.0 < self.top_p <= 1.0):
            raise ValueError(f"--top-p must lie in (0, 1], got {self.top_p}")
        if isinstance(self.top_k, bool) or int(self.top_k) != self.top_k or self.top_k < 0:
            raise ValueError(f"--sample-top-k must be an integer >= 0, got {self.top_k}")
        if isinstance(self.seed, bool) or int(self.seed) != self.seed or not 0 <= self.seed <= MAX_SEED:
            raise ValueError(f"--seed must be an integer in 0..{MAX_SEED}, got {self.seed}")
        if self.speculative and self.greedy:
            raise ValueError("--speculative-sampling needs --temperature above 0")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def uniforms(self, key: int, start: int, n: int, stream: int = VERIFIER) -> np.ndarray:
        """``u_t`` for the generated positions ``start .. start + n - 1`` of the prompt ``key``
        (:func:`prompt_key`): uniform in [0, 1), each a function of (seed, key, t, stream) alone.
        Streams: :data:`VERIFIER` (the verifier's draws), :data:`DRAFTER` (a sampled draft),
        :data:`ACCEPT` (the min(1, p/q) coin)."""
        out = np.empty(n, dtype=np.float64)
        for i in range(n):
            entropy = [self.seed, key, start + i] + ([stream] if stream else [])
            bits = np.random.SeedSequence(entropy).generate_state(1, np.uint64)[0]
            out[i] = float(int(bits) >> 11) * 2.0**-53
        return out


@dataclass(frozen=True)
class Draw:
    """The random numbers of one sampled judgement: the settings and one uniform number per
    position (for a verified block: its positions and the one after it).

    For the speculative rule also the drafted ``tokens``, the distributions ``q`` [n, V] the
    drafter drew them from, and the acceptance coins ``u_accept`` [n]."""

    sampling: Sampling
    u: np.ndarray
    tokens: np.ndarray | None = None
    q: np.ndarray | None = None
    u_accept: np.ndarray | None = None

    @property
    def speculative(self) -> bool:
        return self.q is not None


def inverse_cdf(p: np.ndarray, u: float) -> int:
    """The first id whose cumulative probability exceeds ``u`` times the total (never an id
    without mass)."""
    c = np.cumsum(p)
    return int(min(np.searchsorted(c, u * c[-1], side="right"), np.flatnonzero(p)[-1]))


def tie_margin(p: np.ndarray, u: float, a: int, b: int) -> float:
    """How far ``u`` lies, as a share of ``p``'s mass, from a draw that could be ``a`` or ``b`` by
    :func:`inverse_cdf`: the larger of its distances from the two ids' intervals of the cumulative
    sum. Two forwards that drew a and b with the same ``u`` are a floating-point tie when it is of
    the order of their rounding of that sum; a large one means that they did not compute one
    distribution."""
    if a == b:
        raise ValueError("a tie needs two different tokens")
    c = np.cumsum(np.asarray(p, dtype=np.float64))
    x = u * c[-1]

    def away(t: int) -> float:  # from [c[t - 1], c[t]), the values of u * total that draw t
        return max((c[t - 1] if t > 0 else 0.0) - x, x - c[t], 0.0)

    return float(max(away(a), away(b)) / c[-1])


def draw_rows(p: np.ndarray, u: np.ndarray) -> np.ndarray:
    """The token of each row of ``p`` [n, V] (probabilities, warped) drawn with its uniform number
    ``u`` [n] by :func:`inverse_cdf`: a verifier's draws, or a drafter's sampled block."""
    p = np.asarray(p, dtype=np.float64)
    assert p.ndim == 2 and p.shape[0] == len(u), (p.shape, len(u))
    return np.array([inverse_cdf(row, float(x)) for row, x in zip(p, u)], dtype=np.int64)


def speculative_draws(p: np.ndarray, draw: Draw) -> np.ndarray:
    """The tokens a verified round commits under speculative sampling, as a verdict's tokens
    [n + 1] (the agreeing prefix of ``draw.tokens`` is what it accepts; -1 between a rejection and the
    bonus position, which no rule reads).

    ``p`` [n + 1, V]: the verifier's warped distributions at the block's positions and after it.
    Position i keeps the drafted x_i when ``u_accept_i < p_i(x_i) / q_i(x_i)`` (probability
    min(1, p/q)); at the first rejection it draws from the residual max(0, p_i - q_i), normalised
    (which has no mass at x_i, so the prefix stops there); after a whole block, the bonus token is
    drawn from p_n. Each committed token is then distributed as the verifier's own draw given the
    committed prefix, provided x_i was drawn from q_i and q_i depends on the context alone (a
    drafter that drafts its block in one forward)."""
    tokens, q, ua = np.asarray(draw.tokens), np.asarray(draw.q, np.float64), np.asarray(draw.u_accept)
    n = len(tokens)
    assert p.shape[0] == n + 1 and q.shape[0] == n, (p.shape, q.shape, n)
    V = max(p.shape[1], q.shape[1])  # a head narrower than the other model's vocabulary: no mass there
    if p.shape[1] < V or q.shape[1] < V:
        p = np.pad(p, ((0, 0), (0, V - p.shape[1])))
        q = np.pad(q, ((0, 0), (0, V - q.shape[1])))
    out = np.full(n + 1, -1, dtype=np.int64)  # positions between a rejection and n are never read
    out[n] = inverse_cdf(p[n], draw.u[n])  # the bonus token, read when the whole block is kept
    for i, x in enumerate(tokens):
        x = int(x)
        qx = q[i, x] / q[i].sum()
        px = p[i, x] / p[i].sum()
        if qx > 0 and ua[i] * qx < px:
            out[i] = x
            continue
        residual = np.maximum(p[i] / p[i].sum() - q[i] / q[i].sum(), 0.0)
        residual[x] = 0.0
        out[i] = inverse_cdf(residual, draw.u[i]) if residual.sum() > 0 else inverse_cdf(p[i], draw.u[i])
        break
    return out


def prompt_key(task_id: str | None, prompt: Sequence[int], sample: int = 0) -> int:
    """A stable 64-bit key of one sample of a prompt: its task id when it has one, else its token
    ids, and the sample's index (``--samples-per-prompt``; 0 keeps the prompt's own key)."""
    text = task_id if task_id is not None else ",".join(str(int(t)) for t in prompt)
    if sample:
        text += f"\x00sample {int(sample)}"
    return int.from_bytes(hashlib.sha256(text.encode("utf-8")).digest()[:8], "little")
