"""The prefix scheduler's pure parts: survival from hazards, the block-level likelihood, the
conformal risk control threshold (its guarantee checked on synthetic exchangeable prompts, with a
deliberately overconfident model) and the cost-aware choice."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from vskip.engine.policy.prefix import (calibrate, choose, crc_online, crc_threshold, hb_pvalue, ltt_fixed_sequence,
                                        online_envelope, prompt_loss, skip_lengths, survival_from_hazards, survival_nll)

G = 8
hazards = arrays(np.float64, (5, G), elements=st.floats(0.0, 1.0))


@given(hazards)
def test_survival_is_a_non_increasing_probability(h):
    S = survival_from_hazards(h)
    assert np.all((S >= 0) & (S <= 1)) and np.all(np.diff(S, axis=1) <= 1e-12)


@given(arrays(np.float64, (G,), elements=st.floats(0.01, 0.99)))
def test_the_likelihood_is_a_distribution_over_L(h):
    nll = survival_nll(np.repeat(h[None, :], G + 1, axis=0), np.arange(G + 1))
    assert np.exp(-nll).sum() == pytest.approx(1.0, abs=1e-9)
    S = survival_from_hazards(h)
    assert np.exp(-nll[3]) == pytest.approx(S[2] * h[3])  # L = 3: three survive, the fourth fails


@settings(max_examples=60)
@given(hazards, arrays(np.int64, (5,), elements=st.integers(0, G)), st.floats(0, 1), st.floats(0, 1))
def test_the_loss_does_not_grow_with_the_threshold(h, L, a, b):
    S = survival_from_hazards(h)
    lo, hi = min(a, b), max(a, b)
    assert prompt_loss(S, L, hi) <= prompt_loss(S, L, lo) + 1e-12
    assert 0.0 <= prompt_loss(S, L, lo) <= 1.0


def test_skip_lengths_take_the_passing_prefix_and_k_min():
    S = np.array([[0.95, 0.9, 0.7, 0.2], [0.5, 0.4, 0.3, 0.1]])
    assert skip_lengths(S, 0.8).tolist() == [2, 0]
    assert skip_lengths(S, 0.8, k_min=3).tolist() == [0, 0]


def _prompts(rng, n, blocks=12, overconfidence=0.3):
    """Prompts whose blocks draw L from a true survival curve; the model reports S**0.3, which
    is too high everywhere: the calibration must make up for it."""
    out = []
    for _ in range(n):
        h = rng.uniform(0.05, 0.6, size=(blocks, G))
        S = survival_from_hazards(h)
        u = rng.random(blocks)
        L = (S >= u[:, None]).sum(axis=1)  # P(L >= k) = S_k
        out.append((S ** overconfidence, L))
    return out


def test_conformal_risk_control_keeps_its_promise():
    rng = np.random.default_rng(0)
    alpha, losses, lams = 0.05, [], []
    for _ in range(100):
        cal, test = _prompts(rng, 60), _prompts(rng, 40)
        c = calibrate(cal, alpha, grid=np.linspace(0, 1, 101))
        lams.append(c.lam)
        losses.append(np.mean([prompt_loss(S, L, c.lam) for S, L in test]))
    assert np.mean(losses) <= alpha + 0.005  # E[loss] <= alpha, up to Monte Carlo error
    assert np.mean(losses) > alpha / 4  # and not trivially: it does skip
    naive = np.mean([prompt_loss(S, L, 0.5) for S, L in _prompts(rng, 200)])
    assert naive > alpha  # the overconfident model at a plain threshold would break the promise


def test_calibration_refuses_what_it_cannot_promise():
    rng = np.random.default_rng(1)
    c = calibrate(_prompts(rng, 10), alpha=0.05)  # B / (n + 1) = 0.09 > alpha: never skip
    assert c.lam == float("inf") and prompt_loss(*_prompts(rng, 1)[0], c.lam) == 0.0
    for bad in (0.0, 1.0, -0.1):
        with pytest.raises(ValueError):
            calibrate(_prompts(rng, 30), alpha=bad)


def test_choice_weighs_the_skip_against_the_break_even_length():
    S = np.array([0.99, 0.98, 0.97, 0.6, 0.3, 0.1, 0.0, 0.0])
    EL = S.sum()
    cheap = choose(S, lam=0.95, c_D=10.0, c_V=100.0)  # K* = (E[L] + 1) * 10 / 110 < 3
    assert cheap.K == 3 and cheap.k_star == pytest.approx((EL + 1) * 10 / 110) and cheap.reason == "skip"
    dear = choose(S, lam=0.95, c_D=100.0, c_V=10.0)  # drafting dominates: K* > 3
    assert dear.K == 0 and dear.reason == "break_even"
    strict = choose(S, lam=0.999, c_D=10.0, c_V=100.0)
    assert strict.K == 0 and strict.reason == "no_prefix"
    with pytest.raises(ValueError):
        choose(S, 0.9, 0.0, 1.0)


def test_calibrate_prefix_on_traces(tmp_path, capsys):
    """The command on Strict SDD traces of the fake pair: the threshold it prints keeps the replayed
    bound, and too few prompts for alpha mean never skip."""
    import json

    from fakes import FakeDrafter, FakeVerifier

    from vskip.cli import main
    from vskip.engine.decode import DecodeConfig, decode
    from vskip.engine.policy import PolicyConfig
    from vskip.study.prefix.calibrate import calibrate_traces, prompts_from_traces
    from vskip.study.traces import append_traces, load_traces

    runs = tmp_path / "strict"
    for i in range(30):
        cfg = DecodeConfig(gamma=G, max_new_tokens=40, trace=True, task="humaneval")
        res = decode([5 + i, 3, 9, 4], FakeDrafter(0.25, i), FakeVerifier(), PolicyConfig(name="strict"), cfg)
        append_traces(runs, f"HumanEval/{i}", res.traces, gamma=G)
    cal, rec = calibrate_traces([runs], alpha=0.1)
    assert 0 < cal.lam <= 1 and cal.bound <= 0.1 and rec["prompts"] == 30
    prompts = prompts_from_traces(load_traces([runs], hidden=False))
    assert np.mean([prompt_loss(S, L, cal.lam) for S, L in prompts]) == pytest.approx(cal.risk)
    out = tmp_path / "cal.json"
    assert main(["calibrate-prefix", str(runs), "--alpha", "0.1", "--out", str(out)]) == 0
    assert float(capsys.readouterr().out.strip()) == cal.lam
    assert json.loads(out.read_text())["command"].startswith("vskip calibrate-prefix")
    never, _ = calibrate_traces([runs], alpha=0.02)  # 1 / 31 > 0.02: nothing can be promised
    assert never.lam == float("inf")


# ----------------------------------------------------------------------------- online calibration

losses = arrays(np.float64, (6, 7), elements=st.floats(0.0, 1.0))
GRID6 = np.array([0.95, 0.9, 0.85, 0.8, 0.75, 0.7])


@given(losses)
def test_the_envelope_bounds_the_loss_and_falls_with_the_threshold(x):
    env = online_envelope(GRID6, x)
    assert np.all(env >= x)
    assert np.all(np.diff(env, axis=0) >= 0)  # GRID6 descends: the envelope grows as lam falls
    assert np.array_equal(env[0], x[0])  # the most cautious threshold is its own bound
    shuffled = np.random.default_rng(0).permutation(6)  # the grid's order in the input does not matter
    assert np.array_equal(online_envelope(GRID6[shuffled], x[shuffled]), env[shuffled])


@given(losses)
def test_crc_online_is_crc_when_the_loss_already_falls_with_the_threshold(x):
    mono = np.maximum.accumulate(x, axis=0)  # rows from the most cautious threshold down
    a = crc_online(GRID6, mono, 0.3)
    b = crc_threshold(GRID6[::-1], mono.mean(1)[::-1], x.shape[1], 0.3)
    assert a == b


def test_the_hoeffding_bentkus_p_value():
    # the Bentkus term: e * P(Binomial(n, alpha) <= n * risk); zero observed loss in n = 100 at alpha 0.05
    assert hb_pvalue(0.0, 100, 0.05) == pytest.approx(min(np.exp(100 * np.log(0.95)), np.e * 0.95 ** 100))
    p = [hb_pvalue(r, 200, 0.05) for r in (0.0, 0.01, 0.02, 0.04, 0.05, 0.2)]
    assert all(x <= y for x, y in zip(p, p[1:])) and p[-1] == 1.0 and p[0] < 1e-4
    assert hb_pvalue(0.01, 1000, 0.05) < hb_pvalue(0.01, 100, 0.05)  # more prompts, more evidence
    with pytest.raises(ValueError):
        hb_pvalue(0.0, 0, 0.05)


def test_learn_then_test_stops_at_the_first_threshold_it_cannot_certify():
    n = 400
    x = np.zeros((6, n))
    x[2, :4] = 1.0  # 0.01 at lam 0.85
    x[3, :60] = 1.0  # 0.15 at 0.8: not certified, so 0.75 below it is never tested
    lam, p = ltt_fixed_sequence(GRID6, x, alpha=0.05, delta=0.1)
    assert lam == 0.85 and p[3] > 0.1 and p[4] is None and p[5] is None
    lam0, _ = ltt_fixed_sequence(GRID6, np.ones((6, n)), alpha=0.05, delta=0.1)
    assert lam0 == float("inf")


def test_crc_on_the_envelope_keeps_the_promise_where_crc_on_the_raw_loss_breaks_it():
    """Online losses need not fall as the threshold rises. Here every threshold below the most
    cautious has the same risk 0.08 > alpha, drawn independently per threshold: CRC on the raw risk
    curve picks whichever threshold passed by chance and breaks the promise; CRC on the envelope
    keeps it."""
    rng = np.random.default_rng(0)
    alpha, n, grid = 0.05, 40, np.linspace(1.0, 0.05, 20)

    def draw(m):
        x = (rng.random((len(grid), m)) < 0.08).astype(float)
        x[0] = 0.0
        return x

    raw, env = [], []
    for _ in range(400):
        cal, test = draw(n), draw(200)
        order = np.argsort(grid)
        lam_raw = crc_threshold(grid[order], cal.mean(1)[order], n, alpha).lam
        lam_env = crc_online(grid, cal, alpha).lam
        for lam, out in ((lam_raw, raw), (lam_env, env)):
            out.append(0.0 if lam == float("inf") else test[int(np.nonzero(grid == lam)[0][0])].mean())
    assert np.mean(env) <= alpha
    assert np.mean(raw) > alpha + 0.015



def test_a_run_with_alpha_must_decode_with_the_settings_its_thresholds_were_chosen_with():
    """The online thresholds hold for one policy: another block length or budget is refused; shadow
    verification, which never changes a committed token, may differ; a run without --alpha is not
    checked."""
    from types import SimpleNamespace

    from vskip.study.prefix.calibrate import check_online_settings, run_settings

    cfg = {"policy": {"name": "prefix", "survival": "model", "cost_ratio": 0.22, "s_max": 64, "alpha": 0.05,
                      "guards": {"max_run": 8}},
           "decode": {"gamma": 8, "max_new_tokens": 128, "shadow": True, "gamma_max": None, "trim": None,
                      "sampling": {"temperature": 0.0, "top_p": 1.0, "top_k": 0, "speculative": False, "seed": 0}},
           "models": {"steps": 1, "drafter": None, "verifier": None, "copy_prior": "auto", "dtype": None,
                      "drafter_dtype": "auto"}}
    pred = SimpleNamespace(online={"settings": run_settings(cfg) | {"identity/verifier": "v"}}, path="P")
    check_online_settings(pred, cfg)
    no_shadow = {**cfg, "decode": {**cfg["decode"], "shadow": False}}
    check_online_settings(pred, no_shadow)
    for key, value in (("gamma", 16), ("max_new_tokens", 256)):
        with pytest.raises(ValueError, match=f"decode/{key} {value}"):
            check_online_settings(pred, {**cfg, "decode": {**cfg["decode"], key: value}})
    with pytest.raises(ValueError, match="decode/sampling"):
        check_online_settings(pred, {**cfg, "decode": {**cfg["decode"], "sampling": {"temperature": 0.6}}})
    check_online_settings(pred, {**cfg, "policy": {**cfg["policy"], "alpha": None}, "decode": {**cfg["decode"], "gamma": 16}})
