"""The drafter's copy prior: the suffix match, the mixture weights and their fit (pure), and the
mixture inside a tiny drafter's reveal steps."""

import json

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from vskip.engine.models.backbone import BackboneConfig
from vskip.engine.models.copy import CopyPrior, copy_hint, fit_lambda, suffix_match
from vskip.engine.models.diffusion_lm import DiffusionLM, DrafterSpec
from vskip.engine.models.drafter import DiffusionDrafter

V = 64


def brute_match(seq, max_len):
    """Longest suffix (<= max_len) occurring earlier with a follower; most recent occurrence."""
    n = len(seq)
    for length in range(min(max_len, n - 1), 0, -1):
        key = seq[n - length:]
        for end in range(n - 2, length - 2, -1):
            if seq[end - length + 1:end + 1] == key:
                return length, end + 1
    return 0, -1


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 3), min_size=0, max_size=40), st.integers(1, 8))
def test_suffix_match_is_the_longest_most_recent_match(seq, max_len):
    assert suffix_match(seq, max_len) == brute_match(seq, max_len)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 1), min_size=130, max_size=400), st.integers(1, 32))
def test_a_match_with_many_earlier_occurrences_is_found_alike(seq, max_len):
    """A token that occurred often before: its many candidates narrowed a token at a time, then
    the few left compared at once."""
    assert suffix_match(seq, max_len) == brute_match(seq, max_len)


def test_copy_hint_continues_the_match_and_repeats_a_period():
    h, length = copy_hint([1, 2, 3, 9, 1, 2, 3], 6)
    assert length == 3 and h.tolist() == [9, 1, 2, 3, 9, 1]
    h, length = copy_hint([7, 5, 5, 5], 5)  # a run: the copy repeats it
    assert length == 2 and h.tolist() == [5, 5, 5, 5, 5]
    h, length = copy_hint([1, 2, 3], 3)
    assert length == 0 and h.tolist() == [-1, -1, -1]


def test_prior_weights_follow_the_buckets_and_round_trip():
    lam = [[0.1 * i + 0.01 * j for j in range(3)] for i in range(2)]
    p = CopyPrior(lam, length_edges=(1, 4), offset_edges=(0, 2, 5))
    assert p.weights(0, 4).tolist() == [0, 0, 0, 0]
    assert np.allclose(p.weights(3, 7), [0, 0, 0.01, 0.01, 0.01, 0.02, 0.02])
    assert np.allclose(p.weights(9, 3), [0.1, 0.1, 0.11])
    back = CopyPrior.from_json(json.loads(json.dumps(p.to_json())))
    assert back == p
    with pytest.raises(ValueError, match="lie in"):
        CopyPrior([[1.5]], length_edges=(1,), offset_edges=(0,))
    with pytest.raises(ValueError, match="x"):
        CopyPrior([[0.5, 0.5]], length_edges=(1,), offset_edges=(0,))
    with pytest.raises(ValueError, match="increase"):
        CopyPrior([[0.5, 0.5]], length_edges=(1,), offset_edges=(0, 0))


def log_likelihood(p, b, lam):
    """Of the samples that carry information about lam (a nonzero likelihood somewhere)."""
    keep = (p > 0) | b
    mix = (1 - lam) * p[keep] + lam * b[keep]
    return float(np.log(mix).sum()) if np.all(mix > 0) else -np.inf


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.one_of(st.just(0.0), st.floats(1e-4, 1)), st.booleans()), min_size=1, max_size=30))
def test_fit_lambda_maximizes_the_likelihood(rows):
    p = np.array([r[0] for r in rows])
    b = np.array([r[1] for r in rows])
    lam = fit_lambda(p, b, iters=20000, tol=1e-13)
    assert 0 <= lam <= 1
    best = max(log_likelihood(p, b, g) for g in np.linspace(0, 1, 401))
    assert log_likelihood(p, b, lam) >= best - 1e-4 * max(1.0, abs(best))


def test_fit_lambda_recovers_a_known_mixture():
    """Tokens drawn from (1 - lam) * p_D + lam * (hint): the fit finds lam."""
    rng = np.random.default_rng(0)
    n, lam = 20000, 0.3
    p_d = np.array([0.1, 0.4, 0.3, 0.2])  # the hint is token 0
    x = np.where(rng.random(n) < lam, 0, rng.choice(4, size=n, p=p_d))
    got = fit_lambda(p_d[x], x == 0)
    assert abs(got - lam) < 0.03
    assert fit_lambda(p_d[x], np.zeros(n, bool)) == 0.0
    assert fit_lambda(np.zeros(4), np.ones(4, bool)) == pytest.approx(1.0, abs=1e-6)


