"""The prefix-level survival model on synthetic blocks whose hazards depend on each position's
features and on the previous position's: its survival is monotone, it beats the position-only
curve held out, and the fold protocol scores every block with a model that never saw its prompt."""

import json

import numpy as np
import pytest
import torch

from vskip.engine.policy.prefix import survival_nll
from vskip.study.prefix.model import PrefixTrainConfig, held_out_survival, nll, survival, train_prefix_model
from vskip.study.rotations import rotations
from vskip.study.traces import folds

G, F = 8, 3


def _blocks(rng, n):
    X = rng.normal(size=(n, G, F)).astype(np.float32)
    prev = np.concatenate([np.zeros((n, 1)), X[:, :-1, 1]], axis=1)
    h = 1 / (1 + np.exp(-(1.5 * X[:, :, 0] + 1.0 * prev - 1.5)))
    S = np.cumprod(1 - h, axis=1)
    L = (S >= rng.random(n)[:, None]).sum(axis=1)
    return X, L


def _baseline_nll(L_train, L_test):
    """The position-only model: the training blocks' empirical hazard at each position."""
    at_risk = np.array([(L_train >= j).sum() for j in range(G)])
    fail = np.array([(L_train == j).sum() for j in range(G)])
    h = np.clip(fail / np.maximum(at_risk, 1), 1e-4, 1 - 1e-4)
    return survival_nll(np.repeat(h[None, :], len(L_test), axis=0), L_test).mean()


def test_the_model_learns_the_block_and_stays_monotone():
    torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    X, L = _blocks(rng, 1200)
    Xt, Lt = _blocks(rng, 400)
    model, mean, std = train_prefix_model(X, L, PrefixTrainConfig(epochs=12, hidden=32), Xt[:100], Lt[:100])
    S = survival(model, mean, std, Xt)
    assert np.all(np.diff(S, axis=1) <= 1e-9) and np.all((S >= 0) & (S <= 1))
    assert nll(model, mean, std, Xt, Lt) < _baseline_nll(L, Lt) - 0.1
    torch_nll = nll(model, mean, std, Xt[:50], Lt[:50])  # the torch objective equals the numpy one
    h = 1 - S[:50] / np.concatenate([np.ones((50, 1)), S[:50, :-1]], axis=1)
    assert torch_nll == pytest.approx(survival_nll(h, Lt[:50]).mean(), rel=1e-3)


def test_every_block_is_scored_by_a_model_that_never_saw_its_prompt():
    torch.set_num_threads(1)
    rng = np.random.default_rng(1)
    n_prompts, per = 25, 12
    X, L = _blocks(rng, n_prompts * per)
    ids = [f"HumanEval/{i}" for i in range(n_prompts)]
    prompt = np.repeat(np.arange(n_prompts), per)
    rots = rotations(folds(ids))
    S = held_out_survival(X, L, prompt, ids, rots, PrefixTrainConfig(epochs=3, hidden=16))
    assert not np.isnan(S).any()
    for rot in rots:  # each prompt is tested by exactly one rotation, which did not train on it
        assert not set(rot.test) & set(rot.train) and not set(rot.test) & set(rot.val)
    assert sorted(p for r in rots for p in r.test) == sorted(ids)


# ----------------------------------------------------------------------------- the fold predictor


def _traces(n_prompts=40, per=15, seed=2):
    """A TraceSet of synthetic blocks (features in the first F of the 19 columns, no hidden states)."""
    from vskip.study.traces import TraceSet

    rng = np.random.default_rng(seed)
    X, L = _blocks(rng, n_prompts * per)
    feats = np.zeros((len(L), G, 19), np.float32)
    feats[:, :, :F] = X
    prompt = np.repeat(np.arange(n_prompts), per)
    return TraceSet(gamma=G, prompt_ids=[f"HumanEval/{i}" for i in range(n_prompts)], features=feats, hidden=None,
                    confidence=np.full((len(L), G), 0.5, np.float32), L=L, K=np.zeros(len(L), np.int64),
                    prompt=prompt, round=np.tile(np.arange(per), n_prompts))


