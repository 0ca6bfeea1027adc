"""A fake drafter/verifier pair on a tiny vocabulary: every loop test runs in milliseconds.

The fake verifier is a deterministic "language model": its logits after a sequence depend on the
last two tokens through a seeded generator. The fake drafter proposes the verifier's own greedy
continuation, corrupting each position with probability ``error`` (seeded by the sequence length),
and gives high confidence to correct tokens and lower confidence to corrupted ones.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from vskip.engine.models.protocols import DRAFT_FEATURES, DraftBlock
from vskip.engine.policy import Verdict

V = 50
EOS = 0
SPECIAL = 1


def fake_logits(seq) -> np.ndarray:
    a = seq[-1] if len(seq) else 0
    b = seq[-2] if len(seq) > 1 else 0
    return _logits(int(a), int(b), len(seq) >= 40).copy()


@lru_cache(maxsize=None)
def _logits(a: int, b: int, late: bool) -> np.ndarray:
    rng = np.random.default_rng(1000 * a + b)
    z = rng.normal(size=V)
    z[SPECIAL] = -10.0
    z[EOS] = z.max() + 1.0 if late else -10.0  # sequences end after ~40 tokens
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
    use_cache = True

    def __init__(self):
        self.calls = 0
        self.shadow_calls = 0

    def _count(self, shadow):
        self.calls += not shadow
        self.shadow_calls += shadow

    def score(self, seq, block, shadow=False):
        self._count(shadow)
        seq = list(seq)
        block = [int(t) for t in block]
        zs = [fake_logits(seq + block[:j]) for j in range(len(block) + 1)]
        argmax = np.array([int(np.argmax(z)) for z in zs])
        gap = np.array([zs[j][t] - zs[j].max() for j, t in enumerate(block)])
        rank = np.array([int((zs[j] > zs[j][t]).sum()) for j, t in enumerate(block)], dtype=np.int64)
        return Verdict(argmax, gap.reshape(len(block)), rank.reshape(len(block)))

    def distributions(self, seq, block, sampling, shadow=False):
        self._count(shadow)
        seq, block = list(seq), [int(t) for t in block]
        return np.array([warp(fake_logits(seq + block[:j]), sampling) for j in range(len(block) + 1)])

    def score_many(self, calls):
        return [self.score(c.seq, c.block, c.shadow) for c in calls]

    def distributions_many(self, calls, sampling):
        return [self.distributions(c.seq, c.block, sampling, c.shadow) for c in calls]

    def open_slots(self, n):
        pass

    def prefill(self, ids, slot=0):
        self.prefilled = getattr(self, "prefilled", []) + [(slot, len(ids))]

    def set_cache(self, on):
        self.use_cache = on

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

    def reset(self, slot=None):
        pass


class FakeDrafter:
    max_gamma = None
    steps = 1
    reads_verifier = False

    def __init__(self, error: float = 0.2, seed: int = 0, special_at: int | None = None):
        self.error = error
        self.seed = seed
        self.special_at = special_at
        self.blocks = 0
        self.gammas: list[int] = []

    def match_length(self, seq):
        """A deterministic stand-in for a copy hint's match length: 0..11 as the sequence grows."""
        return len(seq) % 12

    def propose_many(self, requests, features=False, sampling=None):
        return [self.propose(seq, g, features, sampling, slot) for slot, seq, g in requests]

    def with_steps(self, steps):
        if steps != 1:
            raise ValueError("the fake drafter drafts in one forward")
        return self

    def propose(self, seq, gamma, features=False, sampling=None, slot=0):
        self.blocks += 1
        self.gammas.append(gamma)
        rng = np.random.default_rng(self.seed * 7919 + len(seq))
        if sampling is not None:
            return self._sampled(list(seq), gamma, sampling, rng)
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

    def _sampled(self, seq, gamma, sampling, rng):
        """A block's distributions drafted "in one forward": position j's is the verifier's after
        the context and its *greedy* continuation of j - 1 tokens, its logits blurred by noise of
        scale ``3 * error``; it depends on the context alone, never on the tokens drawn at other
        positions. The tokens returned are each row's argmax: the loop draws the real ones."""
        s, q = list(seq), []
        for _ in range(gamma):
            z = fake_logits(s)
            q.append(warp(z + 3 * self.error * rng.normal(size=V), sampling))
            s.append(int(np.argmax(z)))
        q = np.array(q)
        return DraftBlock(q.argmax(-1).astype(np.int64), q.max(-1).astype(np.float32), q=q)

    def warmup(self, seq, gamma):
        pass

    def reset(self, slot=None):
        pass

    def prefill(self, ids, slot=0):
        self.prefilled = getattr(self, "prefilled", []) + [(slot, len(ids))]


class StubPredictor:
    """Scores each position with its raw confidence squashed: stands in for a trained MLP."""

    kind = "marginal"
    online = None

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


class FakeTokenizer:
    """Text for the fake vocabulary: token t (2..49) is one character of ``CHARS``; EOS and the
    special token decode to nothing (skip_special_tokens). The chat template joins the messages'
    contents, so a chat and a completion of the same text give the same ids."""

    CHARS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUV"
    chat_template = "contents joined"

    def __len__(self):
        return V

    def __call__(self, text, add_special_tokens=True):
        try:
            return {"input_ids": [self.CHARS.index(c) + 2 for c in text]}
        except ValueError:
            raise ValueError(f"the fake tokenizer reads only {self.CHARS!r}") from None

    def decode(self, ids, skip_special_tokens=False):
        return "".join(self.CHARS[t - 2] if t >= 2 else ("" if skip_special_tokens else "<%d>" % t) for t in ids)

    def apply_chat_template(self, messages, add_generation_prompt=True, tokenize=False, **kw):
        return "".join(m["content"] for m in messages)


class Oracle:
    """A drafter that proposes a reference continuation ``ref`` (the tokens after the first ``n0``)
    with seeded corruptions: each drafted token is replaced, with probability ``error``, by a random
    id in ``vocab``; past the reference it proposes ``filler``. Long acceptances and skips on a
    real verifier, whatever a trained drafter's quality."""

    max_gamma, steps, reads_verifier = None, 1, False

    def __init__(self, n0, ref, error, seed=0, filler=198, vocab=(100, 40000)):
        self.n0, self.ref, self.error, self.seed, self.filler, self.vocab = n0, ref, error, seed, filler, vocab

    def propose(self, seq, gamma, features=False, sampling=None, slot=0):
        from vskip.engine.models.protocols import DraftBlock

        rng = np.random.default_rng(self.seed + len(seq))
        g = len(seq) - self.n0
        toks = np.array((list(self.ref[g: g + gamma]) + [self.filler] * gamma)[:gamma], np.int64)
        bad = rng.random(gamma) < self.error
        toks[bad] = rng.integers(*self.vocab, bad.sum())
        return DraftBlock(toks, np.where(bad, 0.5, 0.99).astype(np.float32))

    def propose_many(self, requests, features=False, sampling=None):
        return [self.propose(seq, g, features, sampling, slot) for slot, seq, g in requests]

    def warmup(self, seq, gamma):
        pass

    def reset(self, slot=None):
        pass

    def prefill(self, ids, slot=0):
        pass

    def match_length(self, seq):
        return 0