def tiny_drafter(head=None, copy=None, banned=()):
    spec = DrafterSpec(backbone=BackboneConfig(V, 32, 64, 2, 4, 2), mask_token_id=None, attention="block")
    torch.manual_seed(5)
    model = DiffusionLM(spec, head)
    with torch.no_grad():
        model.mask_embedding.normal_()
    return DiffusionDrafter(model, steps=2, copy=copy, banned=banned)


def full_prior(value):
    return CopyPrior([[value] * 2] * 2, length_edges=(1, 3), offset_edges=(0, 4))


SEQ = [3, 4, 5, 6, 7, 8, 9, 10, 3, 4, 5]  # hint: 6 7 8 9 10 3 4 5 ...


def test_a_full_weight_prior_proposes_the_hint_even_outside_the_head():
    head = torch.arange(0, V, 2)  # odd ids are outside the head
    d = tiny_drafter(head, full_prior(1.0))
    b = d.propose(SEQ, 8)
    assert b.tokens.tolist() == [6, 7, 8, 9, 10, 3, 4, 5]
    assert np.allclose(b.confidence, 1.0)
    assert b.features is None


def test_a_sampled_draft_draws_from_the_copy_mixture_over_the_vocabulary():
    """--speculative-sampling: the one reveal step samples every position from the copy mixture,
    mapped onto vocabulary ids (the extra column onto the hint's id outside the head); at
    temperature 1 q is that mixture, so a full-weight prior puts all mass on the hint and a
    weight of 0.4 at least 0.4; the tokens the loop draws from q carry mass. A drafter of two
    reveal steps refuses to sample."""
    from vskip.engine.policy import Sampling, draw_rows

    s = Sampling(temperature=1.0, speculative=True)
    hints = [6, 7, 8, 9, 10, 3, 4, 5]
    head = torch.arange(0, V, 2)  # odd ids are outside the head
    rows = np.arange(8)
    d = tiny_drafter(head, full_prior(1.0))
    d.steps = 1
    b = d.propose(SEQ, 8, sampling=s)
    assert draw_rows(b.q, np.full(8, 0.5)).tolist() == hints and np.allclose(b.q[rows, hints], 1.0)
    d = tiny_drafter(head, full_prior(0.4))
    d.steps = 1
    b = d.propose(SEQ, 8, sampling=s)
    drawn = draw_rows(b.q, np.linspace(0.02, 0.98, 8))
    assert np.allclose(b.q.sum(1), 1.0) and np.all(b.q[rows, hints] >= 0.4 - 1e-6)
    outside = [i for i in range(1, V, 2) if i not in hints]
    assert np.all(b.q[:, outside] == 0) and np.all(b.q[rows, drawn] > 0)
    assert not np.array_equal(drawn, np.array(hints))  # some positions drew the network's tokens
    with pytest.raises(ValueError, match="one forward"):
        tiny_drafter().propose(SEQ, 8, sampling=s)


def test_a_zero_weight_prior_changes_nothing():
    plain = tiny_drafter().propose(SEQ, 8, features=True)
    mixed = tiny_drafter(copy=full_prior(0.0)).propose(SEQ, 8, features=True)
    assert np.array_equal(plain.tokens, mixed.tokens)
    assert np.allclose(plain.confidence, mixed.confidence, atol=1e-6)
    assert np.allclose(plain.features, mixed.features, atol=1e-5)


def test_banned_hints_are_never_proposed():
    b = tiny_drafter(copy=full_prior(1.0), banned=[7, 9]).propose(SEQ, 8)
    assert 7 not in b.tokens.tolist() and 9 not in b.tokens.tolist()
    assert b.tokens[0] == 6


def test_a_partial_prior_keeps_a_distribution():
    d = tiny_drafter(copy=full_prior(0.4))
    b = d.propose(SEQ, 8, features=True)
    assert np.all((b.confidence >= 0.4 - 1e-6) | (b.tokens != np.array([6, 7, 8, 9, 10, 3, 4, 5])))
    assert np.all(b.confidence <= 1.0 + 1e-6)
    assert np.all(b.features[:, 9] <= 1.0 + 1e-5)  # top-5 mass of a distribution


def test_a_wrong_revealed_token_drops_the_hint_after_it():
    d = tiny_drafter(copy=full_prior(1.0))
    gamma = 4
    hint = torch.tensor([6, 7, 8, 9])
    lam = torch.ones(gamma)
    tokens = torch.tensor([6, 11, 0, 0])
    masked = torch.tensor([False, False, True, True])
    logits = torch.randn(gamma, V)
    logp = d._mix(logits, hint, lam, tokens, masked)
    net = torch.log_softmax(logits, -1)
    assert torch.allclose(logp[2:, :V], net[2:], atol=1e-5)  # after the wrong token: the network
    assert logp[1, 7] == 0.0  # at the wrong token itself the hint still holds (it is revealed anyway)