def test_prefix_rotations_keep_test_calibration_and_training_apart():
    from vskip.study.rotations import prefix_rotations

    ids = [f"HumanEval/{i}" for i in range(40)]
    fl = folds(ids)
    for c in (1, 2, 3):
        rots = prefix_rotations(fl, calibration_folds=c)
        assert sorted(p for r in rots for p in r.test) == sorted(ids)
        for r in rots:
            parts = [set(r.test), set(r.cal), set(r.train), set(r.val)]
            assert sum(map(len, parts)) == len(ids) and set().union(*parts) == set(ids)
            assert len(r.cal) == sum(len(fl[(r.index + i) % 5]) for i in range(1, c + 1))
            assert r.val and r.train
    with pytest.raises(ValueError, match="calibration-folds"):
        prefix_rotations(fl, calibration_folds=4)


def test_the_prefix_predictor_scores_by_fold_and_calibrates_its_threshold(tmp_path):
    from vskip.engine.models.protocols import DraftBlock
    from vskip.engine.policy.prefix import risk_curve
    from vskip.study.predictor import load_predictor
    from vskip.study.prefix.model import PrefixPredictor, train_prefix_predictor

    torch.set_num_threads(1)
    ts = _traces()
    man = train_prefix_predictor(ts, PrefixTrainConfig(epochs=4, hidden=16), tmp_path, progress=False)
    assert [e["n_cal_prompts"] for e in man["rotations"]] == [8] * 5
    pp = load_predictor(tmp_path, "prefix")
    assert isinstance(pp, PrefixPredictor) and pp.gamma == G
    S = pp.score_traces(ts)
    assert not np.isnan(S).any() and np.all(np.diff(S, axis=1) <= 1e-9)
    b = 17  # online scores of one block equal its held-out survival's factors
    tid = ts.prompt_ids[ts.prompt[b]]
    q = pp.scores(DraftBlock(np.zeros(G, np.int64), ts.confidence[b]), ts.features[b], tid)
    assert np.allclose(np.cumprod(q), S[b], atol=1e-5)
    # the threshold: never skip when the calibration fold is too small for alpha (8 prompts need
    # alpha >= 1/9), and a larger alpha never asks for a higher threshold
    assert pp.threshold(tid, 0.05) == float("inf")
    lams = [pp.threshold(tid, a) for a in (0.12, 0.2, 0.4, 0.8)]
    assert all(x >= y for x, y in zip(lams, lams[1:])) and lams[-1] < 1.0
    # each rotation's stored risk curve is its own model replayed on its calibration prompts, and
    # the threshold it gives meets the conformal bound there
    r = pp._rots[pp.rotation_of(tid)]
    cal = [(survival(r.model, r.mean, r.std, ts.features[ts.blocks_of([p])]), ts.L[ts.blocks_of([p])])
           for p in r.rotation.cal]
    assert np.allclose(risk_curve(cal, r.grid), r.risk)
    lam = pp.threshold(tid, 0.4)
    i = int(np.searchsorted(r.grid, lam))
    assert r.n_cal / (r.n_cal + 1) * r.risk[i] + 1 / (r.n_cal + 1) <= 0.4
    assert i == 0 or r.n_cal / (r.n_cal + 1) * r.risk[i - 1] + 1 / (r.n_cal + 1) > 0.4
    with pytest.raises(ValueError, match="no test fold"):
        pp.threshold("HumanEval/99", 0.2)
    assert [lam for _, _, lam in pp.thresholds(0.4)] == [pp.threshold(r.rotation.test[0], 0.4) for r in pp._rots]


def test_a_run_says_which_folds_cannot_keep_alpha(tmp_path, capsys):
    from vskip.study.predictor import load_predictor, note_thresholds
    from vskip.study.prefix.model import train_prefix_predictor

    torch.set_num_threads(1)
    train_prefix_predictor(_traces(), PrefixTrainConfig(epochs=1, hidden=8), tmp_path, progress=False)
    pp = load_predictor(tmp_path, "prefix")
    note_thresholds(pp, 0.05)  # 8 calibration prompts per fold support alpha >= 1/9 only
    err = capsys.readouterr().err
    assert "needs at least 19 calibration prompts" in err and "fold 0 has 8" in err
    note_thresholds(pp, 0.5)
    assert "never skipped" not in capsys.readouterr().err
    # what a run's config.json keeps of it: no rotation skips at 0.05, each its own lam at 0.5
    from vskip.study.predictor import threshold_record

    assert threshold_record(pp, None) is None
    rec = threshold_record(pp, 0.05)
    assert rec["alpha"] == 0.05 and [r["lam"] for r in rec["rotations"]] == [None] * 5
    assert [r["n_calibration"] for r in rec["rotations"]] == [n for _, n, _ in pp.thresholds(0.05)]
    assert [r["lam"] for r in threshold_record(pp, 0.5)["rotations"]] == [lam for _, _, lam in pp.thresholds(0.5)]


