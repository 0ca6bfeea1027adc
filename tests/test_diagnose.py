"""Offline diagnostics: AUROC, position baselines, the permutation diagnostic and Proposition 1."""

import json

import numpy as np
import pytest
from fakes import FakeDrafter, FakeVerifier
from hypothesis import given, settings
from hypothesis import strategies as st

from vskip.engine.decode import DecodeConfig, decode
from vskip.engine.policy import PolicyConfig, feasible_prefix
from vskip.study.diagnose import (auroc, feasible_prefix_rows, permutation_diagnostic, permutation_pool, permute_pairs,
                                  position_rates, positionwise_auroc, positionwise_bce, proposition1)
from vskip.study.predictor import PredictorTrainConfig, train_predictor
from vskip.study.rotations import Rotation
from vskip.study.traces import TraceSet, append_traces, survival_labels


def brute_auroc(s, y):
    pos, neg = s[y], s[~y]
    wins = (pos[:, None] > neg[None, :]).sum() + 0.5 * (pos[:, None] == neg[None, :]).sum()
    return wins / (len(pos) * len(neg))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 6), st.booleans()), min_size=2, max_size=60))
def test_auroc_matches_pairwise_count(pairs):
    s = np.array([p[0] / 6 for p in pairs])  # few levels: many ties
    y = np.array([p[1] for p in pairs])
    a = auroc(s, y)
    if y.all() or not y.any():
        assert np.isnan(a)
    else:
        assert a == pytest.approx(brute_auroc(s, y), abs=1e-12)


def test_auroc_extremes_and_min_class():
    assert auroc(np.array([0.1, 0.2, 0.8, 0.9]), np.array([0, 0, 1, 1])) == 1.0
    assert auroc(np.array([0.1, 0.2, 0.8, 0.9]), np.array([1, 1, 0, 0])) == 0.0
    rng = np.random.default_rng(0)
    S = rng.uniform(size=(30, 2))
    Y = np.zeros((30, 2))
    Y[:12, 0] = 1
    Y[:5, 1] = 1
    r = positionwise_auroc(S, Y, np.ones_like(Y, bool), min_class=10)
    assert np.isfinite(r.auroc[0]) and np.isnan(r.auroc[1])  # 5 positives < 10
    assert r.positives.tolist() == [12, 5] and r.negatives.tolist() == [18, 25]


@settings(max_examples=80, deadline=None)
@given(st.integers(1, 12), st.integers(0, 10**6), st.sampled_from(["raw", "marginal", "conditional"]),
       st.sampled_from([(0.9, 0.93), (0.9, 0.9), (0.5, 0.3), (0.95, 0.99)]))
def test_rowwise_feasible_prefix_is_the_policys(gamma, seed, signal, gates):
    rng = np.random.default_rng(seed)
    Q = np.where(rng.random((40, gamma)) < 0.7, rng.uniform(0.85, 1.0, (40, gamma)), rng.uniform(0, 1, (40, gamma)))
    Q[0] = gates[0]  # exactly at a threshold
    got = feasible_prefix_rows(signal, Q, *gates)
    want = [feasible_prefix(signal, q, *gates) for q in Q]
    assert got.tolist() == want


def dependent_blocks(n=2000, gamma=16, seed=0):
    """Strong within-block dependence: a block is either confident up to its L (then its scores
    stay high until L and drop after) or low everywhere; L is long for confident blocks."""
    rng = np.random.default_rng(seed)
    good = rng.random(n) < 0.4
    L = np.where(good, rng.integers(10, gamma + 1, n), rng.integers(0, 4, n))
    j = np.arange(1, gamma + 1)
    S = np.where(good[:, None] & (j[None, :] <= L[:, None]), rng.uniform(0.96, 1.0, (n, gamma)),
                 rng.uniform(0.2, 0.95, (n, gamma)))
    return S, L


