"""Sampling: the verifier's warped distribution, the position-indexed random numbers, and Strict
SDD exact in distribution (a test that the wrong rule fails)."""

from __future__ import annotations

import itertools
import math
from dataclasses import replace

import numpy as np
import pytest
import torch
from fakes import FakeDrafter, FakeVerifier, V, fake_logits, inverse_cdf, warp
from hypothesis import given, settings
from hypothesis import strategies as st

from vskip.engine.decode import DecodeConfig, decode
from vskip.engine.models.sampling import warped_probs
from vskip.engine.policy import RULE, Draw, PolicyConfig, Rule, Sampling, Verdict, draw_rows, drawn_verdict, prompt_key

PROMPT = [5, 6, 7]


def _chi2_critical(df: int, alpha: float = 1e-3) -> float:
    """Upper ``alpha`` point of chi-square (Wilson-Hilferty; z = 3.090 for 1e-3)."""
    z = {1e-3: 3.090}[alpha]
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


def _exact(s: Sampling, n: int) -> dict[tuple, float]:
    """The verifier's exact distribution of every continuation of ``n`` tokens after PROMPT."""
    out = {}

    def walk(seq, p):
        if len(seq) == len(PROMPT) + n:
            out[tuple(seq[len(PROMPT):])] = p
            return
        q = warp(fake_logits(seq), s)
        for t in np.flatnonzero(q):
            walk(seq + [int(t)], p * q[t])

    walk(list(PROMPT), 1.0)
    return out


class AcceptEverything(Rule):
    """The deliberately wrong rule: every drafted token is accepted, and only the bonus token is
    the verifier's own draw."""

    def accept(self, cfg, draft, verdict):
        return len(draft)


def _samples(rule: Rule, policy: str, s: Sampling, n_tokens: int, seeds: range, drafter_error: float = 0.0):
    counts: dict[tuple, int] = {}
    for seed in seeds:
        cfg = DecodeConfig(gamma=4, max_new_tokens=n_tokens, sampling=replace(s, seed=seed))
        drafter = None if policy == "ar" else FakeDrafter(error=drafter_error, seed=seed)
        out = tuple(decode(PROMPT, drafter, FakeVerifier(), PolicyConfig(name=policy), cfg, task_id="t",
                           rule=rule).tokens)
        counts[out] = counts.get(out, 0) + 1
    return counts


def _chi2(counts: dict, exact: dict) -> tuple[float, int]:
    n = sum(counts.values())
    if not set(counts) <= set(exact):  # a continuation the verifier never samples
        return math.inf, len(exact) - 1
    stat = sum((counts.get(k, 0) - n * p) ** 2 / (n * p) for k, p in exact.items())
    return stat, len(exact) - 1


@pytest.mark.parametrize("drafter_error", [0.0, 0.5])
def test_strict_sdd_samples_the_verifiers_distribution_exactly(drafter_error):
    """3-token continuations under temperature 1 and top-4 (64 of them, enumerated exactly):
    Strict SDD with a drafter biased to the verifier's argmax matches the exact distribution by
    chi-square at 1e-3 over 2000 seeds; the accept-everything rule is rejected by a wide margin."""
    s = Sampling(temperature=1.0, top_k=4)
    exact = _exact(s, 3)
    assert len(exact) == 64 and abs(sum(exact.values()) - 1) < 1e-12
    stat, df = _chi2(_samples(RULE, "strict", s, 3, range(2000), drafter_error), exact)
    assert stat < _chi2_critical(df), (stat, df)
    wrong = _samples(AcceptEverything(), "strict", s, 3, range(2000), drafter_error)
    stat_w, _ = _chi2(wrong, exact)
    assert stat_w > 10 * _chi2_critical(df), stat_w


class ResampleFromP(Rule):
    """A wrong speculative rule, the classic mistake: accept with min(1, p/q), but on rejection
    draw afresh from p instead of from the residual max(0, p - q)."""

    def verdict(self, p, draw):
        if draw is None or not draw.speculative:
            return super().verdict(p, draw)
        out = draw_rows(p, draw.u)  # plain draws from p everywhere
        for i, x in enumerate(draw.tokens):
            if draw.u_accept[i] * draw.q[i][x] >= p[i][x]:
                break  # rejected: the plain draw from p stays at i
            out[i] = x
        return drawn_verdict(out)


