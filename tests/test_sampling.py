"""Sampling: the verifier's warped distribution, the position-indexed random numbers, and Strict
SDD exact in distribution over every token it commits (and wrong rules rejected by the same
chi-square)."""

from __future__ import annotations

import itertools
import math
from collections import Counter
from dataclasses import dataclass, replace

import numpy as np
import pytest
import torch
from fakes import FakeDrafter, FakeVerifier, V, fake_logits, inverse_cdf, warp
from hypothesis import given, settings
from hypothesis import strategies as st

from vskip.engine.decode import DecodeConfig, Job, decode, decode_many
from vskip.engine.models.sampling import warped_probs
from vskip.engine.policy import RULE, Draw, PolicyConfig, Rule, Sampling, draw_rows, drawn_verdict, prompt_key
from vskip.engine.policy.sampling import speculative_draws

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
    """Wrong: every drafted token is accepted, and only the bonus token is the verifier's own draw."""

    def accept(self, cfg, draft, verdict):
        return len(draft)


class ResampleFromP(Rule):
    """Wrong, the classic mistake of the speculative rule: accept with min(1, p/q), but on rejection
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


class VerifierArgmaxBonus(Rule):
    """Wrong: after a block accepted whole, the bonus token is the verifier's argmax, not its draw."""

    def verdict(self, scores, draw):
        v = super().verdict(scores, draw)
        if draw is None:
            return v
        tokens = v.tokens.copy()
        tokens[-1] = int(np.argmax(scores[-1]))
        return drawn_verdict(tokens)


class Remembering(FakeDrafter):
    """The fake drafter, remembering the context and the block of its last proposal."""

    def propose(self, seq, gamma, features=False, sampling=None, slot=0):
        self.context, self.sampling = list(seq), sampling
        self.block = super().propose(seq, gamma, features, sampling)
        return self.block


class DrafterArgmaxBonus(Rule):
    """Wrong: the bonus token is the drafter's choice at the position after the block (its argmax,
    which the greedy fake corrupts at its error rate), not the verifier's draw."""

    def __init__(self, drafter: Remembering):
        self.drafter = drafter

    def verdict(self, scores, draw):
        v = super().verdict(scores, draw)
        if draw is None:
            return v
        d = self.drafter
        drafted = draw.tokens if draw.speculative else d.block.tokens[: len(scores) - 1]
        after = FakeDrafter(d.error, d.seed).propose(d.context + [int(t) for t in drafted], 1, sampling=d.sampling)
        tokens = v.tokens.copy()
        tokens[-1] = int(after.tokens[0])
        return drawn_verdict(tokens)


class SpeculativeByDefinition(Rule):
    """The standard rule written out here from its definition: keep x_i while ``keeps``, at the first
    rejection a token of the residual max(0, p - q) (``residual_token``; :func:`inverse_cdf`
    normalises it), after a whole block the bonus drawn from p. Unchanged it commits the library's
    tokens (a test says so); each mutant below changes one step."""

    def keeps(self, u, p_x, q_x):
        return u * q_x < p_x  # probability min(1, p/q)

    def residual_token(self, residual, u):
        return inverse_cdf(residual, u)

    def verdict(self, scores, draw):
        if draw is None or not draw.speculative:
            return super().verdict(scores, draw)
        p = np.asarray(scores, np.float64)
        p, q = p / p.sum(-1, keepdims=True), draw.q / draw.q.sum(-1, keepdims=True)
        out = np.full(len(p), -1)
        out[-1] = inverse_cdf(p[-1], draw.u[-1])
        for i, x in enumerate(int(t) for t in draw.tokens):
            residual = np.maximum(p[i] - q[i], 0.0)
            residual[x] = 0.0
            if self.keeps(draw.u_accept[i], p[i][x], q[i][x]) or not residual.any():
                out[i] = x  # (a residual without mass: only a mutant rejects there)
                continue
            out[i] = self.residual_token(residual, draw.u[i])
            break
        return drawn_verdict(out)


class ResidualNotRenormalised(SpeculativeByDefinition):
    """Wrong: the residual drawn from as if its mass were 1; a number beyond its mass falls on its
    last token."""

    def residual_token(self, residual, u):
        return int(min(np.searchsorted(np.cumsum(residual), u, side="right"), np.flatnonzero(residual)[-1]))


class AcceptQOverP(SpeculativeByDefinition):
    """Wrong: a drafted token kept with probability min(1, q/p) instead of min(1, p/q)."""

    def keeps(self, u, p_x, q_x):
        return u * p_x < q_x


@dataclass(frozen=True)
class Case:
    """Continuations of ``tokens`` tokens after PROMPT under temperature 1 and ``top_k``,
    enumerated exactly; Strict SDD decodes them in blocks of ``gamma`` over 2000 seeds with a fake
    drafter of error ``drafter_error``."""

    gamma: int
    tokens: int
    top_k: int
    drafter_error: float

    def sampling(self, speculative: bool) -> Sampling:
        return Sampling(temperature=1.0, top_k=self.top_k, speculative=speculative)


