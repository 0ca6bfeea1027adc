"""Pure tests of the policy: the paper's claims as properties (hypothesis)."""

import subprocess
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vskip.engine.policy import (GuardConfig, GuardContext, PolicyConfig, Verdict, break_even_length, committed_tokens,
                                 decide, feasible_prefix, lenience_accept, local_scores, policy_params, prefix_scores,
                                 repetition, select_prefix, strict_accept, topk_accept)

probs = st.lists(st.floats(0.0, 1.0, allow_nan=False), min_size=1, max_size=40).map(np.array)
gate = st.floats(0.0, 1.0)


def test_policy_does_not_import_torch():
    code = "import sys, vskip.engine.policy, vskip.engine.decode; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@given(probs)
def test_eq4_ordering(q):
    """prod q <= min q <= geometric mean, at every prefix length."""
    cond, local, raw = prefix_scores("conditional", q), local_scores(q), prefix_scores("raw", q)
    assert np.all(cond <= local + 1e-12)
    assert np.all(local <= raw + 1e-12)


@given(probs, gate, gate)
def test_marginal_gates_collapse_to_max(q, eta_b, eta_c):
    """Marginal survival: both gates equal the running minimum, so (eta_b, eta_c) acts as
    eta_m = max(eta_b, eta_c)."""
    m = max(eta_b, eta_c)
    assert feasible_prefix("marginal", q, eta_b, eta_c) == feasible_prefix("marginal", q, m, m)
    assert np.array_equal(prefix_scores("marginal", q), local_scores(q))


@given(probs, gate, gate)
def test_conditional_product_gate_implies_local(q, eta_b, eta_c):
    """When eta_c >= eta_b, passing the product gate passes the local gate: removing the local
    gate changes nothing."""
    if eta_c < eta_b:
        eta_b, eta_c = eta_c, eta_b
    both = feasible_prefix("conditional", q, eta_b, eta_c)
    product_only = feasible_prefix("conditional", q, 0.0, eta_c)
    assert both == product_only


def test_a_zero_score_makes_every_product_zero():
    """A score of 0 anywhere makes the product and the geometric mean through it exactly 0, so no
    positive threshold, however small, lets that prefix through (found by hypothesis: a floor
    inside the logarithm once let a 1e-300 product pass a 2e-309 gate)."""
    q = np.array([0.9, 0.0, 0.9])
    for signal in ("raw", "conditional"):
        assert np.array_equal(prefix_scores(signal, q) > 0, [True, False, False])
        assert feasible_prefix(signal, np.array([0.0]), 2.2e-309, 2.2e-309) == 0
    rows = np.array([[0.9, 0.0, 0.9], [0.9, 0.9, 0.9]])
    assert np.array_equal(prefix_scores("conditional", rows)[1], prefix_scores("conditional", rows[1]))


def test_local_gate_binds_for_raw():
    """The geometric mean can stay high over one low position; the local gate catches it."""
    q = np.array([0.99, 0.99, 0.99, 0.5, 0.99, 0.99, 0.99, 0.99])
    assert feasible_prefix("raw", q, 0.0, 0.9) == 8
    assert feasible_prefix("raw", q, 0.9, 0.9) == 3


def test_select_prefix_examples():
    B = np.array([0.99, 0.95, 0.9, 0.5])
    C = np.array([0.99, 0.97, 0.94, 0.8])
    assert select_prefix(B, C, 0.9, 0.93) == 3
    assert select_prefix(B, C, 0.96, 0.93) == 1
    assert select_prefix(B, C, 0.999, 0.0) == 0


def _verdict(draft, argmax, gap=None, rank=None):
    g = len(draft)
    gap = np.zeros(g) if gap is None else np.asarray(gap, float)
    rank = np.zeros(g, np.int64) if rank is None else np.asarray(rank)
    return Verdict(np.asarray(argmax), gap, rank)


def test_strict_worked_example():
    draft = np.array([5, 7, 9, 2])
    v = _verdict(draft, [5, 7, 3, 8, 1])
    assert strict_accept(draft, v) == 2
    assert committed_tokens(draft, v, 2).tolist() == [5, 7, 3]
    full = _verdict(draft, [5, 7, 9, 2, 4])
    assert committed_tokens(draft, full, strict_accept(draft, full)).tolist() == [5, 7, 9, 2, 4]


@st.composite
def verdicts(draw):
    g = draw(st.integers(1, 20))
    draft = np.array(draw(st.lists(st.integers(0, 5), min_size=g, max_size=g)))
    argmax = np.array(draw(st.lists(st.integers(0, 5), min_size=g + 1, max_size=g + 1)))
    match = draft == argmax[:-1]
    # A consistent verdict: the argmax has gap 0 and rank 0; others a negative gap and rank >= 1.
    gap = np.where(match, 0.0, -np.array(draw(st.lists(st.floats(1e-3, 20), min_size=g, max_size=g))))
    rank = np.where(match, 0, np.array(draw(st.lists(st.integers(1, 100), min_size=g, max_size=g))))
    return draft, Verdict(argmax, gap, rank)


