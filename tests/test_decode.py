"""The decode loop on a fake drafter/verifier pair: lossless Strict SDD, skips, shadow, records."""

import numpy as np
import pytest
from fakes import EOS, SPECIAL, FakeDrafter, FakeVerifier, StubPredictor
from hypothesis import given, settings
from hypothesis import strategies as st

from vskip.engine.decode import DecodeConfig, decode
from vskip.engine.policy import PolicyConfig
from vskip.engine.records import agreement

PROMPT = [7, 3, 9, 4]


def run(policy, drafter=None, gamma=8, max_new=60, shadow=True, predictor=None, trace=False, prompt=PROMPT):
    v = FakeVerifier()
    d = drafter if drafter is not None else FakeDrafter()
    cfg = DecodeConfig(gamma=gamma, max_new_tokens=max_new, shadow=shadow, trace=trace, task="humaneval")
    res = decode(prompt, None if policy.name == "ar" else d, v, policy, cfg, predictor=predictor)
    return res, v


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 24), st.floats(0.0, 1.0), st.integers(0, 10**6), st.integers(1, 80))
def test_strict_equals_verifier_greedy(gamma, error, seed, max_new):
    """The lossless property: Strict SDD returns the verifier's own greedy output."""
    ref, _ = run(PolicyConfig(name="ar"), max_new=max_new)
    res, _ = run(PolicyConfig(name="strict"), FakeDrafter(error, seed), gamma=gamma, max_new=max_new)
    assert res.tokens == ref.tokens
    assert res.tokens == FakeVerifier().greedy(PROMPT, max_new)
    assert res.stop == ref.stop


def test_ar_counts_one_call_per_token():
    res, v = run(PolicyConfig(name="ar"))
    assert res.verifier_calls == len(res.tokens) == v.calls
    assert res.draft_blocks == 0
    assert res.stop == "eos" and res.tokens[-1] == EOS


def test_strict_rounds_commit_L_plus_one():
    res, _ = run(PolicyConfig(name="strict"), FakeDrafter(0.3, 1))
    for r in res.rounds[:-1]:  # the last round may be cut at EOS
        assert r.verified and r.committed == r.L + 1 and not r.relaxed
    assert res.verifier_calls == res.draft_blocks == len(res.rounds)
    assert agreement(res.rounds) == (1.0, 1.0)


def test_perfect_drafter_commits_gamma_plus_one():
    res, _ = run(PolicyConfig(name="strict"), FakeDrafter(0.0), gamma=5, max_new=30)
    assert [r.committed for r in res.rounds[:3]] == [6, 6, 6]


def test_raw_skips_and_shadow_audits():
    pol = PolicyConfig(name="raw", eta_b=0.8, eta_c=0.8, k_min=2, s_max=20)
    res, v = run(pol, FakeDrafter(0.1, 3), gamma=8, max_new=80)
    skipped = [r for r in res.rounds if not r.verified]
    assert skipped, "the fake drafter is confident enough to skip"
    assert res.skipped_rounds == len(skipped)
    assert all(r.K >= 2 and r.L is not None and r.relaxed for r in skipped)
    # shadow calls are not counted as verifier calls
    assert res.verifier_calls == v.calls == sum(r.verified for r in res.rounds)
    assert v.shadow_calls == len(skipped)
    assert sum(r.committed for r in res.rounds) == len(res.tokens)
    st_, fp = agreement(res.rounds)
    assert 0.0 <= fp <= st_ <= 1.0


def test_shadow_never_changes_decoding():
    pol = PolicyConfig(name="raw", eta_b=0.8, eta_c=0.8, k_min=2, s_max=20)
    a, _ = run(pol, FakeDrafter(0.2, 5), shadow=True)
    b, vb = run(pol, FakeDrafter(0.2, 5), shadow=False)
    assert a.tokens == b.tokens
    assert vb.shadow_calls == 0
    assert all(r.L is None for r in b.rounds if not r.verified)


def test_a_lossy_skip_shows_in_agreement():
    """A drafter that is always wrong but fully confident: raw skips commit wrong tokens and the
    shadow verifier reports L = 0 on them."""
    pol = PolicyConfig(name="raw", eta_b=0.0, eta_c=0.0, k_min=1, s_max=1000)

    class Overconfident(FakeDrafter):
        def propose(self, seq, gamma, features=False, sampling=None, slot=0):
            b = super().propose(seq, gamma, features)
            b.confidence[:] = 1.0
            return b

    res, _ = run(pol, Overconfident(1.0, 2), gamma=4, max_new=20)
    skipped = [r for r in res.rounds if not r.verified]
    assert skipped and all(r.L == 0 for r in skipped)
    assert agreement(res.rounds) == (0.0, 0.0)


