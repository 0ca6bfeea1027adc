"""A fake drafter/verifier pair on a tiny vocabulary: every loop test runs in milliseconds.

The fake verifier is a deterministic "language model": its logits after a sequence depend on the
last two tokens through a seeded generator. The fake drafter proposes the verifier's own greedy
continuation, corrupting each position with probability ``error`` (seeded by the sequence length),
and gives high confidence to correct tokens and lower confidence to corrupted ones.
"""

from __future__ import annotations

import numpy as np

from vskip.engine.models.protocols import DRAFT_FEATURES, DraftBlock
from vskip.engine.policy import Verdict
from vskip.engine.policy.sampling import speculative_draws

V = 50
EOS = 0
SPECIAL = 1


def fake_logits(seq) -> np.ndarray:
    a = seq[-1] if len(seq) else 0
    b = seq[-2] if len(seq) > 1 else 0
    rng = np.random.default_rng(1000 * a + b)
    z = rng.normal(size=V)
    z[SPECIAL] = -10.0
    z[EOS] = -10.0 if len(seq) < 40 else z.max() + 1.0  # sequences end after ~40 tokens
    return z


def warp(z: np.ndarray, s) -> np.ndarray:
    """The fake verifier's sampling distribution for logits ``z`` under settings ``s``: written
    here from the definitions (temperature, then the top_k largest, then the smallest set of
    mass top_p), independently of :mod:`vskip.engine.models.sampling`."""
    z = np.asarray(z, np.float64) / s.temperature
    if 0 < s.top_k < len(z):
        z = np.where(z >= np.sort(z)[-s.top_k], z, -np.inf)
    p = np.exp(z - z.max())
    p /= p.sum()
    if s.top_p < 1.0:
        keep = np.zeros(len(p), bool)
        mass = 0.0
        for i in np.argsort(-p, kind="stable"):
            keep[i] = True
            mass += p[i]
            if mass >= s.top_p:
                break
        p = np.where(keep, p, 0.0)
        p /= p.sum()
    return p


def inverse_cdf(p: np.ndarray, u: float) -> int:
    """The first id whose cumulative probability exceeds u (of the total)."""
    c = np.cumsum(p)
    return int(min(np.searchsorted(c, u * c[-1], side="right"), np.flatnonzero(p)[-1]))


class FakeVerifier:
    eos_ids = frozenset({EOS})
    special_ids = frozenset({SPECIAL})
    max_length = 10_000

    def __init__(self):
        self.calls = 0
        self.shadow_calls = 0

    def score(self, seq, block, shadow=False, draw=None):
        self.calls += not shadow
        self.shadow_calls += shadow
        seq = list(seq)
        block = [int(t) for t in block]
        zs = [fake_logits(seq + block[:j]) for j in range(len(block) + 1)]
        if draw is not None and draw.speculative:
            p = np.array([warp(z, draw.sampling) for z in zs])
            return Verdict(speculative_draws(p, draw), np.full(len(block), np.nan), np.zeros(len(block), np.int64))
        if draw is not None and not draw.sampling.greedy:
            drawn = [inverse_cdf(warp(z, draw.sampling), u) for z, u in zip(zs, draw.u)]
            return Verdict(np.array(drawn, np.int64), np.full(len(block), np.nan), np.zeros(len(block), np.int64))
        argmax = np.array([int(np.argmax(z)) for z in zs])
        gap = np.array([zs[j][t] - zs[j].max() for j, t in enumerate(block)])
        rank = np.array([int((zs[j] > zs[j][t]).sum()) for j, t in enumerate(block)], dtype=np.int64)
        return Verdict(argmax, gap.reshape(len(block)), rank.reshape(len(block)))

    def greedy(self, seq, n):
        seq = list(seq)
        out = []
        for _ in range(n):
            t = int(np.argmax(fake_logits(seq)))
            seq.append(t)
            out.append(t)
            if t == EOS:
                break
        return out

    def warmup(self, seq, gamma):
        pass

    def reset(self):
        pass


