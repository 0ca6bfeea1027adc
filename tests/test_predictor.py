"""Survival predictor training (A.7), checkpoints, and online use by fold."""

import json

import numpy as np
import pytest
import torch
from fakes import FakeDrafter, FakeVerifier, trace_run
from safetensors import safe_open

from vskip.engine.decode import DecodeConfig, decode
from vskip.engine.models.protocols import DraftBlock
from vskip.engine.policy import PolicyConfig
from vskip.study.diagnose import positionwise_bce
from vskip.study.predictor import (PredictorTrainConfig, examples, input_rows, load_fold_predictor, make_mlp,
                                   normalisation, train_predictor)
from vskip.study.rotations import rotations
from vskip.study.traces import TraceSet, append_traces, folds, load_traces

G, D = 6, 4


def synthetic(n_prompts=20, blocks=10, seed=0) -> TraceSet:
    """Blocks whose labels are a known function of one feature: column 4 is +1 where j <= L and
    -1 after (plus noise); the hidden state is noise, shifted per prompt."""
    rng = np.random.default_rng(seed)
    B = n_prompts * blocks
    L = rng.integers(0, G + 1, size=B)
    j = np.arange(1, G + 1)
    feats = rng.normal(size=(B, G, 19)).astype(np.float32)
    feats[:, :, 4] = np.where(j[None, :] <= L[:, None], 1.0, -1.0) + 0.3 * rng.normal(size=(B, G))
    prompt = np.repeat(np.arange(n_prompts), blocks)
    hidden = (rng.normal(size=(B, G, D)) + prompt[:, None, None]).astype(np.float16)
    return TraceSet(gamma=G, prompt_ids=[f"HumanEval/{i}" for i in range(n_prompts)], features=feats, hidden=hidden,
                    confidence=rng.uniform(size=(B, G)).astype(np.float32), L=L, K=np.zeros(B, np.int64),
                    prompt=prompt, round=np.tile(np.arange(blocks), n_prompts))


def test_mlp_architecture():
    m = make_mlp(D + 19)
    lin = [x for x in m if isinstance(x, torch.nn.Linear)]
    assert [(l.in_features, l.out_features) for l in lin] == [(23, 256), (256, 256), (256, 256), (256, 1)]
    kinds = [type(x).__name__ for x in m]
    assert kinds == ["Linear", "GELU", "Dropout", "Linear", "GELU", "Dropout", "Linear", "GELU", "Linear"]
    assert all(x.p == 0.1 for x in m if isinstance(x, torch.nn.Dropout))


def test_normalisation_uses_training_rows_only():
    ts = synthetic()
    rot = rotations(folds(ts.prompt_ids))[0]
    ex = examples(ts, "marginal", ts.blocks_of(rot.train))
    mean, std = normalisation(ts, ex)
    rows = input_rows(ts, ex.block, ex.pos)
    assert np.allclose(mean, rows.mean(0), atol=1e-5) and np.allclose(std, rows.std(0), rtol=1e-4)
    everything = input_rows(ts, *np.nonzero(np.ones((ts.n_blocks, G), bool)))
    assert not np.allclose(mean[:D], everything.mean(0)[:D], atol=1e-2)  # hidden shifts by prompt
    ts.features[:, :, 17] = 1.0  # a constant input (dataset indicator) maps to zero
    mean, std = normalisation(ts, ex)
    assert std[D + 17] == 1.0 and mean[D + 17] == 1.0


@pytest.mark.parametrize("kind", ["marginal", "conditional"])
def test_training_beats_position_baseline(kind, tmp_path):
    ts = synthetic()
    man = train_predictor(ts, PredictorTrainConfig(kind, epochs=6, batch_size=128), tmp_path, progress=False)
    assert [e["rotation"] for e in man["rotations"]] == [0, 1, 2, 3, 4]
    for e in man["rotations"]:
        assert len(e["val_bce_curve"]) == 6 and e["val_bce"] == min(e["val_bce_curve"])
        assert e["val_bce_curve"][e["best_epoch"] - 1] == e["val_bce"]
    fp = load_fold_predictor(tmp_path, kind)
    P = fp.score_traces(ts)
    assert P.shape == (ts.n_blocks, G) and np.all((P >= 0) & (P <= 1))
    r = positionwise_bce(ts, kind, P, fp.rotations)
    assert r.model_mean < 0.5 * r.baseline_mean, (r.model_mean, r.baseline_mean)


def test_checkpoint_contents(tmp_path):
    ts = synthetic()
    train_predictor(ts, PredictorTrainConfig("conditional", epochs=1, batch_size=512), tmp_path, progress=False)
    man = json.loads((tmp_path / "conditional" / "manifest.json").read_text())
    assert man["folds"] == [list(f) for f in folds(ts.prompt_ids)]
    assert man["kind"] == "conditional" and man["gamma"] == G and man["n_inputs"] == D + 19
    with safe_open(str(tmp_path / "conditional" / "rotation_2.safetensors"), framework="pt") as f:
        meta = f.metadata()
        assert f.get_tensor("norm.mean").shape == (D + 19,) and f.get_tensor("norm.std").shape == (D + 19,)
        assert f.get_tensor("mlp.0.weight").shape == (256, D + 19)
    assert meta["kind"] == "conditional" and meta["gamma"] == str(G) and meta["rotation"] == "2"
    assert json.loads(meta["test_ids"]) == man["folds"][2] and json.loads(meta["val_ids"]) == man["folds"][3]


