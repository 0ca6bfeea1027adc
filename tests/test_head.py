"""The exact output head: a bfloat16 screen with a rigorous bound, the candidates in float64."""

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vskip.engine.models.head import RANK_EXACT, ExactHead, plain_head


def _exact_logits(h, W):
    return h.double() @ W.double().T


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 10**6), st.integers(1, 9), st.sampled_from([50, 600, 3000]), st.floats(0.1, 30.0),
       st.sampled_from([torch.bfloat16, torch.float32]))
def test_argmax_gap_and_rank_are_exact(seed, T, V, scale, screen):
    g = torch.Generator().manual_seed(seed)
    d = 48
    W = torch.randn(V, d, generator=g)
    h = torch.randn(T, d, generator=g) * scale
    # near-ties the screen cannot tell apart: duplicate a row and nudge it in the last float32 bits
    W[1] = W[0] * (1 + 2.0**-22)
    h[0] = W[0] * 3
    head = ExactHead(W, screen=screen)
    draft = torch.randint(0, V, (T - 1,), generator=g)
    argmax, gap, rank_fn = head(h, draft if T > 1 else None)
    z = _exact_logits(h, W)
    assert torch.equal(argmax, z.argmax(1))
    if T > 1:
        zd = z[torch.arange(T - 1), draft]
        assert torch.allclose(gap, zd - z[: T - 1].max(1).values, atol=1e-9)
        rank = rank_fn()
        want = (z[: T - 1] > zd[:, None]).sum(1)
        exact = want < RANK_EXACT
        assert torch.equal(rank[exact], want[exact])
        assert bool((rank[~exact] >= RANK_EXACT).all()) and bool((rank <= want).all())


@pytest.mark.parametrize("screen", [torch.bfloat16, torch.float32])
def test_ties_go_to_the_lowest_id(screen):
    W = torch.zeros(10, 4)
    W[3] = W[7] = torch.tensor([1.0, 0, 0, 0])
    argmax, _, _ = ExactHead(W, screen=screen)(torch.tensor([[2.0, 0, 0, 0]]))
    assert int(argmax[0]) == 3


def test_a_float32_screen_rescores_far_fewer_tokens():
    g = torch.Generator().manual_seed(0)
    W, h = torch.randn(3000, 48, generator=g), torch.randn(4, 48, generator=g) * 5
    wide = ExactHead(W)
    tight = ExactHead(W, screen=torch.float32)
    assert tight.c < wide.c / 100

    def rescored(head):
        """(argmax, how many (row, token) pairs the head scored exactly)."""
        seen, exact = [], head._exact
        head._exact = lambda hh, rows, ids: (seen.append(len(ids)), exact(hh, rows, ids))[1]
        return head(h)[0], seen[0]

    (a_wide, n_wide), (a_tight, n_tight) = rescored(wide), rescored(tight)
    assert torch.equal(a_wide, a_tight) and torch.equal(a_tight, (h @ W.T).argmax(1))
    assert n_tight == len(h) < n_wide, (n_tight, n_wide)  # the float32 screen: the argmax alone per row
    with pytest.raises(ValueError, match="screen"):
        ExactHead(W, screen=torch.float16)


def test_plain_head_only_for_plain_float32_heads():
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1)
    m = LlamaForCausalLM(cfg)
    assert plain_head(m) is m.lm_head
    assert plain_head(m.to(torch.bfloat16)) is None
    m = LlamaForCausalLM(cfg)
    m.config.model_type = "gemma2"
    assert plain_head(m) is None


@pytest.mark.parametrize("seed", [0, 1])
def test_verifier_with_the_exact_head_agrees_with_the_model(seed):
    from test_models import tiny_llama

    from vskip.engine.models.verifier import HFVerifier

    model = tiny_llama(seed)
    exact = HFVerifier(model, eos_ids=[0])
    plain = HFVerifier(model, eos_ids=[0], exact_head=False)
    assert exact.head is not None and plain.head is None
    rng = np.random.default_rng(seed)
    seq = [int(x) for x in rng.integers(2, 96, 20)]
    for g in (0, 1, 5, 12):
        block = [int(x) for x in rng.integers(2, 96, g)]
        a, b = exact.score(seq, block), plain.score(seq, block)
        assert np.array_equal(a.tokens, b.tokens)
        assert np.allclose(a.draft_gap, b.draft_gap, atol=1e-4)
        assert np.array_equal(np.minimum(a.draft_rank, RANK_EXACT), np.minimum(b.draft_rank, RANK_EXACT))