def write_copy_data(path, n_rows, seed):
    """Answers that repeat their prompt: a hint is right almost everywhere."""
    from vskip.distill.generate import write_shard

    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(n_rows):
        prompt = rng.integers(3, V - 1, 12)
        rows.append({"prompt": prompt, "completion": np.concatenate([prompt, prompt]), "finished": True})
    meta = {"prompt_ids": [f"p{i}" for i in range(n_rows)], "sources": ["t"] * n_rows}
    write_shard(path, rows, meta)


def test_fit_on_copying_answers_learns_to_copy(tmp_path):
    from vskip.distill.copyfit import fit_copy_prior, write_copy_prior
    from vskip.engine.models.drafter_files import resolve_copy_prior

    write_copy_data(tmp_path / "shard_00000.npz", 8, 0)
    write_copy_data(tmp_path / "shard_00001.npz", 4, 1)
    d = tiny_drafter()
    prior = fit_copy_prior(d, tmp_path, ["shard_00000.npz"], ["shard_00001.npz"], gamma=8,
                           per_row=4, min_count=5, progress=False, strict_gammas=(4,),
                           replay_answers=3, replay_tokens=16)
    assert d.copy is None  # the drafter is handed back as it came
    assert max(max(r) for r in prior.lam) > 0.9
    ho = prior.meta["heldout"]
    assert ho["nll_mixture"] < ho["nll_network"]
    assert ho["strict"]["4"]["mean_L_mixture"] > ho["strict"]["4"]["mean_L_network"]
    replay = ho["replay"]["4"]
    assert replay["mixture"]["tokens"] == replay["network"]["tokens"] == 3 * 16
    assert replay["mixture"]["tokens_per_call"] > replay["network"]["tokens_per_call"]

    (tmp_path / "manifest.json").write_text(json.dumps({"format": "vskip-drafter-manifest/1"}))
    path = write_copy_prior(prior, tmp_path)
    from vskip.engine.models.embedded import file_sha256

    recorded = json.loads((tmp_path / "manifest.json").read_text())["copy_prior"]
    assert recorded["sha256"] == file_sha256(path) and recorded["heldout"] == ho
    back = resolve_copy_prior("auto", tmp_path)
    assert back.lam == prior.lam and back.meta["sha256"]
    assert resolve_copy_prior(str(path), None).lam == prior.lam
    assert resolve_copy_prior("off", tmp_path) is None
    assert resolve_copy_prior("auto", tmp_path / "nowhere") is None
    with pytest.raises(FileNotFoundError):
        resolve_copy_prior(str(tmp_path / "missing.json"), None)
    (tmp_path / "bad.json").write_text(json.dumps({"lam": [[2.0]]}))
    with pytest.raises(ValueError, match="not a copy prior"):
        resolve_copy_prior(str(tmp_path / "bad.json"), None)


class ScriptedDrafter:
    """Proposes the stored answer with its i-th token wrong (i from a script), or all right."""

    max_gamma, steps, reads_verifier = None, 1, False

    def propose_many(self, requests, features=False, sampling=None):
        return [self.propose(seq, g, features, sampling, slot) for slot, seq, g in requests]

    def __init__(self, row, wrong_at):
        self.row, self.wrong_at, self.calls = row, list(wrong_at), 0

    def propose(self, seq, gamma, features=False, sampling=None, slot=0):
        from vskip.engine.models.protocols import DraftBlock

        b = len(seq)
        toks = np.array(self.row[b:b + gamma])
        w = self.wrong_at[self.calls]
        self.calls += 1
        if w is not None and w < gamma:
            toks[w] = -5
        return DraftBlock(toks, np.ones(gamma, np.float32))

    def reset(self, slot=None):
        pass


def test_replay_counts_the_rounds_a_strict_decode_makes():
    from vskip.distill.offline import simulate_strict

    row = np.arange(100, 130)  # prompt of 10, answer of 20
    d = ScriptedDrafter(row, [2, 0, None, 1, None])
    # budget 12 tokens (answer positions 10..21): L 2 commits 3 (to 13), L 0 commits 1 (14), a
    # full block commits 4 + 1 (19), L 1 of a 3-block commits 2 (21), and the last 1-block 1 (22)
    out = simulate_strict(d, [(row, 10)], gamma=4, max_new_tokens=12, progress=False)
    assert out["tokens"] == 12 and out["calls"] == 5
    assert out["mean_L"] == pytest.approx((2 + 0 + 4 + 1 + 1) / 5)
    assert out["p_L_ge1"] == pytest.approx(4 / 5)  # one block of five was rejected at its first token


