"""Trace storage, the A.7 folds and the survival labels."""

import json

import numpy as np
import pytest
from fakes import FakeDrafter, FakeVerifier
from safetensors import safe_open

from vskip.engine.decode import BlockTrace, DecodeConfig, decode
from vskip.engine.policy import PolicyConfig
from vskip.study.rotations import rotations
from vskip.study.traces import (append_traces, folds, load_traces, natural_sorted, survival_labels, trace_files,
                                trace_path)

GAMMA = 8


def traced(prompt, seed=0, policy="strict", shadow=True, max_new=40):
    cfg = DecodeConfig(gamma=GAMMA, max_new_tokens=max_new, shadow=shadow, trace=True, task="humaneval")
    pol = PolicyConfig.make(policy, k_min=1) if policy != "strict" else PolicyConfig(name="strict")
    return decode(prompt, FakeDrafter(0.2, seed), FakeVerifier(), pol, cfg)


# ----------------------------------------------------------------------------- storage


def test_round_trip(tmp_path):
    results = {f"HumanEval/{i}": traced([5 + i, 3, 9, 4], seed=i) for i in (0, 1, 2)}
    for tid, res in results.items():
        append_traces(tmp_path, tid, res.traces, gamma=GAMMA)
    assert [p.name for p in trace_files(tmp_path)] == ["HumanEval%2F0.safetensors", "HumanEval%2F1.safetensors",
                                                        "HumanEval%2F2.safetensors"]
    # Columnar file: one row per position, hidden in float16, L per position.
    res0 = results["HumanEval/0"]
    with safe_open(str(trace_path(tmp_path, "HumanEval/0")), framework="numpy") as f:
        meta = f.metadata()
        n = sum(t.features.shape[0] for t in res0.traces)
        assert f.get_tensor("features").shape == (n, 19) and f.get_tensor("features").dtype == np.float32
        assert f.get_tensor("hidden").dtype == np.float16 and f.get_tensor("hidden").shape == (n, 4)
        L = f.get_tensor("L")
        block = f.get_tensor("block")
        assert np.array_equal(L, [res0.traces[b].L for b in block])
        assert np.array_equal(f.get_tensor("position")[:GAMMA], np.arange(1, GAMMA + 1))
    assert meta["task_id"] == "HumanEval/0" and meta["gamma"] == str(GAMMA) and meta["d_model"] == "4"

    ts = load_traces(tmp_path)
    assert ts.gamma == GAMMA and ts.d_model == 4 and ts.prompt_ids == list(results)
    expected = [(tid, t) for tid, r in results.items() for t in r.traces if t.features.shape[0] == GAMMA]
    short = sum(1 for r in results.values() for t in r.traces if t.features.shape[0] < GAMMA)
    assert ts.n_blocks == len(expected) and ts.dropped_short == short > 0
    for b, (tid, t) in enumerate(expected):
        assert ts.prompt_ids[ts.prompt[b]] == tid
        assert np.array_equal(ts.features[b], t.features)
        assert np.array_equal(ts.confidence[b], t.confidence)
        assert np.array_equal(ts.hidden[b], t.hidden.astype(np.float16))
        assert (ts.L[b], ts.K[b], ts.round[b]) == (t.L, t.K, t.round)
    assert load_traces(tmp_path, hidden=False).hidden is None


def test_write_is_atomic_and_replaces(tmp_path):
    res = traced([7, 3, 9, 4])
    p1 = append_traces(tmp_path, "HumanEval/0", res.traces, gamma=GAMMA)
    res2 = traced([7, 3, 9, 4], seed=5)
    p2 = append_traces(tmp_path, "HumanEval/0", res2.traces, gamma=GAMMA)
    assert p1 == p2 and len(list((tmp_path / "traces").iterdir())) == 1  # no temporary file left behind
    ts = load_traces(tmp_path)
    full = [t for t in res2.traces if t.features.shape[0] == GAMMA]
    assert np.array_equal(ts.L, [t.L for t in full])