def _constant_predictor(tmp_path):
    """Trained checkpoints whose rotation r is then made to output (r + 1) / 10 everywhere."""
    ts = synthetic()
    train_predictor(ts, PredictorTrainConfig("marginal", epochs=1, batch_size=512), tmp_path, progress=False)
    fp = load_fold_predictor(tmp_path, "marginal")
    for r, m in enumerate(fp._models):
        last = m.model[-1]
        with torch.no_grad():
            last.weight.zero_()
            last.bias.fill_(float(np.log((r + 1) / 10 / (1 - (r + 1) / 10))))
    return ts, fp


def test_online_scores_use_the_test_fold_rotation(tmp_path):
    ts, fp = _constant_predictor(tmp_path)
    seen_as_test = []
    for tid in ts.prompt_ids:
        # The rotation the checkpoints themselves name as testing this prompt (read from disk).
        owners = []
        for r in range(5):
            with safe_open(str(tmp_path / "marginal" / f"rotation_{r}.safetensors"), framework="pt") as f:
                meta = f.metadata()
            if tid in json.loads(meta["test_ids"]):
                owners.append(r)
                assert tid not in json.loads(meta["train_ids"]) + json.loads(meta["val_ids"])
        assert len(owners) == 1
        block = DraftBlock(np.zeros(G, np.int64), np.ones(G, np.float32), hidden=torch.zeros(G, D, dtype=torch.bfloat16))
        q = fp.scores(block, np.zeros((G, 19), np.float32), tid)
        assert q.shape == (G,) and np.allclose(q, (owners[0] + 1) / 10, atol=1e-6)
        rot = fp.rotations[fp.rotation_of(tid)]
        assert tid in rot.test and tid not in rot.train and tid not in rot.val
        seen_as_test.append(tid)
    assert sorted(seen_as_test) == sorted(ts.prompt_ids)
    with pytest.raises(ValueError, match="no test fold"):
        fp.rotation_of("HumanEval/999")
    with pytest.raises(ValueError, match="task id"):
        fp.scores(block, np.zeros((G, 19), np.float32), None)
    # Offline scoring of traces takes the same rotation as online scoring.
    P = fp.score_traces(ts)
    for b in range(0, ts.n_blocks, 17):
        assert np.allclose(P[b], (fp.rotation_of(ts.prompt_ids[ts.prompt[b]]) + 1) / 10)


def test_missing_predictor(tmp_path):
    with pytest.raises(FileNotFoundError):
        load_fold_predictor(tmp_path / "nope", "marginal")
    with pytest.raises(ValueError, match="no conditional predictor"):
        load_fold_predictor(tmp_path, "conditional")
    with pytest.raises(ValueError, match="unknown predictor kind"):
        PredictorTrainConfig("joint")
    with pytest.raises(ValueError, match="epochs"):
        PredictorTrainConfig("marginal", epochs=0)


def test_end_to_end_on_the_fake_pair(tmp_path):
    """Decode with traces through the loop, store them, train a tiny predictor, decode with it."""
    runs = tmp_path / "strict"
    prompts = trace_run(runs, 10)

    from vskip.cli import build_parser

    parser = build_parser()
    a = parser.parse_args(["train-predictor", "--kind", "marginal", "--traces", str(runs), "--out", str(tmp_path / "pred"),
                           "--epochs", "2", "--batch-size", "128", "--device", "cpu", "--quiet"])
    assert a.fn(a) == 0
    fp = load_fold_predictor(tmp_path / "pred", "marginal")
    assert sorted(fp.prompt_ids) == sorted(prompts)

    calls = []

    class Spy:
        def scores(self, block, features, task_id=None):
            calls.append((task_id, fp.rotation_of(task_id)))
            return fp.scores(block, features, task_id)

    pol = PolicyConfig.make("marginal", eta_m=0.2, k_min=1)
    dcfg = DecodeConfig(gamma=8, max_new_tokens=40, task="humaneval")
    skipped = 0
    for tid in ("HumanEval/0", "HumanEval/7"):
        res = decode(prompts[tid], FakeDrafter(0.2, 0), FakeVerifier(), pol, dcfg, predictor=Spy(), task_id=tid)
        assert res.predict_seconds > 0 and len(res.tokens) > 0
        skipped += res.skipped_rounds
    assert skipped > 0  # the learned scores schedule skips
    assert {t for t, _ in calls} == {"HumanEval/0", "HumanEval/7"}
    for tid, r in calls:
        assert tid in fp.rotations[r].test
    with pytest.raises(ValueError, match="no test fold"):
        decode([1, 2, 3], FakeDrafter(0.2, 0), FakeVerifier(), pol, dcfg, predictor=fp, task_id="HumanEval/50")


def test_train_refuses_non_strict_traces(tmp_path):
    run = tmp_path / "raw"
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"run": {"decode": {"gamma": 8}, "policy": {"name": "raw"}}}))
    cfg = DecodeConfig(gamma=8, max_new_tokens=30, trace=True, task="humaneval")
    for i in range(5):
        res = decode([5 + i, 3, 9, 4], FakeDrafter(0.2, i), FakeVerifier(), PolicyConfig(name="strict"), cfg)
        append_traces(run, f"HumanEval/{i}", res.traces)
    from vskip.cli import build_parser

    parser = build_parser()
    a = parser.parse_args(["train-predictor", "--kind", "conditional", "--traces", str(run), "--out", str(tmp_path / "p"),
                           "--device", "cpu", "--quiet"])
    with pytest.raises(ValueError, match="Strict SDD traces only"):
        a.fn(a)
    assert load_traces(run).n_blocks > 0