def test_a_run_records_the_thresholds_it_decoded_with(tmp_path):
    """`vskip run --policy prefix --alpha A` writes each rotation's calibrated lam into config.json,
    so the promise a run kept can be read from the run itself; a resume rewrites the same record."""
    from fakes import trace_run
    from test_sweep import IDS, fake_pair

    from vskip.engine.decode import DecodeConfig
    from vskip.engine.models.config import ModelConfig
    from vskip.engine.policy import PolicyConfig
    from vskip.files import read_json
    from vskip.study import runner
    from vskip.study.predictor import load_predictor
    from vskip.study.prefix.model import train_prefix_predictor
    from vskip.study.runner import RunConfig

    torch.set_num_threads(1)
    trace_run(tmp_path / "strict", 15)
    from vskip.study.traces import load_traces

    train_prefix_predictor(load_traces(tmp_path / "strict"), PrefixTrainConfig(epochs=1, hidden=8), tmp_path / "p",
                           progress=False)
    pp = load_predictor(tmp_path / "p", "prefix")
    cfg = RunConfig(task="humaneval", policy=PolicyConfig(name="prefix", survival="model", alpha=0.5, cost_ratio=0.05),
                    decode=DecodeConfig(gamma=8, max_new_tokens=24, task="humaneval"), models=ModelConfig(), ids=IDS,
                    score=False, predictor=str(tmp_path / "p"))
    runner.run(cfg, tmp_path / "r", progress=False, pair=fake_pair(None, True))
    rec = read_json(tmp_path / "r" / "config.json", "run configuration")["thresholds"]
    assert rec["alpha"] == 0.5
    assert [(r["rotation"], r["n_calibration"], r["lam"]) for r in rec["rotations"]] == pp.thresholds(0.5)
    runner.run(cfg, tmp_path / "r", progress=False, pair=fake_pair(None, True))  # a resume keeps it
    assert read_json(tmp_path / "r" / "config.json", "run configuration")["thresholds"] == rec
    strict = RunConfig(task="humaneval", policy=PolicyConfig(name="strict"),
                       decode=DecodeConfig(gamma=8, max_new_tokens=24, task="humaneval"), models=ModelConfig(),
                       ids=IDS, score=False)
    runner.run(strict, tmp_path / "s", progress=False, pair=fake_pair(None, True))
    assert "thresholds" not in read_json(tmp_path / "s" / "config.json", "run configuration")