@pytest.mark.parametrize("drafter_error", [0.0, 0.2])
def test_the_speculative_rule_samples_the_verifiers_distribution_exactly(drafter_error):
    """The standard rule (the drafter samples from its own q, min(1, p/q), the residual on
    rejection) with a drafter whose q depends on the context alone: the same 64 continuations,
    2000 seeds, chi-square at 1e-3; resampling from p instead of the residual is rejected."""
    s = Sampling(temperature=1.0, top_k=4, speculative=True)
    exact = _exact(s, 3)
    stat, df = _chi2(_samples(RULE, "strict", s, 3, range(2000), drafter_error), exact)
    assert stat < _chi2_critical(df), (stat, df)
    stat_w, _ = _chi2(_samples(ResampleFromP(), "strict", s, 3, range(2000), drafter_error), exact)
    assert stat_w > _chi2_critical(df), stat_w  # 206 and 165 here (a drafter far from p hides it: at 0.5, 72)
    stat_e, _ = _chi2(_samples(AcceptEverything(), "strict", s, 3, range(2000), drafter_error), exact)
    assert stat_e > 10 * _chi2_critical(df), stat_e


def test_the_speculative_rule_accepts_more_and_reproduces_across_a_resume_of_its_positions():
    """At temperature 1 a sampled draft whose first position is the verifier's own distribution
    is accepted there whenever it is drawn (min(1, p/q) = 1), where the argmax draft is kept with
    probability p(argmax) only: more tokens per call over the same seeds. The same seed gives the
    same text; the rule's text differs from ar's (only its distribution is the same)."""
    v = FakeVerifier()
    per_call = {False: [], True: []}
    for seed in range(30):
        for spec in (False, True):
            s = Sampling(temperature=1.0, seed=seed, speculative=spec)
            r = decode(PROMPT, FakeDrafter(0.0, seed=seed), v, PolicyConfig(name="strict"),
                       DecodeConfig(gamma=4, max_new_tokens=30, sampling=s), task_id="m")
            per_call[spec].append(len(r.tokens) / r.verifier_calls)
            if spec:
                again = decode(PROMPT, FakeDrafter(0.0, seed=seed), v, PolicyConfig(name="strict"),
                               DecodeConfig(gamma=4, max_new_tokens=30, sampling=s), task_id="m")
                assert again.tokens == r.tokens
    assert np.mean(per_call[True]) > 1.2 * np.mean(per_call[False]), per_call


def test_speculative_draws_follow_the_rule_position_by_position():
    """speculative_draws on hand-made rows: kept while u * q(x) < p(x); at the first rejection a
    token of the residual (never the rejected one); the bonus from p after a whole block."""
    from vskip.engine.policy.sampling import speculative_draws

    p = np.array([[0.5, 0.5, 0.0], [0.2, 0.3, 0.5], [0.0, 0.0, 1.0]])
    q = np.array([[0.25, 0.75, 0.0], [0.0, 1.0, 0.0]])
    s = Sampling(temperature=1.0)
    def run(ua, u=(0.1, 0.1, 0.1)):
        return speculative_draws(p, Draw(s, np.array(u), tokens=np.array([1, 1]), q=q, u_accept=np.array(ua))).tolist()
    assert run([0.5, 0.2]) == [1, 1, 2]          # 0.5 * 0.75 < 0.5, 0.2 * 1.0 < 0.3: both kept, bonus 2
    assert run([0.9, 0.0])[0] == 0               # 0.9 * 0.75 >= 0.5: rejected; the residual is token 0 only
    out = run([0.5, 0.9], u=(0.1, 0.99, 0.1))    # kept, then rejected: residual (0.2, 0, 0.5) / 0.7
    assert out[:2] == [1, 2]
    assert run([0.5, 0.9], u=(0.1, 0.0, 0.1))[1] == 0