@given(verdicts())
def test_lenience_one_is_strict(dv):
    draft, v = dv
    assert lenience_accept(draft, v, 1.0) == strict_accept(draft, v)
    assert topk_accept(draft, v, 1) == strict_accept(draft, v)


@given(verdicts(), st.floats(0.01, 1.0), st.integers(1, 50))
def test_relaxed_rules_accept_at_least_strict(dv, ell, k):
    draft, v = dv
    L = strict_accept(draft, v)
    assert lenience_accept(draft, v, ell) >= L
    assert topk_accept(draft, v, k) >= L
    # and are monotone in their parameter
    assert lenience_accept(draft, v, ell / 2) >= lenience_accept(draft, v, ell)
    assert topk_accept(draft, v, k + 1) >= topk_accept(draft, v, k)


def test_lenience_threshold_is_eq9():
    draft = np.array([1, 2, 3])
    v = _verdict(draft, [0, 0, 0, 0], gap=[np.log(0.8), np.log(0.5), 0.0], rank=[1, 1, 0])
    assert lenience_accept(draft, v, 0.8) == 1
    assert lenience_accept(draft, v, 0.5) == 3
    assert lenience_accept(draft, v, 0.9) == 0
    assert topk_accept(draft, v, 2) == 3


def _ctx(history=(), shortened=False):
    return GuardContext(np.array(history, np.int64), frozenset({1}), frozenset({0}), shortened)


def _run_policy(cfg, qs, toks_fn, gamma):
    """Drive decide() over a sequence of rounds the way the loop does and return the D values."""
    D, Ds = 0, []
    for r, q in enumerate(qs):
        d = decide(cfg, D, r, toks_fn(r), q, _ctx())
        D = D + d.K if d.K > 0 else 0
        Ds.append(D)
    return Ds


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(1, 32), st.integers(1, 80), st.integers(0, 32), st.data())
def test_staleness_never_exceeds_smax_plus_gamma_minus_one(gamma, s_max, k_min, data):
    cfg = PolicyConfig(name="raw", eta_b=0.5, eta_c=0.5, k_min=k_min, s_max=s_max)
    qs = [np.array(data.draw(st.lists(st.floats(0.4, 1.0), min_size=gamma, max_size=gamma))) for _ in range(30)]
    toks = lambda r: np.arange(2, 2 + gamma) + r  # distinct tokens: no guard fires
    Ds = _run_policy(cfg, qs, toks, gamma)
    assert max(Ds) <= s_max + gamma - 1
    # once D >= s_max the next round is strict
    for a, b in zip(Ds, Ds[1:]):
        if a >= s_max:
            assert b == 0


def test_decide_rules():
    cfg = PolicyConfig(name="raw", eta_b=0.9, eta_c=0.93, k_min=3, s_max=10)
    toks = np.arange(2, 10)
    hi = np.full(8, 0.99)
    assert decide(cfg, 0, 0, toks, hi, _ctx()).K == 8
    assert decide(cfg, 10, 0, toks, hi, _ctx()).reason == "stale"
    lo = np.array([0.99, 0.99, 0.5, 0.99, 0.99, 0.99, 0.99, 0.99])
    d = decide(cfg, 0, 0, toks, lo, _ctx())
    assert (d.K, d.K_hat, d.reason) == (0, 2, "k_min")
    assert decide(cfg, 0, 0, toks, np.full(8, 0.1), _ctx()).reason == "no_prefix"
    nan = hi.copy()
    nan[5] = np.nan
    assert decide(cfg, 0, 0, toks, nan, _ctx()).reason == "invalid_score"
    assert decide(cfg, 0, 0, toks, np.full(8, 1.5), _ctx()).reason == "invalid_score"
    assert decide(cfg, 0, 0, toks, hi, _ctx(shortened=True)).reason == "shortened"
    eos = toks.copy()
    eos[4] = 0
    assert decide(cfg, 0, 0, eos, hi, _ctx()).reason == "eos"
    special = toks.copy()
    special[2] = 1
    assert decide(cfg, 0, 0, special, hi, _ctx()).reason == "special"
    # a special token after K̂ does not matter
    q = np.array([0.99] * 4 + [0.1] * 4)
    special_late = toks.copy()
    special_late[6] = 1
    assert decide(cfg, 0, 0, special_late, q, _ctx()).K == 4
    # k_min = 0 still needs K̂ > 0
    assert decide(PolicyConfig(name="raw", k_min=0), 0, 0, toks, np.full(8, 0.1), _ctx()).K == 0


