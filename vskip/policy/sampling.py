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
The chance of accepting a drafted token is the verifier's probability of it, p(x̂), rather than
the min(1, p/q) of speculative sampling (see docs/sampling.md for why, and when that rule would
be exact with our drafters).

Pure numpy, like the rest of the policy.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ..defaults import MAX_SEED


@dataclass(frozen=True)
class Sampling:
    """``temperature`` (0: greedy), ``top_p`` in (0, 1], ``top_k`` (0: no cut; named
    ``--sample-top-k`` on the command line, apart from top-k *acceptance*), ``seed``."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int = 0

    def __post_init__(self):
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            raise ValueError(f"--temperature must be a finite number >= 0, got {self.temperature}")
        if not (math.isfinite(self.top_p) and 0.0 < self.top_p <= 1.0):
            raise ValueError(f"--top-p must lie in (0, 1], got {self.top_p}")
        if isinstance(self.top_k, bool) or int(self.top_k) != self.top_k or self.top_k < 0:
            raise ValueError(f"--sample-top-k must be an integer >= 0, got {self.top_k}")
        if isinstance(self.seed, bool) or int(self.seed) != self.seed or not 0 <= self.seed <= MAX_SEED:
            raise ValueError(f"--seed must be an integer in 0..{MAX_SEED}, got {self.seed}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def uniforms(self, key: int, start: int, n: int) -> np.ndarray:
        """``u_t`` for the generated positions ``start .. start + n - 1`` of the prompt ``key``
        (:func:`prompt_key`): uniform in [0, 1), each a function of (seed, key, t) alone."""
        out = np.empty(n, dtype=np.float64)
        for i in range(n):
            bits = np.random.SeedSequence([self.seed, key, start + i]).generate_state(1, np.uint64)[0]
            out[i] = float(int(bits) >> 11) * 2.0**-53
        return out


@dataclass(frozen=True)
class Draw:
    """What a verifier needs to sample instead of taking its argmax: the settings and one
    uniform number per scored position (the block's positions and the one after it)."""

    sampling: Sampling
    u: np.ndarray


def prompt_key(task_id: str | None, prompt: Sequence[int], sample: int = 0) -> int:
    """A stable 64-bit key of one sample of a prompt: its task id when it has one, else its token
    ids, and the sample's index (``--samples-per-prompt``; 0 keeps the prompt's own key)."""
    text = task_id if task_id is not None else ",".join(str(int(t)) for t in prompt)
    if sample:
        text += f"\x00sample {int(sample)}"
    return int.from_bytes(hashlib.sha256(text.encode("utf-8")).digest()[:8], "little")