def test_strict_sdd_commits_what_ar_draws_with_the_same_seed():
    """The random number of a generated position is the same in both loops, so Strict SDD (every
    block shape, trimmed or not) commits ar's tokens, and a seed changes them."""
    v = FakeVerifier()
    outs = set()
    for seed, (gamma, trim, gmax) in itertools.product(range(6), [(4, None, None), (8, 0.9, None), (3, None, 9)]):
        s = Sampling(temperature=0.8, top_p=0.9, seed=seed)
        ar = decode(PROMPT, None, v, PolicyConfig(name="ar"), DecodeConfig(gamma=1, max_new_tokens=45, sampling=s), task_id="a")
        cfg = DecodeConfig(gamma=gamma, max_new_tokens=45, sampling=s, trim=trim, gamma_max=gmax, min_match=3)
        sdd = decode(PROMPT, FakeDrafter(0.3, seed=seed), v, PolicyConfig(name="strict"), cfg, task_id="a")
        assert sdd.tokens == ar.tokens
        assert sdd.verifier_calls < ar.verifier_calls
        outs.add(tuple(ar.tokens))
    assert len(outs) == 6


def test_temperature_zero_is_greedy_and_calls_no_draw():
    calls, draws = [], []

    class Spy(FakeVerifier):
        def distributions(self, seq, block, sampling, shadow=False):
            calls.append(sampling)
            return super().distributions(seq, block, sampling, shadow)

    class SpyRule(Rule):
        def verdict(self, scores, draw):
            draws.append(draw)
            return super().verdict(scores, draw)

    r = decode(PROMPT, FakeDrafter(0.2), Spy(), PolicyConfig(name="strict"), DecodeConfig(gamma=4, max_new_tokens=20),
               rule=SpyRule())
    assert draws and all(d is None for d in draws) and not calls
    assert r.tokens == FakeVerifier().greedy(PROMPT, 20)[:len(r.tokens)]


def test_skips_commit_drafts_and_the_shadow_judges_them_with_the_same_draws():
    """A raw-confidence skip commits drafted tokens; the shadow verifier's L is the agreement of
    the draft with the verifier's own draws at those positions (StrictToken's meaning)."""
    s = Sampling(temperature=0.7, seed=1)
    v = FakeVerifier()
    pol = PolicyConfig.make("raw", eta_b=0.5, eta_c=0.5, k_min=1, s_max=8)
    r = decode(PROMPT, FakeDrafter(0.0, seed=1), v, pol, DecodeConfig(gamma=6, max_new_tokens=40, sampling=s), task_id="k")
    skipped = [x for x in r.rounds if not x.verified]
    assert skipped and all(x.L is not None for x in skipped)
    assert any(x.L < x.K for x in skipped)  # a greedy draft often differs from a draw at 0.7


def test_uniforms_belong_to_positions():
    s = Sampling(temperature=1.0, seed=9)
    whole = s.uniforms(123, 0, 20)
    assert np.array_equal(whole[7:12], s.uniforms(123, 7, 5))
    assert ((0 <= whole) & (whole < 1)).all() and len(set(whole)) == 20
    assert not np.array_equal(whole, Sampling(temperature=1.0, seed=10).uniforms(123, 0, 20))
    assert not np.array_equal(whole, s.uniforms(124, 0, 20))
    assert prompt_key("HumanEval/0", [1]) == prompt_key("HumanEval/0", [2]) != prompt_key(None, [1])


def test_uniforms_are_uniform():
    u = Sampling(temperature=1.0).uniforms(5, 0, 4000)
    hist = np.histogram(u, bins=10, range=(0, 1))[0]
    assert ((hist - 400) ** 2 / 400).sum() < _chi2_critical(9)


@settings(max_examples=60, deadline=None)
@given(temperature=st.floats(0.05, 3.0), top_p=st.floats(0.05, 1.0), top_k=st.integers(0, 60),
       seed=st.integers(0, 2**31))