def test_the_prefix_policy_reads_the_model_and_its_calibrated_threshold(tmp_path):
    """Traces from the fake pair → `train-predictor --kind prefix` → decode with `--policy prefix
    --predictor DIR --alpha A`: each prompt gets its fold's threshold, and the model's survival
    (not the confidences' product) schedules the skips."""
    import json

    from fakes import FakeDrafter, FakeVerifier, trace_run

    from vskip.cli import build_parser
    from vskip.engine.decode import DecodeConfig, decode
    from vskip.engine.policy import PolicyConfig
    from vskip.study.predictor import load_predictor
    from vskip.study.traces import load_traces

    runs = tmp_path / "strict"
    prompts = trace_run(runs, 15)
    parser = build_parser()
    a = parser.parse_args(["train-predictor", "--kind", "prefix", "--traces", str(runs), "--out", str(tmp_path / "p"),
                           "--epochs", "2", "--hidden", "8", "--device", "cpu", "--quiet"])
    assert a.fn(a) == 0
    pp = load_predictor(tmp_path / "p", "prefix")
    a = parser.parse_args(["run", "--task", "humaneval", "--policy", "prefix", "--predictor", str(tmp_path / "p"),
                           "--alpha", "0.3", "--out", str(tmp_path / "r")])
    from vskip.commands.flags import settings

    pol = settings(a).policy
    assert pol.survival == "model" and pol.alpha == 0.3 and pol.predictor_kind == "prefix"

    seen = []

    class Spy:
        def __init__(self, lam, q):
            self.lam, self.q = lam, q

        def threshold(self, task_id, alpha):
            seen.append((task_id, alpha))
            return self.lam

        def scores(self, block, features, task_id=None):
            assert features.shape == (len(block.tokens), 19)
            return np.full(len(block.tokens), self.q)

    dcfg = DecodeConfig(gamma=8, max_new_tokens=40, task="humaneval")
    pol = PolicyConfig(name="prefix", survival="model", alpha=0.3, cost_ratio=0.05, k_min=1)
    never = decode(prompts["HumanEval/3"], FakeDrafter(0.2, 3), FakeVerifier(), pol, dcfg, Spy(float("inf"), 1.0),
                   task_id="HumanEval/3")
    assert never.skipped_rounds == 0 and seen == [("HumanEval/3", 0.3)]
    sure = decode(prompts["HumanEval/3"], FakeDrafter(0.2, 3), FakeVerifier(), pol, dcfg, Spy(0.5, 1.0),
                  task_id="HumanEval/3")
    assert sure.skipped_rounds > 0  # the model's survival 1.0 passes lam 0.5 however unsure the drafter
    doubt = decode(prompts["HumanEval/3"], FakeDrafter(0.2, 3), FakeVerifier(), pol, dcfg, Spy(0.5, 0.1),
                   task_id="HumanEval/3")
    assert doubt.skipped_rounds == 0
    res = decode(prompts["HumanEval/3"], FakeDrafter(0.2, 3), FakeVerifier(), pol, dcfg, pp, task_id="HumanEval/3")
    assert len(res.tokens) > 0 and res.predict_seconds > 0
    with pytest.raises(ValueError, match="needs a trained predictor"):
        decode(prompts["HumanEval/3"], FakeDrafter(0.2, 3), FakeVerifier(), pol, dcfg, None, task_id="HumanEval/3")

    # a DAgger-style round: traces decoded by the scheduler itself (shadow-verified skips) join training
    onp = tmp_path / "onpolicy"
    trace_run(onp, 15, PolicyConfig(name="prefix", survival="model", lam=0.05, cost_ratio=0.05), pp)
    on = load_traces(onp)
    assert on.dropped_unknown_L == 0 and (on.K > 0).any()  # skipped blocks, each labelled by the shadow verifier
    a = parser.parse_args(["train-predictor", "--kind", "prefix", "--traces", str(runs), "--on-policy", str(onp),
                           "--out", str(tmp_path / "p2"), "--epochs", "1", "--hidden", "8", "--device", "cpu",
                           "--quiet"])
    assert a.fn(a) == 0
    man = json.loads((tmp_path / "p2" / "prefix" / "manifest.json").read_text())
    man1 = json.loads((tmp_path / "p" / "prefix" / "manifest.json").read_text())
    assert man["on_policy_traces"] == [str(onp)]
    assert all(e2["n_train_blocks"] > e1["n_train_blocks"] for e1, e2 in zip(man1["rotations"], man["rotations"]))
    a = parser.parse_args(["train-predictor", "--kind", "prefix", "--traces", str(runs), "--on-policy", str(runs),
                           "--out", str(tmp_path / "p3"), "--device", "cpu", "--quiet"])
    with pytest.raises(ValueError, match="--policy prefix"):
        a.fn(a)
    # with --on-policy the thresholds are calibrated on the on-policy blocks unless told otherwise;
    # --calibrate-on strict keeps the same model and takes them from the Strict SDD blocks
    a = parser.parse_args(["train-predictor", "--kind", "prefix", "--traces", str(runs), "--on-policy", str(onp),
                           "--calibrate-on", "strict", "--out", str(tmp_path / "p4"), "--epochs", "1", "--hidden",
                           "8", "--device", "cpu", "--quiet"])
    assert a.fn(a) == 0
    man4 = json.loads((tmp_path / "p4" / "prefix" / "manifest.json").read_text())
    assert man["calibrate_on"] == "on-policy" and man4["calibrate_on"] == "strict" and man1["calibrate_on"] == "strict"
    assert man["calibration_traces"] == [str(onp)] and man4["calibration_traces"] == [str(runs)]
    # a second round: the option once per round, every round's blocks trained on
    a = parser.parse_args(["train-predictor", "--kind", "prefix", "--traces", str(runs), "--on-policy", str(onp),
                           "--on-policy", str(onp), "--calibrate-on", "on-policy", "--out", str(tmp_path / "p6"),
                           "--epochs", "1", "--hidden", "8", "--device", "cpu", "--quiet"])
    assert a.fn(a) == 0
    man6 = json.loads((tmp_path / "p6" / "prefix" / "manifest.json").read_text())
    assert man6["on_policy_rounds"] == [[str(onp)], [str(onp)]] and man4["on_policy_rounds"] == [[str(onp)]]
    assert all(2 * e4["n_train_blocks"] - e1["n_train_blocks"] == e6["n_train_blocks"]
               for e1, e4, e6 in zip(man1["rotations"], man4["rotations"], man6["rotations"]))
    a = parser.parse_args(["train-predictor", "--kind", "prefix", "--traces", str(runs), "--calibrate-on", "on-policy",
                           "--out", str(tmp_path / "p5"), "--device", "cpu", "--quiet"])
    with pytest.raises(ValueError, match="needs --on-policy"):
        a.fn(a)