class FakeDrafter:
    def __init__(self, error: float = 0.2, seed: int = 0, special_at: int | None = None):
        self.error = error
        self.seed = seed
        self.special_at = special_at
        self.blocks = 0
        self.gammas: list[int] = []

    def match_length(self, seq):
        """A deterministic stand-in for a copy hint's match length: 0..11 as the sequence grows."""
        return len(seq) % 12

    def propose(self, seq, gamma, features=False, draw=None):
        self.blocks += 1
        self.gammas.append(gamma)
        rng = np.random.default_rng(self.seed * 7919 + len(seq))
        if draw is not None:
            return self._sampled(list(seq), gamma, draw, rng)
        s = list(seq)
        toks, conf = [], []
        for j in range(gamma):
            t = int(np.argmax(fake_logits(s)))
            if rng.random() < self.error:
                t = int(rng.integers(2, V))
                c = rng.uniform(0.3, 0.95)
            else:
                c = rng.uniform(0.85, 1.0)
            if self.special_at is not None and j == self.special_at:
                t = SPECIAL
            toks.append(t)
            conf.append(c)
            s.append(t)
        feats = np.zeros((gamma, len(DRAFT_FEATURES)), np.float32) if features else None
        if features:
            feats[:, 4] = conf
        hidden = np.zeros((gamma, 4), np.float32) if features else None
        return DraftBlock(np.array(toks, np.int64), np.array(conf, np.float32), feats, hidden)

    def _sampled(self, seq, gamma, draw, rng):
        """A sampled block drafted "in one forward": position j's distribution is the verifier's
        after the context and its *greedy* continuation of j - 1 tokens, its logits blurred by
        noise of scale ``3 * error``; it depends on the context alone, never on the tokens drawn
        at other positions. Each token is drawn from it by inverse CDF with ``draw.u``."""
        s, q = list(seq), []
        for _ in range(gamma):
            z = fake_logits(s)
            q.append(warp(z + 3 * self.error * rng.normal(size=V), draw.sampling))
            s.append(int(np.argmax(z)))
        toks = [inverse_cdf(row, u) for row, u in zip(q, draw.u)]
        return DraftBlock(np.array(toks, np.int64), np.array([row.max() for row in q], np.float32), q=np.array(q))

    def warmup(self, seq, gamma):
        pass

    def reset(self):
        pass


class StubPredictor:
    """Scores each position with its raw confidence squashed: stands in for a trained MLP."""

    def __init__(self, power: float = 1.0):
        self.power = power
        self.calls = 0

    def scores(self, block, features, task_id=None):
        self.calls += 1
        assert features.shape == (block.gamma, 19), features.shape
        return np.asarray(block.confidence, np.float64) ** self.power


def trace_run(path, n: int, policy=None, predictor=None, gamma: int = 8, max_new_tokens: int = 40) -> dict:
    """A trace run directory of ``n`` HumanEval-named prompts decoded by the fake pair (Strict SDD
    unless ``policy`` is given), as `vskip run --trace` writes it; returns {task id: prompt}."""
    import json
    from pathlib import Path

    from vskip.engine.decode import DecodeConfig, decode
    from vskip.engine.policy import PolicyConfig
    from vskip.study.traces import append_traces

    policy = policy or PolicyConfig(name="strict")
    path = Path(path)
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps({"run": {"decode": {"gamma": gamma},
                                                          "policy": {"name": policy.name}}}))
    cfg = DecodeConfig(gamma=gamma, max_new_tokens=max_new_tokens, trace=True, task="humaneval")
    prompts = {f"HumanEval/{i}": [5 + i, 3 + 2 * i, 9, 4] for i in range(n)}
    for tid, prompt in prompts.items():
        res = decode(prompt, FakeDrafter(0.2, int(tid.split("/")[1])), FakeVerifier(), policy, cfg, predictor,
                     task_id=tid)
        append_traces(path, tid, res.traces)
    return prompts