def test_torch_warp_matches_the_definition(temperature, top_p, top_k, seed):
    z = np.random.default_rng(seed).normal(size=V) * 3
    s = Sampling(temperature=temperature, top_p=top_p, top_k=top_k)
    got = warped_probs(torch.tensor(z[None]), s)[0].numpy()
    want = warp(z, s)
    assert np.allclose(got, want, atol=1e-9), (got, want)
    u = Sampling(temperature=1.0, seed=seed).uniforms(0, 0, 8)
    drawn = draw_rows(warped_probs(torch.tensor(np.tile(z, (8, 1))), s).numpy(), u)
    assert list(drawn) == [inverse_cdf(want, x) for x in u]
    assert all(want[t] > 0 for t in drawn)


def test_torch_warp_keeps_what_transformers_warpers_keep():
    """The same support and probabilities as transformers' temperature, top-k and top-p warpers."""
    from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

    rng = np.random.default_rng(0)
    for temperature, top_k, top_p in [(0.6, 0, 0.9), (1.0, 20, 1.0), (1.3, 10, 0.7), (0.2, 0, 0.95)]:
        z = torch.tensor(rng.normal(size=(3, 500)) * 2, dtype=torch.float32)
        w = TemperatureLogitsWarper(temperature)(None, z.clone())
        if top_k:
            w = TopKLogitsWarper(top_k)(None, w)
        if top_p < 1:
            w = TopPLogitsWarper(top_p)(None, w)
        ref = torch.softmax(w.double(), -1)
        got = warped_probs(z, Sampling(temperature=temperature, top_p=top_p, top_k=top_k))
        assert torch.equal(ref > 0, got > 0)
        assert torch.allclose(ref, got, atol=1e-6)


@pytest.mark.parametrize("kw", [dict(temperature=-0.1), dict(temperature=float("nan")), dict(top_p=0.0),
                                dict(top_p=1.01), dict(top_k=-1), dict(seed=-1), dict(seed=1.5), dict(seed=2**32),
                                dict(speculative=True)])
def test_bad_settings_are_refused(kw):
    with pytest.raises(ValueError):
        Sampling(**kw)


@pytest.mark.parametrize("policy", [PolicyConfig(name="lenience", lenience=0.5), PolicyConfig(name="topk", top_k=3)])
def test_lossy_acceptance_is_refused_when_sampling(policy):
    with pytest.raises(ValueError, match="takes no --temperature"):
        decode(PROMPT, FakeDrafter(), FakeVerifier(), policy, DecodeConfig(gamma=4, sampling=Sampling(temperature=0.5)))


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 9), data=st.data())
def test_pass_at_k_is_the_chance_that_k_drawn_samples_hold_a_pass(n, data):
    from vskip.engine.metrics import pass_at_k

    c = data.draw(st.integers(0, n))
    k = data.draw(st.integers(1, n))
    passed = [True] * c + [False] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    brute = sum(any(passed[i] for i in sub) for sub in subsets) / len(subsets)
    assert pass_at_k(n, c, k) == pytest.approx(brute, abs=1e-12)


def test_a_sampled_runs_summary_counts_prompts_and_reports_pass_at_k():
    from vskip.engine.metrics import summarize

    samples = [{"task_id": t, "passed": p, "generated_tokens": 1, "decode_seconds": 1.0, "verifier_calls": 1,
                "draft_blocks": 0, "skipped_rounds": 0, "draft_seconds": 0.0, "verify_seconds": 1.0}
               for t, ps in [("a", [1] * 10), ("b", [0] * 9 + [1]), ("c", [0] * 10)] for p in ps]
    s = summarize(samples, [])
    assert (s["n_prompts"], s["n_samples"]) == (3, 30)
    assert s["pass_at_1"] == pytest.approx(11 / 30)
    k = s["pass_at_k"]
    assert set(k) == {"1", "10"}
    assert k["1"]["estimate"] == pytest.approx(11 / 30) and k["10"]["estimate"] == pytest.approx(2 / 3)
    lo, hi = k["10"]["ci"]
    assert 0 <= lo < 2 / 3 < hi <= 1
