"""Model adapters on tiny randomly initialised models of the real layouts (Llama, Qwen2, Dream)."""

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
import torch
from fakes import FakeDrafter

from vskip.engine.decode import DecodeConfig, decode
from vskip.engine.models.backbone import BackboneConfig
from vskip.engine.models.diffusion_lm import DiffusionLM, DrafterSpec, reveal_counts
from vskip.engine.models.drafter import DiffusionDrafter
from vskip.engine.models.drafter_io import load_drafter_model, save_drafter
from vskip.engine.models.protocols import DraftBlock, common_prefix
from vskip.engine.models.verifier import HFVerifier
from vskip.engine.policy import GuardConfig, PolicyConfig

V = 96


def tiny_llama(seed=0, vocab=V):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                      rope_theta=10000.0, tie_word_embeddings=False)
    m = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():  # peakier logits, so that greedy decoding is less degenerate
        m.model.embed_tokens.weight.mul_(3.0)
        m.lm_head.weight.normal_(0.0, 1.0)
    return m


def tiny_dream_dir(tmp_path, vocab=V, mask_id=V - 1):
    """A Dream-layout checkpoint: Qwen2 module names, model_type Dream, a remote-code file that
    must never run."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(1)
    cfg = Qwen2Config(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, rope_theta=1e6, tie_word_embeddings=False)
    m = Qwen2ForCausalLM(cfg)
    d = tmp_path / "dream"
    m.save_pretrained(d, safe_serialization=True)
    c = json.loads((d / "config.json").read_text())
    c.update(model_type="Dream", architectures=["DreamModel"], mask_token_id=mask_id,
             auto_map={"AutoModel": "modeling_dream.DreamModel"})
    (d / "config.json").write_text(json.dumps(c))
    (d / "modeling_dream.py").write_text("raise RuntimeError('checkpoint code was executed')\n")
    return d, m


def test_reveal_counts_follow_dream():
    assert reveal_counts(16, 2) == [7, 9]  # float32 int(16 * (1 - 0.5005)) = 7
    assert reveal_counts(32, 2) == [15, 17]
    assert reveal_counts(1, 2) == [0, 1]
    for g in (1, 5, 16, 33):
        for s in (1, 2, 3, 4):
            assert sum(reveal_counts(g, s)) == g


def test_backbone_matches_transformers_qwen2(tmp_path):
    d, ref = tiny_dream_dir(tmp_path)
    model = load_drafter_model(d)
    assert model.spec.attention == "full" and model.spec.mask_token_id == V - 1
    ids = torch.randint(0, V - 1, (1, 11))
    with torch.no_grad():
        h, _ = model(ids, torch.arange(11), None, "causal")
        want = ref.model(ids).last_hidden_state
        assert torch.allclose(h, want, atol=1e-5), (h - want).abs().max()
        assert torch.allclose(h @ model.head_weight().T, ref(ids).logits, atol=1e-4)


def test_backbone_matches_transformers_llama(tmp_path):
    ref = tiny_llama()
    ref.save_pretrained(tmp_path / "llama", safe_serialization=True)
    from vskip.engine.models.drafter_io import drafter_from_verifier

    model = drafter_from_verifier(tmp_path / "llama", num_layers=2)
    ids = torch.randint(0, V, (1, 9))
    with torch.no_grad():
        h, _ = model.backbone(model.embed(ids), torch.arange(9), None, "causal")
        assert torch.allclose(h, ref.model(ids).last_hidden_state, atol=1e-5)


def test_dream_drafter_proposes_with_shift_and_allowed_ids(tmp_path):
    d, _ = tiny_dream_dir(tmp_path)
    model = load_drafter_model(d)
    allowed = torch.zeros(V, dtype=torch.bool)
    allowed[10:40] = True
    dr = DiffusionDrafter(model, steps=2, allowed=allowed)
    b = dr.propose([3, 4, 5, 6], 16, features=True)
    assert b.tokens.shape == (16,) and np.all((b.tokens >= 10) & (b.tokens < 40))
    assert np.all((b.confidence > 0) & (b.confidence <= 1))
    assert b.features.shape == (16, 14) and b.hidden.shape == (16, 32)
    steps = b.features[:, 0]
    assert (steps == 0).sum() == 7 and (steps == 1).sum() == 9
    assert np.allclose(b.features[:, 4], b.confidence)


def test_block_attention_cache_is_consistent(tmp_path):
    """The causally cached context, cropped and refilled across rounds, gives the same proposals as
    a fresh drafter."""
    spec = DrafterSpec(backbone=BackboneConfig(V, 32, 64, 2, 4, 2), mask_token_id=None, attention="block")
    torch.manual_seed(3)
    model = DiffusionLM(spec)
    with torch.no_grad():
        model.mask_embedding.normal_()
    a = DiffusionDrafter(model, steps=2)
    seqs = [[1, 2, 3, 4, 5], [1, 2, 3, 4, 5, 6, 7], [1, 2, 9, 9], [1, 2, 9, 9, 10, 11, 12, 13]]
    for s in seqs:
        got = a.propose(s, 8)
        fresh = DiffusionDrafter(model, steps=2).propose(s, 8)
        assert np.array_equal(got.tokens, fresh.tokens)
        assert np.allclose(got.confidence, fresh.confidence, atol=1e-5)


def test_save_and_load_drafter_as_difference(tmp_path):
    ref = tiny_llama()
    ref.save_pretrained(tmp_path / "verifier", safe_serialization=True)
    from vskip.engine.models.drafter_io import drafter_from_verifier

    head = torch.arange(0, V, 2)
    model = drafter_from_verifier(tmp_path / "verifier", num_layers=1, head_ids=head)
    with torch.no_grad():
        model.backbone.layers[0].mlp.up_proj.weight.add_(0.5)
    save_drafter(model, tmp_path / "d", base_dir=tmp_path / "verifier", dtype=torch.float32)
    from safetensors.torch import load_file

    stored = load_file(str(tmp_path / "d" / "drafter.safetensors"))
    assert "backbone.layers.0.mlp.up_proj.weight" in stored
    assert "backbone.embed_tokens.weight" not in stored  # unchanged: taken from the verifier
    back = load_drafter_model(tmp_path / "d", base_dir=tmp_path / "verifier")
    for k, v in model.state_dict().items():
        assert torch.equal(v, back.state_dict()[k]), k
    b = DiffusionDrafter(back).propose([5, 6, 7], 6)
    assert np.all(b.tokens % 2 == 0)  # only head ids are proposed
    with pytest.raises(ValueError, match="base"):
        load_drafter_model(tmp_path / "d")


def test_load_rejects_unknown_directories(tmp_path):
    with pytest.raises(FileNotFoundError):
        load_drafter_model(tmp_path / "missing")
    (tmp_path / "x").mkdir()
    with pytest.raises(ValueError, match="neither"):
        load_drafter_model(tmp_path / "x")


class OracleDrafter(FakeDrafter):
    """Proposes the reference continuation with seeded corruptions: exercises long acceptances,
    cache crops and skipped-token prefills on a real transformers verifier."""

    def __init__(self, prompt_len, reference, error, seed):
        super().__init__(error, seed)
        self.n0, self.ref = prompt_len, reference

    def propose(self, seq, gamma, features=False, sampling=None, slot=0):
        rng = np.random.default_rng(self.seed * 31 + len(seq))
        g = len(seq) - self.n0
        toks = list(self.ref[g : g + gamma]) + [5] * gamma
        toks = np.array(toks[:gamma], np.int64)
        bad = rng.random(gamma) < self.error
        toks[bad] = rng.integers(2, V, bad.sum())
        conf = np.where(bad, 0.5, 0.99).astype(np.float32)
        return DraftBlock(toks, conf)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_cached_and_uncached_strict_equal_greedy_on_a_transformers_model(seed):
    model = tiny_llama(seed)
    prompt = [int(x) for x in np.random.default_rng(seed).integers(2, V, 12)]
    ref_v = HFVerifier(model, eos_ids=[0])
    ar = decode(prompt, None, ref_v, PolicyConfig(name="ar"), DecodeConfig(gamma=8, max_new_tokens=60))
    hf = model.generate(torch.tensor([prompt]), max_new_tokens=60, do_sample=False, eos_token_id=0, pad_token_id=0)
    assert ar.tokens == hf[0, len(prompt):].tolist()
    for cache in (True, False):
        for err in (0.0, 0.3):
            v = HFVerifier(model, eos_ids=[0], use_cache=cache)
            d = OracleDrafter(len(prompt), ar.tokens, err, seed)
            res = decode(prompt, d, v, PolicyConfig(name="strict"), DecodeConfig(gamma=8, max_new_tokens=60))
            assert res.tokens == ar.tokens, (cache, err)
    # skips prefill unverified tokens at the next call; the shadow verifier must not disturb it
    for shadow in (True, False):
        v = HFVerifier(model, eos_ids=[0], use_cache=True)
        d = OracleDrafter(len(prompt), ar.tokens, 0.0, seed)
        no_rep = GuardConfig(max_run=10**6, max_period=2, loop_repeats=10**6)  # tiny models repeat
        pol = PolicyConfig(name="raw", eta_b=0.9, eta_c=0.9, k_min=1, s_max=16, guards=no_rep)
        res = decode(prompt, d, v, pol, DecodeConfig(gamma=8, max_new_tokens=60, shadow=shadow))
        assert res.skipped_rounds > 0
        assert res.tokens == ar.tokens  # a perfect drafter: skipping loses nothing
        assert all(r.L == r.gamma for r in res.rounds if not r.verified and shadow)


def test_shadow_call_restores_the_cache():
    model = tiny_llama(4)
    v = HFVerifier(model, eos_ids=[0])
    seq = list(range(2, 20))
    v.score(seq, [3, 4, 5])
    before = list(v._cached_ids[0])
    v.score(seq + [3, 4], [7, 8, 9], shadow=True)
    assert v._cached_ids[0] == before[: len(seq) + 2]
    # and a no-cache verifier agrees with the cached one after all that
    a = v.score(seq + [3, 4, 6], [1, 2])
    b = HFVerifier(model, eos_ids=[0], use_cache=False).score(seq + [3, 4, 6], [1, 2])
    assert np.array_equal(a.tokens, b.tokens) and np.allclose(a.draft_gap, b.draft_gap, atol=1e-4)
    assert np.array_equal(a.draft_rank, b.draft_rank)


def test_verdict_rank_and_gap():
    model = tiny_llama(5)
    v = HFVerifier(model, eos_ids=[0], use_cache=False)
    seq = [4, 5, 6]
    out = v.score(seq, [7])
    with torch.no_grad():
        z = model(torch.tensor([seq + [7]])).logits[0, -2].float()
    assert out.tokens[0] == int(z.argmax())
    assert out.draft_gap[0] == pytest.approx(float(z[7] - z.max()), abs=1e-5)
    assert out.draft_rank[0] == int((z > z[7]).sum())


class _Tok:
    def __init__(self, vocab):
        self.vocab = vocab

    def __len__(self):
        return len(self.vocab)

    def convert_ids_to_tokens(self, ids):
        return [self.vocab[i] for i in ids]


def test_vocabulary_fit_never_allows_ids_the_verifier_lacks():
    from vskip.engine.models.vocab import vocabulary_fit

    words = [f"t{i}" for i in range(200)]
    drafter_tok = _Tok(words[:180] + ["<|mask|>"] * 20)
    verifier_tok = _Tok(words[:150] + ["<tool>"] + words[151:170])  # id 150 means something else
    allowed = vocabulary_fit(drafter_tok, verifier_tok, torch.arange(200), len(verifier_tok))
    assert allowed[:150].all() and not allowed[150] and allowed[151:170].all()
    assert not allowed[170:].any()  # ids past the verifier's vocabulary
    # without a drafter tokenizer only the id range is checked
    assert vocabulary_fit(None, verifier_tok, torch.arange(200), 170).sum() == 170
    with pytest.raises(ValueError, match="does not fit"):
        vocabulary_fit(_Tok(list(reversed(words))), verifier_tok, torch.arange(170), 170)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 3), max_size=80), st.lists(st.integers(0, 3), max_size=80), st.booleans())
def test_common_prefix_is_the_first_difference_by_brute_force(a, b, as_array):
    shared = a[: len(a) // 2]
    a, b = shared + a, shared + b  # long shared prefixes, as a growing sequence has
    want = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    got = common_prefix(np.asarray(a), np.asarray(b)) if as_array else common_prefix(a, b)
    assert got == want