def test_staleness_forces_verification():
    pol = PolicyConfig(name="raw", eta_b=0.0, eta_c=0.0, k_min=1, s_max=12)
    res, _ = run(pol, FakeDrafter(0.0), gamma=8, max_new=200, prompt=[11, 12, 13])
    D = 0
    for r in res.rounds:
        if r.verified:
            D = 0
        else:
            assert D < 12
            D += r.K
        assert D <= 12 + 8 - 1


def test_special_token_guard_in_loop():
    pol = PolicyConfig(name="raw", eta_b=0.0, eta_c=0.0, k_min=1)
    res, _ = run(pol, FakeDrafter(0.0, special_at=0), gamma=6)
    assert res.skipped_rounds == 0
    assert {r.reason for r in res.rounds} <= {"special", "shortened", "eos"}
    assert "special" in {r.reason for r in res.rounds}
    assert SPECIAL not in res.tokens


def test_lenience_one_and_topk_one_equal_strict():
    ref, _ = run(PolicyConfig(name="strict"), FakeDrafter(0.3, 9))
    for pol in (PolicyConfig(name="lenience", lenience=1.0), PolicyConfig(name="topk", top_k=1)):
        res, _ = run(pol, FakeDrafter(0.3, 9))
        assert res.tokens == ref.tokens
        assert [r.committed for r in res.rounds] == [r.committed for r in ref.rounds]


def test_lenience_is_relaxed_and_uses_fewer_calls():
    strict, _ = run(PolicyConfig(name="strict"), FakeDrafter(0.4, 4), max_new=80)
    len_, _ = run(PolicyConfig(name="lenience", lenience=0.05), FakeDrafter(0.4, 4), max_new=80)
    assert any(r.relaxed for r in len_.rounds)
    assert all(r.accepted >= r.L for r in len_.rounds if r.verified)
    assert len_.verifier_calls / len(len_.tokens) <= strict.verifier_calls / len(strict.tokens)


def test_periodic_skips_every_p_rounds():
    res, _ = run(PolicyConfig(name="periodic", period=3, period_k=2), FakeDrafter(0.2, 1), gamma=8, max_new=80)
    for r in res.rounds:
        if not r.verified:
            assert (r.round + 1) % 3 == 0 and r.K == 2


def test_learned_signal_uses_predictor_and_features():
    pred = StubPredictor(power=2.0)
    pol = PolicyConfig.make("conditional", eta_b=0.5, epsilon=0.5, k_min=1)
    res, _ = run(pol, FakeDrafter(0.1, 2), predictor=pred)
    assert pred.calls == res.draft_blocks > 0
    with pytest.raises(ValueError, match="predictor"):
        run(pol, FakeDrafter(0.1, 2), predictor=None)


def test_budget_and_shortened_final_block():
    res, _ = run(PolicyConfig(name="raw", eta_b=0.0, eta_c=0.0, k_min=1), FakeDrafter(0.0), gamma=8, max_new=13)
    assert len(res.tokens) == 13 and res.stop == "length"
    assert res.rounds[-1].gamma <= 8
    shortened = [r for r in res.rounds if r.gamma < 8]
    assert all(r.verified for r in shortened)


def test_trace_records_every_block():
    res, _ = run(PolicyConfig(name="strict"), FakeDrafter(0.3, 2), trace=True)
    assert len(res.traces) == res.draft_blocks
    for t, r in zip(res.traces, res.rounds):
        assert t.features.shape == (r.gamma, 19) and t.L == r.L
        assert np.all(t.features[:, 14] == np.arange(1, r.gamma + 1))  # block position


def test_timing_excludes_shadow():
    pol = PolicyConfig(name="raw", eta_b=0.8, eta_c=0.8, k_min=2)
    res, _ = run(pol, FakeDrafter(0.1, 3))
    assert res.decode_seconds > 0 and res.shadow_seconds > 0
    assert res.draft_seconds + res.verify_seconds <= res.decode_seconds + 1e-6


def test_bad_inputs():
    with pytest.raises(ValueError, match="empty"):
        run(PolicyConfig(name="strict"), prompt=[])
    with pytest.raises(ValueError, match="gamma"):
        DecodeConfig(gamma=0)
    v = FakeVerifier()
    v.max_length = 50
    with pytest.raises(ValueError, match="context"):
        decode(list(range(40)), FakeDrafter(), v, PolicyConfig(name="strict"), DecodeConfig(gamma=8, max_new_tokens=20))


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 8), st.integers(0, 16), st.integers(1, 12), st.floats(0.0, 1.0), st.integers(0, 10**6),
       st.integers(1, 80))
def test_block_length_per_round_keeps_strict_lossless( gamma, extra, min_match, error, seed, max_new):
    """Choosing the block length each round, and trimming what is verified, change what is
    drafted and checked, never what Strict SDD commits."""
    for trim in (None, 0.0, 0.9, 1.0):
        _check_blocks(gamma, extra, min_match, error, seed, max_new, trim)


