"""The prefix-level survival model on synthetic blocks whose hazards depend on each position's
features and on the previous position's: its survival is monotone, it beats the position-only
curve held out, and the fold protocol scores every block with a model that never saw its prompt."""

import numpy as np
import pytest
import torch

from vskip.policy.prefix import survival_nll
from vskip.prefix_model import PrefixTrainConfig, held_out_survival, nll, survival, train_prefix_model
from vskip.traces import folds, rotations

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