def test_permutation_preserves_positionwise_pairs_and_breaks_blocks():
    S, L = dependent_blocks()
    gamma = S.shape[1]
    Y = survival_labels("marginal", L, gamma)[0]
    rng = np.random.default_rng(1)
    for signal in ("raw", "conditional"):
        pool = permutation_pool(signal, L, gamma)
        S2, Y2 = permute_pairs(S, Y, pool, rng)
        for j in range(gamma):
            m = pool[:, j]
            before = sorted(zip(S[m, j], Y[m, j]))
            after = sorted(zip(S2[m, j], Y2[m, j]))
            assert before == after  # the same score–label pairs at every position
            assert np.array_equal(S2[~m, j], S[~m, j])  # rows outside the pool untouched
        # Hence every positionwise metric is unchanged.
        M = survival_labels("conditional", L, gamma)[1] if signal == "conditional" else np.ones_like(Y, bool)
        a, b = positionwise_auroc(S, Y, M), positionwise_auroc(S2, Y2, M)
        assert np.allclose(np.nan_to_num(a.auroc), np.nan_to_num(b.auroc))
    # ...but the permutation moves pairs across blocks.
    assert not np.array_equal(S2, S)
    # Conditional: only at-risk blocks (L >= j - 1) are pooled.
    pool = permutation_pool("conditional", L, gamma)
    assert np.array_equal(pool, L[:, None] >= np.arange(gamma)[None, :])


def test_permutation_collapses_feasible_prefix_under_dependence():
    S, L = dependent_blocks()
    r = permutation_diagnostic("raw", S, L, 0.90, 0.93, repetitions=20, seed=0)
    assert r.original > 4.0
    assert r.permuted_mean < 0.25 * r.original
    # Without within-block dependence, permuting changes little.
    rng = np.random.default_rng(3)
    Sind = rng.uniform(0.9, 1.0, size=S.shape)
    r2 = permutation_diagnostic("raw", Sind, L, 0.90, 0.93, repetitions=20, seed=0)
    assert abs(r2.permuted_mean - r2.original) < 0.1 * r2.original
    r3 = permutation_diagnostic("conditional", S, L, 0.90, 0.90, repetitions=5)
    assert r3.n_blocks == len(S) and r3.permuted_mean <= r3.original


def test_proposition1_matches_closed_forms():
    rng = np.random.default_rng(0)
    L_values = rng.integers(0, 17, size=500)
    r = proposition1(L_values, 16, rho=0.7, n=100_000, seed=1)
    p_L = (L_values[:, None] >= np.arange(1, 17)[None, :]).mean(0)
    assert np.allclose(r.p_L, p_L)
    assert np.allclose(r.shared_closed, p_L * 0.7) and np.allclose(r.indep_closed, p_L * 0.7 ** np.arange(1, 17))
    assert np.max(np.abs(r.z_shared)) < 4.5 and np.max(np.abs(r.z_indep)) < 4.5
    for K in (1, 4, 8):
        assert r.shared_sim[K - 1] == pytest.approx(p_L[K - 1] * 0.7, abs=5 * np.sqrt(0.25 / 100_000))
    # Identical positionwise statistics, different prefix frequencies.
    assert r.positionwise_max_z < 5.0
    ok = np.isfinite(r.auroc_shared)
    assert np.allclose(r.auroc_shared[ok], r.auroc_indep[ok], atol=0.02)
    assert r.shared_sim[7] > 5 * r.indep_sim[7]
    with pytest.raises(ValueError):
        proposition1(L_values, 16, q_lo=0.95, q_hi=0.5)


def test_position_baseline_uses_training_folds():
    g = 3
    L = np.array([3, 3, 0, 0, 3, 0])
    prompt = np.arange(6)
    ts = TraceSet(gamma=g, prompt_ids=list("abcdef"), features=np.zeros((6, g, 19), np.float32), hidden=None,
                  confidence=np.zeros((6, g), np.float32), L=L, K=np.zeros(6, np.int64), prompt=prompt,
                  round=np.zeros(6, np.int64))
    rot = [Rotation(0, ("e", "f"), train=("a", "b", "c"), val=("d",)),
           Rotation(1, ("a", "b", "c", "d"), train=("f",), val=("e",))]
    P = np.full((6, g), 0.5)
    r = positionwise_bce(ts, "marginal", P, rot)
    Y, M = survival_labels("marginal", L, g)
    base = np.empty((6, g))
    base[4:] = position_rates(Y[:3], M[:3])  # (2 + 1) / (3 + 2) from a, b, c
    base[:4] = position_rates(Y[5:], M[5:])  # (0 + 1) / (1 + 2) from f
    assert np.allclose(base[4], 0.6) and np.allclose(base[0], 1 / 3)
    want = -(Y * np.log(base) + (1 - Y) * np.log(1 - base)).mean()
    assert r.baseline_mean == pytest.approx(want)
    assert r.model_mean == pytest.approx(np.log(2))