#: gamma below the tokens counted, so that every token a first block commits is counted: its bonus
#: token when it is accepted whole, its correction wherever a rejection cuts it
CASES = {"bonus counted": Case(gamma=2, tokens=3, top_k=4, drafter_error=0.2),  # 64 continuations
         "a cut at each position": Case(gamma=3, tokens=4, top_k=3, drafter_error=0.1)}  # 81
#: the wrong rules, each made for a drafter (the coupled rule's, then the speculative rule's too)
COUPLED_MUTANTS = {"accept everything": lambda d: AcceptEverything(),
                   "bonus: the verifier's argmax": lambda d: VerifierArgmaxBonus(),
                   "bonus: the drafter's argmax": DrafterArgmaxBonus}
SPECULATIVE_MUTANTS = {**COUPLED_MUTANTS,
                       "resample from p": lambda d: ResampleFromP(),
                       "residual not renormalised": lambda d: ResidualNotRenormalised(),
                       "min(1, q/p)": lambda d: AcceptQOverP()}


def _samples(rule_for, case: Case, speculative: bool, drafter_error: float, seeds=range(2000)):
    """(count of each continuation, count of each accepted length of the first block) over the
    seeds; ``rule_for(drafter)`` gives the rule of a decode."""
    counts, cuts = Counter(), Counter()
    s = case.sampling(speculative)
    for seed in seeds:
        drafter = Remembering(error=drafter_error, seed=seed)
        cfg = DecodeConfig(gamma=case.gamma, max_new_tokens=case.tokens, sampling=replace(s, seed=seed))
        r = decode(PROMPT, drafter, FakeVerifier(), PolicyConfig(name="strict"), cfg, task_id="t",
                   rule=rule_for(drafter))
        counts[tuple(r.tokens)] += 1
        cuts[r.rounds[0].accepted] += 1
    return counts, cuts


def _chi2(counts: Counter, exact: dict, pool: float = 5.0) -> tuple[float, int]:
    """Pearson's statistic and its degrees of freedom, the continuations expected fewer than
    ``pool`` times pooled into one cell; infinite for a continuation the verifier never samples."""
    n = sum(counts.values())
    if not set(counts) <= set(exact):
        return math.inf, len(exact) - 1
    cells = [(counts[k], n * p) for k, p in exact.items() if n * p >= pool]
    rare = [(counts[k], n * p) for k, p in exact.items() if n * p < pool]
    if rare:
        cells.append((sum(o for o, _ in rare), sum(e for _, e in rare)))
    return sum((o - e) ** 2 / e for o, e in cells), len(cells) - 1


def _check(rule_for, case: Case, speculative: bool, drafter_error: float) -> tuple[float, float, Counter]:
    """(chi-square statistic, its critical value at 1e-3, the first block's accepted lengths)."""
    exact = _exact(case.sampling(speculative), case.tokens)
    assert abs(sum(exact.values()) - 1) < 1e-12 and len(exact) == case.top_k ** case.tokens
    counts, cuts = _samples(rule_for, case, speculative, drafter_error)
    stat, df = _chi2(counts, exact)
    return stat, _chi2_critical(df), cuts


MODES = pytest.mark.parametrize("speculative", [False, True], ids=["coupled", "speculative"])


@MODES
@pytest.mark.parametrize("case", CASES)
def test_the_rule_samples_the_verifiers_distribution_over_every_committed_token(case, speculative):
    """Strict SDD's coupled rule, and the standard speculative rule (the drafter samples from a q
    that depends on the context alone), match the exact distribution by chi-square at 1e-3 over
    2000 seeds, with the bonus token and a cut at every position of the first block among the
    tokens counted, each at least 100 times."""
    c = CASES[case]
    stat, critical, cuts = _check(lambda d: RULE, c, speculative, c.drafter_error)
    assert all(cuts[a] >= 100 for a in range(c.gamma + 1)), cuts
    assert stat < critical, (stat, critical)


@MODES
def test_the_rule_is_exact_with_a_drafter_far_from_or_equal_to_the_verifier(speculative):
    """The same with the greedy drafter wrong half the time, and with the sampling drafter's q the
    verifier's own p at the block's first position (then the first position is never rejected)."""
    c = CASES["bonus counted"]
    stat, critical, _ = _check(lambda d: RULE, c, speculative, 0.0 if speculative else 0.5)
    assert stat < critical, (stat, critical)


#: chi-square of each wrong rule here, against 102.2 (bonus counted) and 124.9 (a cut at each position);
#: inf: a continuation the verifier never samples (a token outside its top-k: a drafter's argmax, a
#: token min(1, q/p) keeps where p has no mass, every corrupted draft kept); in brackets the statistic
#: over the continuations the verifier can sample alone, conditioned on them
#:                                 bonus counted               a cut at each position
#:                               coupled    speculative         coupled    speculative
#: accept everything             inf (6395)  inf (308)         inf (10585) inf (1145)
#: bonus: the verifier's argmax    262        301                 296        270
#: bonus: the drafter's argmax   inf (190)   inf (99)          inf (261)   inf (130)
#: resample from p                  -         162                  -         250
#: residual not renormalised        -         471                  -         247
#: min(1, q/p)                      -        inf (162)             -        inf (955)
@pytest.mark.parametrize("mode,mutant", [("coupled", m) for m in COUPLED_MUTANTS]
                         + [("speculative", m) for m in SPECULATIVE_MUTANTS])