def test_repetition_guard():
    cfg = GuardConfig(max_run=8, max_period=8, loop_repeats=4)
    assert repetition(np.array([5] * 6), np.array([5, 5]), cfg)
    assert not repetition(np.array([5] * 6), np.array([5, 6]), cfg)
    loop = np.array([3, 4, 5] * 3)
    assert repetition(loop, np.array([3, 4, 5]), cfg)
    assert not repetition(loop, np.array([3, 4, 9]), cfg)
    # a loop entirely inside the history is not the prefix's doing
    assert not repetition(np.array([3, 4] * 6), np.array([7, 8, 9]), cfg)
    d = decide(PolicyConfig(name="raw", k_min=1), 0, 0, np.array([5, 5, 5]), np.full(3, 0.99), _ctx([5] * 7))
    assert d.reason == "repetition"


def test_periodic_schedule():
    cfg = PolicyConfig(name="periodic", period=3, period_k=6)
    toks = np.arange(2, 18)
    ds = [decide(cfg, 0, r, toks, None, _ctx()) for r in range(6)]
    assert [d.K for d in ds] == [0, 0, 6, 0, 0, 6]
    eos = toks.copy()
    eos[3] = 0
    assert decide(cfg, 0, 2, eos, None, _ctx()).reason == "eos"
    assert decide(cfg, 0, 2, toks[:4], None, _ctx()).K == 4  # K capped at gamma


def test_non_skipping_methods_always_verify():
    for name in ("strict", "lenience", "topk", "ar"):
        d = decide(PolicyConfig(name=name), 0, 0, np.arange(2, 10), np.ones(8), _ctx())
        assert (d.K, d.reason) == (0, "verify")


def test_config_validation():
    with pytest.raises(ValueError, match="unknown policy"):
        PolicyConfig(name="nope")
    with pytest.raises(ValueError, match="eta_b"):
        PolicyConfig(name="raw", eta_b=1.5)
    with pytest.raises(ValueError, match="epsilon"):
        PolicyConfig.make("conditional", epsilon=-0.1)
    assert PolicyConfig.make("marginal", eta_m=0.97).eta_b == 0.97
    assert PolicyConfig.make("marginal", eta_m=0.97).eta_c == 0.97
    assert PolicyConfig.make("conditional", epsilon=0.05).eta_c == pytest.approx(0.95)
    assert (PolicyConfig.make("raw").eta_b, PolicyConfig.make("raw").eta_c) == (0.90, 0.93)


def test_break_even():
    assert break_even_length(3.0, 1.0, 2.0) == pytest.approx(1.0)
    with pytest.raises(ValueError):
        break_even_length(3.0, 0.0, 0.0)


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(1, 64), st.integers(0, 64), st.integers(1, 40), st.integers(0, 60), st.booleans())
def test_block_length_is_base_or_long(gamma, extra, min_match, match, last_full):
    from vskip.engine.policy import BlockLength, block_length

    cfg = BlockLength(gamma, gamma + extra, min_match)
    g = block_length(cfg, match, last_full)
    long = extra > 0 and (match >= min_match or last_full)
    assert g == (gamma + extra if long else gamma)
    assert block_length(BlockLength(gamma), match, last_full) == gamma


def test_block_length_rejects_bad_settings():
    from vskip.engine.policy import BlockLength

    for kw in ({"gamma": 0}, {"gamma": 8, "gamma_max": 4}, {"gamma": 8, "min_match": 0}):
        with pytest.raises(ValueError):
            BlockLength(**kw)


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.floats(0.0, 1.0), min_size=1, max_size=32), st.floats(0.0, 1.0))
def test_verify_length_is_the_confident_run(q, trim):
    from vskip.engine.policy import verify_length

    q = np.array(q)
    n = verify_length(q, trim)
    assert 1 <= n <= len(q)
    assert np.all(q[: n] >= trim) or n == 1
    assert n == len(q) or q[n] < trim or (n == 1 and q[0] < trim)
    assert verify_length(q, None) == len(q)


def test_the_policys_fields_are_the_declared_parameters():
    """defaults.POLICY_PARAMETERS declares every parameter once: the dataclass's fields are its
    fields, in its order, with its defaults; each method's summary lists the parameters that name
    it; the flags and compare's keys are read from it."""
    from dataclasses import fields

    from vskip.defaults import POLICY_PARAMETERS
    from vskip.study.variants import POLICY_FLAGS

    declared = {k: p for k, p in POLICY_PARAMETERS.items() if p.field}
    own = [f for f in fields(PolicyConfig) if f.name not in ("name", "guards")]
    assert [f.name for f in own] == list(declared)
    assert all(f.default == declared[f.name].default for f in own)
    assert policy_params("raw") == ("eta_b", "eta_c", "k_min", "s_max")
    assert policy_params("periodic") == ("period", "period_k", "s_max")
    assert policy_params("prefix") == ("lam", "cost_ratio", "s_max", "survival", "alpha")
    assert policy_params("strict") == ()
    assert "survival" not in POLICY_FLAGS and {"eta_m", "epsilon", "alpha"} <= set(POLICY_FLAGS)