def _shifted(ts, drop=2):
    """The same blocks with every accepted length cut by ``drop``: blocks that look alike but fail
    earlier, as blocks drafted after wrong skips may."""
    from dataclasses import replace

    return replace(ts, L=np.maximum(ts.L - drop, 0))


def test_calibrating_on_policy_blocks_raises_the_threshold_where_they_fail_earlier(tmp_path):
    from vskip.engine.policy.prefix import risk_curve
    from vskip.study.predictor import load_predictor
    from vskip.study.prefix.model import block_inputs, train_prefix_predictor

    torch.set_num_threads(1)
    ts = _traces()
    onp = _shifted(ts)
    cfg = PrefixTrainConfig(epochs=3, hidden=8)
    train_prefix_predictor(ts, cfg, tmp_path / "s", progress=False, on_policy=onp)
    train_prefix_predictor(ts, cfg, tmp_path / "o", progress=False, on_policy=onp, calibrate_on="on-policy")
    ps, po = load_predictor(tmp_path / "s", "prefix"), load_predictor(tmp_path / "o", "prefix")
    S = ps.score_traces(ts)
    assert np.allclose(S, po.score_traces(ts))  # one model: only the calibration blocks differ
    for rs, ro in zip(ps._rots, po._rots):
        cal = [(survival(ro.model, ro.mean, ro.std, block_inputs(ts, ts.blocks_of([p]))), onp.L[ts.blocks_of([p])])
               for p in ro.rotation.cal]  # each rotation's own model replayed on the on-policy L
        assert np.allclose(risk_curve(cal, ro.grid), ro.risk, atol=1e-6)
        assert np.all(ro.risk >= rs.risk - 1e-12)
    lam_s = [lam for _, _, lam in ps.thresholds(0.3)]
    lam_o = [lam for _, _, lam in po.thresholds(0.3)]
    assert all(o >= s for s, o in zip(lam_s, lam_o)) and lam_o != lam_s
    with pytest.raises(ValueError, match="on-policy traces"):
        train_prefix_predictor(ts, cfg, tmp_path / "x", progress=False, calibrate_on="on-policy")
    # two rounds, oldest first: trained on both, calibrated on the last one's blocks only
    later = _shifted(ts, drop=4)
    man = train_prefix_predictor(ts, cfg, tmp_path / "r2", progress=False, on_policy=[onp, later],
                                 calibrate_on="on-policy")
    p2 = load_predictor(tmp_path / "r2", "prefix")
    for r in p2._rots:
        cal = [(survival(r.model, r.mean, r.std, block_inputs(ts, ts.blocks_of([p]))), later.L[ts.blocks_of([p])])
               for p in r.rotation.cal]
        assert np.allclose(risk_curve(cal, r.grid), r.risk, atol=1e-6)
    one = json.loads((tmp_path / "o" / "prefix" / "manifest.json").read_text())
    assert all(e2["n_train_blocks"] > e1["n_train_blocks"] for e1, e2 in zip(one["rotations"], man["rotations"]))
    assert len(man["on_policy_rounds"]) == 2