def _fake_trace_run(path, n=10, gamma=8):
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps({"run": {"decode": {"gamma": gamma}, "policy": {"name": "strict"}}}))
    cfg = DecodeConfig(gamma=gamma, max_new_tokens=40, trace=True, task="humaneval")
    for i in range(n):
        res = decode([5 + i, 3 + 2 * i, 9, 4], FakeDrafter(0.2, i), FakeVerifier(), PolicyConfig(name="strict"), cfg)
        append_traces(path, f"HumanEval/{i}", res.traces)


def _parser():
    from vskip.cli import build_parser

    return build_parser()


def test_diagnose_raw_only(tmp_path):
    _fake_trace_run(tmp_path / "run")
    a = _parser().parse_args(["diagnose", str(tmp_path / "run"), "--out", str(tmp_path / "d"), "--repetitions", "5",
                              "--device", "cpu"])
    assert a.fn(a) == 0
    out = tmp_path / "d"
    for f in ("diagnose.md", "diagnose.json", "auroc.csv", "permutation.csv", "proposition1.csv", "auroc.png",
              "permutation.png", "proposition1.png", "bce.csv"):
        assert (out / f).exists(), f
    s = json.loads((out / "diagnose.json").read_text())
    assert [p["signal"] for p in s["permutation"]] == ["raw"] and s["bce"] == {} and s["promise"] == []
    assert "Permutation diagnostic" in (out / "diagnose.md").read_text()
    assert "Raw confidence near its gates" in (out / "diagnose.md").read_text()
    assert (out / "raw_confidence.csv").read_text().startswith("lo,hi,positions,share,agree,blocks")
    assert sum(b["positions"] for b in s["raw_confidence"]["bins"]) == s["blocks"] * s["gamma"]


def test_raw_reliability_counts_agreement_per_bin_and_finds_levels():
    from vskip.study.ranking import raw_reliability

    # 4 blocks of 4: two copy-like blocks at one level (0.9607), agreeing 3 deep and 1 deep
    C = np.array([[0.9607] * 4, [0.9607] * 4, [0.2, 0.3, 0.4, 0.5], [0.85, 0.99, 0.2, 0.2]], np.float32)
    L = np.array([3, 1, 0, 2])
    r = raw_reliability(C, L, k=3)
    by = {(b["lo"], b["hi"]): b for b in r["bins"]}
    b = by[(0.96, 0.97)]
    assert b["positions"] == 8 and b["agree"] == pytest.approx(4 / 8)  # 3 + 1 of the 8 positions
    assert b["blocks"] == 2 and b["L_ge_k"] == pytest.approx(0.5)
    assert by[(0.0, 0.5)]["positions"] == 5 and by[(0.0, 0.5)]["agree"] == 0.0 and by[(0.0, 0.5)]["blocks"] == 2
    assert by[(0.99, 0.999)]["positions"] == 1 and by[(0.99, 0.999)]["agree"] == 1.0
    assert sum(x["positions"] for x in r["bins"]) == 16 and sum(x["blocks"] for x in r["bins"]) == 4
    assert r["levels"][0] == {"value": pytest.approx(0.9607), "positions": 8, "share": 0.5, "agree": 0.5}
    # a confidence of exactly 1 falls in the last bin
    assert raw_reliability(np.ones((1, 4), np.float32), np.array([4]))["bins"][-1]["positions"] == 4