def test_first_step_is_the_distribution_propose_starts_from():
    d = tiny_drafter()
    b = d.propose(SEQ, 8, features=True)
    probs = d.first_step(SEQ, 8)
    assert probs.shape == (8, V) and torch.allclose(probs.sum(-1), torch.ones(8), atol=1e-5)
    assert np.allclose(probs.max(-1).values.numpy(), b.features[:, 10], atol=1e-5)  # p_top1_step0


def test_fit_on_the_rows_a_training_run_held_out(tmp_path):
    """`fit-copy-prior --holdout-of TRAIN_DIR`: the rows the run's --holdout and --seed kept out,
    exactly as training split them, half to fit and half to evaluate."""
    from vskip.distill.copyfit import fit_copy_prior_rows, holdout_answers
    from vskip.distill.rows import load_rows, split

    data = tmp_path / "data"
    data.mkdir()
    write_copy_data(data / "shard_00000.npz", 20, 0)
    run = tmp_path / "train"
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"data": str(data), "train": {"holdout": 4, "seed": 3}}))
    data_dir, rows = holdout_answers(run)
    tr, ho = split(load_rows(data), 4, 3)
    assert data_dir == data and len(rows) == 4 == len(ho.rows)
    assert [r.tolist() for r, _ in rows] == [r.tolist() for r in ho.rows]
    assert not {tuple(r.tolist()) for r, _ in rows} & {tuple(r.tolist()) for r in tr.rows}
    prior = fit_copy_prior_rows(tiny_drafter(), rows[:2], rows[2:], gamma=8, per_row=4, min_count=5,
                                progress=False, strict_gammas=(4,), replay_answers=1, replay_tokens=8)
    assert prior.meta["fit_rows"] == 2 and prior.meta["eval_rows"] == 2 and "heldout" in prior.meta
    (run / "config.json").write_text(json.dumps({"data": str(data), "train": {"holdout": 0, "seed": 3}}))
    with pytest.raises(ValueError, match="too few"):
        holdout_answers(run)


def test_asking_for_features_never_changes_the_draft():
    """Tied logits (tokens sharing one embedding row) must be broken the same way whether or not
    the A.7 features are computed: traced and untraced Strict SDD runs draft the same blocks."""
    d = tiny_drafter()
    with torch.no_grad():
        w = d.model.backbone.embed_tokens.weight
        w[:] = w[torch.arange(V) % (V // 4)].clone()  # four tokens share each embedding row: four-way ties
    rng = np.random.default_rng(0)
    for seq in [SEQ] + [rng.integers(3, V - 1, int(rng.integers(3, 30))).tolist() for _ in range(40)]:
        for g in (4, 8, 16):
            plain, traced = d.propose(seq, g), d.propose(seq, g, features=True)
            assert plain.tokens.tolist() == traced.tokens.tolist()
            assert np.array_equal(plain.confidence, traced.confidence)


def test_a_prior_fitted_to_other_weights_warns(tmp_path, capsys):
    from vskip.engine.models.copy import CopyPrior
    from vskip.engine.models.embedded import file_sha256
    from vskip.engine.models.drafter_files import _warn_if_fitted_elsewhere

    LAM = [[0.5]]
    (tmp_path / "drafter.safetensors").write_bytes(b"weights one")
    mine = file_sha256(tmp_path / "drafter.safetensors")
    fits = CopyPrior(LAM, length_edges=(1,), offset_edges=(0,), meta={"drafter_weights_sha256": {"drafter.safetensors": mine}})
    other = CopyPrior(LAM, length_edges=(1,), offset_edges=(0,), meta={"drafter_weights_sha256": {"drafter.safetensors": "0" * 64}})
    _warn_if_fitted_elsewhere(fits, tmp_path)
    _warn_if_fitted_elsewhere(CopyPrior(LAM, length_edges=(1,), offset_edges=(0,), meta={}), tmp_path)  # a prior that records nothing
    assert capsys.readouterr().err == ""
    _warn_if_fitted_elsewhere(other, tmp_path)
    assert "fitted to other drafter weights" in capsys.readouterr().err
    # the manifest's hash is what counts when there is one
    (tmp_path / "manifest.json").write_text(json.dumps({"weights": {"file": "drafter.safetensors", "sha256": "0" * 64}}))
    _warn_if_fitted_elsewhere(other, tmp_path)
    assert capsys.readouterr().err == ""