def test_only_finished_prompts_and_run_gamma(tmp_path):
    """A prompt whose sample line is missing (killed before it) is ignored; gamma comes from
    config.json, so a prompt whose blocks are all shorter contributes none."""
    (tmp_path / "config.json").write_text(json.dumps({"run": {"decode": {"gamma": GAMMA}, "policy": {"name": "strict"}}}))
    for i in range(3):
        append_traces(tmp_path, f"HumanEval/{i}", traced([5 + i, 3, 9, 4], seed=i).traces)
    short = traced([9, 9, 9, 9], max_new=5)
    append_traces(tmp_path, "HumanEval/3", short.traces)
    (tmp_path / "samples.jsonl").write_text("".join(json.dumps({"task_id": f"HumanEval/{i}"}) + "\n" for i in (0, 2, 3)))
    ts = load_traces(tmp_path)
    assert ts.prompt_ids == ["HumanEval/0", "HumanEval/2", "HumanEval/3"]
    assert set(ts.prompt.tolist()) == {0, 1}  # HumanEval/3 only has a shortened block
    assert ts.policies == ("strict",)


def test_unknown_L_blocks_are_dropped(tmp_path):
    t = lambda L, K: BlockTrace(0, np.zeros((GAMMA, 19), np.float32), None, np.ones(GAMMA, np.float32), L, K)  # noqa: E731
    append_traces(tmp_path, "p/0", [t(3, 0), t(None, 6), t(8, 0)], gamma=GAMMA)
    ts = load_traces(tmp_path)
    assert ts.L.tolist() == [3, 8] and ts.dropped_unknown_L == 1 and ts.hidden is None


def test_bad_trace_runs(tmp_path):
    with pytest.raises(FileNotFoundError):
        load_traces(tmp_path / "missing")
    with pytest.raises(ValueError, match="no block traces"):
        load_traces(tmp_path)
    a, b = tmp_path / "a", tmp_path / "b"
    append_traces(a, "HumanEval/0", traced([5, 3, 9, 4]).traces, gamma=GAMMA)
    append_traces(b, "HumanEval/0", traced([5, 3, 9, 4]).traces, gamma=GAMMA)
    with pytest.raises(ValueError, match="two trace runs"):
        load_traces([a, b])
    c = tmp_path / "c"
    append_traces(c, "HumanEval/1", traced([5, 3, 9, 4]).traces, gamma=GAMMA + 1)
    with pytest.raises(ValueError, match="disagree on gamma"):
        load_traces([a, c])


# ----------------------------------------------------------------------------- folds


HE = [f"HumanEval/{i}" for i in range(164)]


def test_natural_order():
    assert natural_sorted(["HumanEval/10", "HumanEval/2", "HumanEval/1"]) == ["HumanEval/1", "HumanEval/2", "HumanEval/10"]


def test_folds_follow_a7():
    fl = folds(reversed(HE))  # input order does not matter
    assert fl == folds(HE)
    assert [len(f) for f in fl] == [33, 33, 33, 33, 32]
    flat = [p for f in fl for p in f]
    assert sorted(flat) == sorted(HE) and len(set(flat)) == 164  # disjoint, cover everything
    order = np.random.RandomState(12345).permutation(164)
    assert flat == [HE[i] for i in order]  # ids in benchmark order, shuffled with seed 12345
    assert folds(HE, seed=1) != fl


def test_rotations():
    fl = folds(HE)
    rots = rotations(fl)
    tested = [p for r in rots for p in r.test]
    assert sorted(tested) == sorted(HE) and len(tested) == 164  # every prompt tested exactly once
    for r in rots:
        assert r.test == fl[r.index] and r.val == fl[(r.index + 1) % 5]
        assert set(r.train) == set(HE) - set(r.test) - set(r.val)
        assert not (set(r.train) & set(r.test)) and not (set(r.val) & set(r.test))


def test_too_few_prompts():
    with pytest.raises(ValueError, match="cannot fill 5 folds"):
        folds(["a", "b", "c"])


# ----------------------------------------------------------------------------- labels


def test_labels_worked_examples():
    L = np.array([2, 0, 4])
    y, m = survival_labels("marginal", L, 4)
    assert y.tolist() == [[1, 1, 0, 0], [0, 0, 0, 0], [1, 1, 1, 1]] and m.all()
    y, m = survival_labels("conditional", L, 4)
    assert m.tolist() == [[1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 1, 1]]
    assert y[m].tolist() == [1, 1, 0, 0, 1, 1, 1, 1]
    with pytest.raises(ValueError, match="unknown predictor kind"):
        survival_labels("joint", L, 4)