def test_diagnose_with_predictors(tmp_path):
    from vskip.study.diagnose import DiagnoseConfig, diagnose
    from vskip.study.traces import load_traces

    _fake_trace_run(tmp_path / "run")
    ts = load_traces(tmp_path / "run")
    for kind in ("marginal", "conditional"):
        train_predictor(ts, PredictorTrainConfig(kind, epochs=1, batch_size=256), tmp_path / "pred", progress=False)
    from vskip.study.prefix.model import PrefixTrainConfig, load_prefix_predictor, train_prefix_predictor

    train_prefix_predictor(ts, PrefixTrainConfig(epochs=2, hidden=8), tmp_path / "pred", progress=False)
    s = diagnose([tmp_path / "run"], tmp_path / "d", predictors=tmp_path / "pred",
                 cfg=DiagnoseConfig(repetitions=3, prop1_samples=5000))
    assert set(s["bce"]) == {"marginal", "conditional", "prefix"}
    assert [p["signal"] for p in s["permutation"]] == ["raw", "marginal", "conditional", "prefix"]
    # the prefix model's feasible prefix is the longest k with held-out P(L >= k) >= 0.90
    S = load_prefix_predictor(tmp_path / "pred").score_traces(ts)
    assert s["permutation"][3]["original"] == pytest.approx(float((S >= 0.9).sum(1).mean()))
    assert (tmp_path / "d" / "bce.png").exists()
    # the prefix model's thresholds replayed: 2 calibration prompts per fold keep no alpha here, so nothing skips
    assert [r["alpha"] for r in s["promise"]] == [0.01, 0.02, 0.05]
    assert all(r["replayed_loss"] == 0.0 and r["skipped_blocks"] == 0 and r["n_prompts"] == 10 for r in s["promise"])
    assert "The promise replayed" in (tmp_path / "d" / "diagnose.md").read_text()
    assert all(set(r["learned"]) == {"marginal", "conditional", "prefix"} for r in s["top_precision"] if r["blocks"])
    assert (tmp_path / "d" / "top_precision.csv").read_text().startswith("eta_b,eta_c,k,blocks")
    lines = (tmp_path / "d" / "promise.csv").read_text().splitlines()
    assert lines[0].startswith("alpha,replayed_loss") and lines[0].endswith(",thresholds")
    assert lines[1].endswith(",never;never;never;never;never")  # each rotation's lam: none kept at alpha 0.01
    with pytest.raises(ValueError, match="no marginal, conditional or prefix predictor"):
        diagnose([tmp_path / "run"], tmp_path / "e", predictors=tmp_path / "run")


def test_position_rates_smoothed_and_the_papers_empirical_rate():
    from vskip.study.diagnose import position_rates

    Y = np.array([[1, 0], [1, 1], [0, 0]], float)
    M = np.ones_like(Y, bool)
    assert np.allclose(position_rates(Y, M), [3 / 5, 2 / 5])
    assert np.allclose(position_rates(Y, M, smoothing=0.0), [2 / 3, 1 / 3])
    M[:, 1] = False  # no example at a position: the empirical rate is undefined, 0.5 stands in
    assert np.allclose(position_rates(Y, M, smoothing=0.0), [2 / 3, 0.5])


def test_top_precision_reads_the_top_of_each_ranking():
    from vskip.study.ranking import top_precision

    rng = np.random.default_rng(0)
    B, g = 400, 4
    L = rng.integers(0, 5, B)
    prompt = np.repeat(np.arange(40), 10)
    # raw: confident (0.99) exactly where L >= 3, on half of those blocks, else 0.2
    good = (L >= 3) & (rng.random(B) < 0.5)
    raw = np.where(good[:, None], 0.99, 0.2) * np.ones((B, g))
    n = int(good.sum())
    # a learned P(L >= k) that ranks the blocks with L < 3 first: its top n are all wrong
    learned = np.where(L[:, None] < 3, 0.9, 0.1) * np.ones((B, g))
    # and one that ranks as raw does
    same = np.where(good[:, None], 0.95, 0.05) * np.ones((B, g))
    (r,) = top_precision({"raw": raw, "prefix": learned, "marginal": same}, L, prompt, k=3, gates=((0.9, 0.9),),
                         n_boot=500)
    assert r["blocks"] == n and r["raw"] == 1.0 and r["mean_K"] == g
    assert r["learned"]["prefix"]["share"] == 0.0 and r["learned"]["prefix"]["minus_raw_ci95"][1] < 0
    assert r["learned"]["marginal"]["share"] == 1.0 and r["learned"]["marginal"]["minus_raw_ci95"] == [0.0, 0.0]
    # no block reaches the gate: nothing to compare
    (r,) = top_precision({"raw": raw * 0, "prefix": learned}, L, prompt, k=3, gates=((0.9, 0.9),))
    assert r["blocks"] == 0 and r["raw"] is None and r["learned"] == {}