def _check_blocks(gamma, extra, min_match, error, seed, max_new, trim):
    d = FakeDrafter(error, seed)
    v = FakeVerifier()
    cfg = DecodeConfig(gamma=gamma, max_new_tokens=max_new, gamma_max=gamma + extra, min_match=min_match, trim=trim)
    res = decode(PROMPT, d, v, PolicyConfig(name="strict"), cfg)
    assert res.tokens == FakeVerifier().greedy(PROMPT, max_new)
    assert set(d.gammas) <= set(range(1, gamma + extra + 1))
    if trim == 1.0:  # the fake's confidences never reach 1: every verification checks one token
        assert all(r.accepted <= 1 and r.committed <= 2 for r in res.rounds)


def test_block_length_follows_the_match_and_the_last_block():
    d = FakeDrafter(0.5, 4)
    cfg = DecodeConfig(gamma=4, max_new_tokens=200, gamma_max=12, min_match=8)
    res = decode(PROMPT, d, FakeVerifier(), PolicyConfig(name="strict"), cfg)
    seq = list(PROMPT)
    last_full = False
    assert len(d.gammas) == len(res.rounds) > 5
    for g, r in zip(d.gammas, res.rounds):
        want = 12 if (len(seq) % 12 >= 8 or last_full) else 4
        assert g == min(want, 200 - (len(seq) - len(PROMPT)))
        last_full = r.accepted == r.gamma
        seq += res.tokens[len(seq) - len(PROMPT): len(seq) - len(PROMPT) + r.committed]
    assert {4, 12} <= set(d.gammas)


def test_trim_refuses_traces_and_relaxed_acceptance():
    with pytest.raises(ValueError, match="trim"):
        DecodeConfig(trim=0.5, trace=True)
    from vskip.engine.settings import Settings

    for name in ("lenience", "topk"):
        with pytest.raises(ValueError, match="trim"):
            Settings(PolicyConfig(name=name), DecodeConfig(trim=0.5))
    Settings(PolicyConfig(name="strict"), DecodeConfig(trim=0.5))  # lossless: allowed


def test_prefix_policy_skips_only_beyond_the_break_even_length():
    """The prefix policy (beyond the paper): skips need survival >= lam and a prefix longer than
    the block's own K*; with drafting as dear as verification (cost ratio large) it never skips;
    without a cost ratio it waits for measured costs; a perfect drafter loses nothing."""
    cheap = PolicyConfig(name="prefix", lam=0.5, cost_ratio=0.05)
    res, _ = run(cheap, FakeDrafter(0.0, 1), gamma=8, max_new=60)
    skips = [r for r in res.rounds if not r.verified]
    assert skips and all(r.reason == "skip" for r in skips)
    ref, _ = run(PolicyConfig(name="ar"), FakeDrafter(0.0, 1), gamma=8, max_new=60)
    assert res.tokens == ref.tokens  # the drafter is always right: skipping loses nothing
    # at one threshold, cheap drafting skips the short confident prefixes that dear drafting does not
    cheap2, _ = run(PolicyConfig(name="prefix", lam=0.95, cost_ratio=0.05), FakeDrafter(0.0, 1), gamma=8, max_new=60)
    dear, _ = run(PolicyConfig(name="prefix", lam=0.95, cost_ratio=50.0), FakeDrafter(0.0, 1), gamma=8, max_new=60)
    assert cheap2.skipped_rounds > 0
    assert dear.skipped_rounds == 0 and any(r.reason == "break_even" for r in dear.rounds)
    measured, _ = run(PolicyConfig(name="prefix", lam=0.5), FakeDrafter(0.0, 1), gamma=8, max_new=60)
    assert measured.rounds[0].reason == "no_costs" and measured.rounds[0].verified
    strictish, _ = run(PolicyConfig(name="prefix", lam=1.0, cost_ratio=0.05), FakeDrafter(0.3, 2), gamma=8, max_new=60)
    assert all(r.verified for r in strictish.rounds if r.reason == "no_prefix")


def test_prefix_decision_is_pure_and_respects_staleness():
    from vskip.engine.policy import decide
    from vskip.engine.policy.guards import GuardContext

    ctx = GuardContext(np.array([5, 6, 7]), frozenset(), frozenset({0}))
    pol = PolicyConfig(name="prefix", lam=0.8, cost_ratio=0.1, s_max=10)
    toks = np.array([3, 4, 5, 6, 7, 8, 9, 10])
    q = np.array([0.99, 0.99, 0.98, 0.97, 0.5, 0.5, 0.5, 0.5])  # running product >= 0.8 for 4 tokens
    d = decide(pol, 0, 0, toks, q, ctx)
    assert (d.K, d.reason) == (4, "skip")
    assert decide(pol, 10, 0, toks, q, ctx).reason == "stale"
    with pytest.raises(ValueError):
        PolicyConfig(name="prefix", lam=0.0)
    with pytest.raises(ValueError):
        PolicyConfig(name="prefix", cost_ratio=-1.0)