def test_the_promise_replayed_on_new_blocks_and_on_shifted_ones(tmp_path):
    """Each prompt's blocks replayed at its own rotation's threshold: the mean of the per-prompt
    losses, zero where the fold is too small for alpha, and broken on blocks that fail earlier than
    the calibration's."""
    from dataclasses import replace

    from vskip.engine.policy.prefix import prompt_loss
    from vskip.study.predictor import load_predictor
    from vskip.study.prefix.calibrate import replay_promise
    from vskip.study.prefix.model import train_prefix_predictor

    torch.set_num_threads(1)
    ts = _traces()
    train_prefix_predictor(ts, PrefixTrainConfig(epochs=4, hidden=16), tmp_path, progress=False)
    pp = load_predictor(tmp_path, "prefix")
    rows = replay_promise(pp, ts, (0.05, 0.3), n_boot=500)
    assert rows[0]["replayed_loss"] == 0.0 and rows[0]["skipped_blocks"] == 0  # 8 prompts per fold: never skip
    S = pp.score_traces(ts)
    want = np.mean([prompt_loss(S[ts.prompt == i], ts.L[ts.prompt == i], pp.threshold(p, 0.3))
                    for i, p in enumerate(ts.prompt_ids)])
    r = rows[1]
    assert r["n_prompts"] == 40 and r["replayed_loss"] == pytest.approx(want) and r["skipped_blocks"] > 0
    # the thresholds replayed, one per rotation: none at 0.05 (too few calibration prompts), each rotation's at 0.3
    assert rows[0]["thresholds"] == [None] * 5
    assert r["thresholds"] == [lam for _, _, lam in pp.thresholds(0.3)]
    assert r["replayed_loss_ci95"][0] <= r["replayed_loss"] <= r["replayed_loss_ci95"][1]
    assert r["verdict"] == ("within" if want <= 0.3 else "above, unresolved" if r["replayed_loss_ci95"][0] <= 0.3
                            else "exceeded")
    worse = replay_promise(pp, _shifted(ts, drop=8), (0.3,), n_boot=500)[0]
    assert worse["verdict"] == "exceeded" and worse["wrong_skip_share"] == 1.0
    # a prompt in no test fold of the model is left out
    other = replace(ts, prompt_ids=["MBPP/1"] + ts.prompt_ids[1:])
    assert replay_promise(pp, other, (0.3,), n_boot=10)[0]["n_prompts"] == 39


def test_alpha_needs_the_prefix_model():
    from vskip.engine.policy import PolicyConfig

    with pytest.raises(ValueError, match="alpha"):
        PolicyConfig(name="prefix", alpha=0.05)
    with pytest.raises(ValueError, match="prefix"):
        PolicyConfig(name="raw", survival="model")
    with pytest.raises(ValueError, match="alpha must lie"):
        PolicyConfig(name="prefix", survival="model", alpha=1.5)
    assert PolicyConfig(name="prefix", survival="model", lam=float("inf")).learned


# ----------------------------------------------------------------------------- online calibration