@pytest.mark.parametrize("case", CASES)
def test_a_wrong_rule_is_rejected_by_the_chi_square(case, mode, mutant):
    c = CASES[case]
    rule_for = (SPECULATIVE_MUTANTS if mode == "speculative" else COUPLED_MUTANTS)[mutant]
    stat, critical, _ = _check(rule_for, c, mode == "speculative", c.drafter_error)
    assert stat > critical, (stat, critical)


@settings(max_examples=200, deadline=None)
@given(seed=st.integers(0, 2**31), n=st.integers(1, 5))
def test_the_rule_written_from_its_definition_is_the_librarys(seed, n):
    """The mutants differ from the library's speculative rule by their one change only."""
    rng = np.random.default_rng(seed)
    p, q = rng.dirichlet(np.ones(6) * 0.7, size=n + 1), rng.dirichlet(np.ones(6) * 0.7, size=n)
    p[rng.random(p.shape) < 0.3] = 0.0
    p[:, 0] += 0.01
    tokens = np.array([inverse_cdf(row, u) for row, u in zip(q, rng.random(n))])
    draw = Draw(Sampling(temperature=1.0), rng.random(n + 1), tokens=tokens, q=q, u_accept=rng.random(n))
    got, want = SpeculativeByDefinition().verdict(p, draw).tokens, speculative_draws(p, draw)
    assert got.tolist() == want.tolist()


def _batched(rule: Rule, case: Case, speculative: bool, batch_size: int = 8, n: int = 2000) -> Counter:
    """The continuations of ``n`` jobs of PROMPT, each with its own random numbers (its task id
    keys them), decoded ``batch_size`` at a time by the batched loop with one drafter (greedy and
    right for the coupled rule, so that blocks are accepted whole; the case's for the speculative)."""
    cfg = DecodeConfig(gamma=case.gamma, max_new_tokens=case.tokens, sampling=case.sampling(speculative))
    drafter = FakeDrafter(case.drafter_error if speculative else 0.0, seed=0)
    jobs = [Job(PROMPT, task_id=f"t{i}") for i in range(n)]
    return Counter(tuple(r.tokens) for _, r in decode_many(jobs, drafter, FakeVerifier(), PolicyConfig(name="strict"),
                                                           cfg, batch_size=batch_size, rule=rule))


@pytest.mark.parametrize("mode,mutant", [("coupled", None), ("speculative", None),
                                         ("coupled", "bonus: the verifier's argmax"), ("speculative", "resample from p"),
                                         ("speculative", "residual not renormalised"), ("speculative", "min(1, q/p)")])
def test_the_batched_loop_samples_exactly_and_rejects_a_wrong_rule(mode, mutant):
    """The same chi-square through the batched loop (8 sequences side by side, 2000 jobs): the
    rules pass with the bonus token among the tokens counted, and wrong rules are rejected."""
    c, speculative = CASES["bonus counted"], mode == "speculative"
    rule = RULE if mutant is None else (SPECULATIVE_MUTANTS if speculative else COUPLED_MUTANTS)[mutant](None)
    stat, df = _chi2(_batched(rule, c, speculative), _exact(c.sampling(speculative), c.tokens))
    assert (stat < _chi2_critical(df)) == (mutant is None), (stat, _chi2_critical(df))


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


@given(seed=st.integers(0, 2**31), u=st.floats(0.0, 0.999), delta=st.floats(1e-9, 0.2))
def test_tie_margin_bounds_the_nudge_that_parts_two_draws(seed, u, delta):
    """Draws a at u and b at u + delta differ only across a cumulative sum between them, so the
    margin of (u, a, b) is at most delta; and a u in the middle of one token's mass is far from
    drawing its neighbour."""
    from vskip.engine.policy.sampling import inverse_cdf as draw, tie_margin

    rng = np.random.default_rng(seed)
    p = rng.dirichlet(np.full(12, 0.3)) * rng.uniform(0.5, 2.0)  # any total: the rule normalises
    v = min(u + delta, 1.0 - 1e-12)
    a, b = draw(p, u), draw(p, v)
    if a != b:
        assert tie_margin(p, u, a, b) <= (v - u) + 1e-12
        assert tie_margin(p, u, b, a) == tie_margin(p, u, a, b)
    half = np.array([0.5, 0.5])
    assert tie_margin(half, 0.25, 0, 1) == pytest.approx(0.25)
    assert tie_margin(np.array([0.2, 0.0, 0.0, 0.8]), 0.2 + 1e-7, 3, 0) == pytest.approx(1e-7, abs=1e-12)
    with pytest.raises(ValueError):
        tie_margin(half, 0.5, 1, 1)