def test_online_calibration_from_decodes_to_a_tested_threshold(tmp_path, capsys):
    """`calibrate-online init` → decode its calibration prompts at a grid of --lam → `choose` →
    `--alpha A` on its test prompts: the thresholds are CRC on the envelope of the very losses the
    report scores, a calibration prompt cannot be tested, and runs of another model or other
    settings are refused."""
    import json

    from fakes import trace_run
    from test_sweep import fake_pair

    from vskip.cli import build_parser
    from vskip.engine.decode import DecodeConfig
    from vskip.engine.metrics import prompt_disagreement
    from vskip.engine.models.config import ModelConfig
    from vskip.engine.policy import PolicyConfig
    from vskip.engine.policy.prefix import crc_online
    from vskip.study import runner
    from vskip.study.predictor import load_predictor
    from vskip.study.prefix.calibrate import online_losses
    from vskip.study.prefix.model import train_prefix_predictor, write_online_predictor
    from vskip.study.rundir import load_run
    from vskip.study.runner import RunConfig
    from vskip.study.traces import load_traces

    torch.set_num_threads(1)
    trace_run(tmp_path / "strict", 40)
    train_prefix_predictor(load_traces(tmp_path / "strict"), PrefixTrainConfig(epochs=1, hidden=8), tmp_path / "p",
                           calibration_folds=2, progress=False)
    parser = build_parser()
    o = tmp_path / "online"
    a = parser.parse_args(["calibrate-online", "init", "--predictor", str(tmp_path / "p"), "--rotation", "1",
                           "--out", str(o)])
    assert a.fn(a) == 0
    pp = load_predictor(o, "prefix")
    cal, test = pp.online_ids
    assert len(cal) == 16 and len(test) == 8 and not set(cal) & set(test)
    assert (o / "ids" / "humaneval.cal").read_text().strip().split(",") == cal
    with pytest.raises(ValueError, match="exists: choose a new --out"):
        write_online_predictor(tmp_path / "p", 1, o)
    with pytest.raises(ValueError, match="no rotation 7"):
        write_online_predictor(tmp_path / "p", 7, tmp_path / "o7")

    def decode(name, ids, max_new=24, predictor=o, **pol):
        cfg = RunConfig(task="humaneval", policy=PolicyConfig(name="prefix", survival="model", cost_ratio=0.05, **pol),
                        decode=DecodeConfig(gamma=8, max_new_tokens=max_new, task="humaneval"), models=ModelConfig(),
                        ids=tuple(ids), score=False, predictor=str(predictor))
        runner.run(cfg, tmp_path / name, progress=False, pair=fake_pair(None, True))
        return tmp_path / name

    runs = [decode(f"cal{lam}", cal, lam=lam) for lam in (0.9, 0.6, 0.3, 0.05)]
    grid, ids, x, _ = online_losses(pp, runs)
    assert grid.tolist() == [0.9, 0.6, 0.3, 0.05] and ids == sorted(cal)
    assert np.allclose(x[2], prompt_disagreement(load_run(runs[2]), ids)) and x.max() > 0
    a = parser.parse_args(["calibrate-online", "choose", str(o), *map(str, runs), "--alpha", "0.3", "--alpha", "0.05"])
    assert a.fn(a) == 0
    assert "alpha 0.3: lam" in capsys.readouterr().out
    man = json.loads((o / "prefix" / "manifest.json").read_text())
    want = crc_online(grid, x, 0.3).lam
    assert man["online"]["thresholds"]["0.3"] == (None if want == float("inf") else want)
    rec = json.loads((o / "prefix" / "online.json").read_text())
    assert rec["n_prompts"] == 16 and np.allclose(rec["risk"], x.mean(1))
    pp = load_predictor(o, "prefix")
    assert pp.threshold(test[0], 0.3) == want
    with pytest.raises(ValueError, match="calibrated the online thresholds"):
        pp.threshold(cal[0], 0.3)
    with pytest.raises(ValueError, match="no online threshold for alpha 0.1"):
        pp.threshold(test[0], 0.1)
    with pytest.raises(ValueError, match="no online threshold for alpha 0.1"):  # a run refused so ...
        decode("early", test[:1], alpha=0.1)
    assert not list((tmp_path / "early").glob("*.json*"))  # ... leaves no run file that would block its retry
    r = decode("test", test[:2], alpha=0.3)
    cfg = json.loads((r / "config.json").read_text())
    assert cfg["thresholds"]["rotations"] == [{"rotation": 1, "n_calibration": 16,
                                               "lam": None if want == float("inf") else want}]
    with pytest.raises(ValueError, match="differs in decode/max_new_tokens 32"):  # the thresholds hold for 24 tokens
        decode("longer", test[:1], max_new=32, alpha=0.3)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        online_losses(pp, runs + [tmp_path / "nowhere"])
    # refused: a run at another budget, a run missing a calibration prompt, a run of another model
    for bad, match in ((decode("long", cal, max_new=32, lam=0.5), "differs from the other runs in decode/max_new_tokens"),
                       (decode("few", cal[:3], lam=0.5), "lack 13 calibration prompts"),
                       (decode("other", cal, predictor=tmp_path / "p", lam=0.5), "not .*online")):
        with pytest.raises(ValueError, match=match):
            online_losses(pp, runs + [bad])
    with pytest.raises(ValueError, match="outside the calibration folds"):
        online_losses(pp, [decode("t", test[:1], lam=0.5)])
    # refused: a run of the same thresholds sampled otherwise, or with other models (as its config.json records)
    import shutil

    for name, part, key, value in (("temperature", "sampling", "temperature", 0.6), ("top_p", "sampling", "top_p", 0.9),
                                   ("speculative", "sampling", "speculative", True),
                                   ("verifier", "models", "verifier", "another"), ("drafter", "models", "drafter", "x"),
                                   ("prior", "models", "copy_prior", "0" * 64)):
        mixed = tmp_path / f"mixed-{name}"
        shutil.copytree(runs[1], mixed)
        rec = json.loads((mixed / "config.json").read_text())
        (rec["run"]["decode"]["sampling"] if part == "sampling" else rec["models"])[key] = value
        (mixed / "config.json").write_text(json.dumps(rec))
        what = "decode/sampling" if part == "sampling" else f"identity/{key}"
        with pytest.raises(ValueError, match=f"mixed-{name} differs from the other runs in {what}"):
            online_losses(pp, runs + [mixed])
