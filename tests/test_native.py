"""The native runtime (vskip/engine/models/native): its blocks read as llama.cpp writes them, its
products equal the arithmetic they stand for, every row computes the same numbers whatever else a
forward holds (bit for bit), every variant (ISA) this machine runs, and ARM64's under an emulator
where one is installed, computes the same bits, a Llama or Qwen2 body close to transformers'
float32 forward, and Strict SDD equal to its own ar on tiny models and (marked ``model``) on the
embedded pair. These run on any CPU with a C++ compiler: the variant is the best this CPU runs
(``$VSKIP_NATIVE_ISA`` to force one), the portable one at worst."""

import ctypes
import os
import platform
import sys
from pathlib import Path

import fakes
import numpy as np
import pytest
import torch

from vskip.engine.models.native.build import unsupported_reason

pytestmark = pytest.mark.skipif(unsupported_reason() is not None, reason=str(unsupported_reason()))
THREADS = int(os.environ.get("VSKIP_TEST_THREADS", "1"))
sys.path.insert(0, str(Path(__file__).with_name("native")))  # probe.py: a variant run outside Python


def fake_quant(x):
    """Activations as the kernels quantize them: per row, blocks of 32, scale absmax / 127, nearest."""
    b = x.reshape(*x.shape[:-1], -1, 32)
    amax = b.abs().amax(-1, keepdim=True)
    q = torch.round(b * torch.where(amax > 0, 127 / amax, torch.zeros_like(amax)))
    return (q * (amax / 127)).reshape(x.shape)


def matmul(packed, x):
    from vskip.engine.models.native.build import library

    out = torch.empty(x.shape[0], packed.N)
    qm = packed.qmat()
    assert library().vs_matmul(ctypes.byref(qm), x.shape[0], x.contiguous().data_ptr(), out.data_ptr(), THREADS) == 0
    return out


def test_q8_blocks_round_trip_within_half_a_step():
    from vskip.engine.models.native.quant import quantize_q8

    torch.manual_seed(0)
    w = torch.randn(48, 96)
    p = quantize_q8(w)
    step = w.reshape(48, 3, 32).abs().amax(-1, keepdim=True) / 127
    err = (p.dequantize() - w).reshape(48, 3, 32).abs()
    assert bool((err <= step / 2 + 1e-6).all())


@pytest.mark.parametrize("kind", ["Q4_1", "Q8_0"])
def test_gguf_blocks_read_as_gguf_dequantizes_them(kind):
    import gguf
    from gguf import GGMLQuantizationType as Q

    from vskip.engine.models.native.quant import gguf_blocks, pack

    rng = np.random.default_rng(1)
    w = rng.standard_normal((32, 64)).astype(np.float32)
    raw = gguf.quants.quantize(w, Q[kind])
    ref = gguf.quants.dequantize(raw, Q[kind]).reshape(32, 64)
    p = pack(*gguf_blocks(kind, raw.reshape(32, -1), 32, 64))
    np.testing.assert_array_equal(p.dequantize().numpy(), ref)


@pytest.mark.parametrize("minimums", [False, True])
def test_product_equals_the_arithmetic_it_stands_for(minimums):
    from vskip.engine.models.native.quant import pack, quantize_q8

    torch.manual_seed(2)
    if minimums:  # Q4_1: unsigned nibbles, a scale and a minimum per block
        q = np.random.default_rng(2).integers(0, 16, (64, 96)).astype(np.uint8)
        d = np.random.default_rng(3).random((64, 3)).astype(np.float32) * 0.1
        m = -8 * d
        p = pack(q, d, m, 0)
    else:
        p = quantize_q8(torch.randn(64, 96))
    x = torch.randn(5, 96)
    ref = fake_quant(x).double() @ p.dequantize().double().T
    out = matmul(p, x)
    assert torch.allclose(out.double(), ref, rtol=1e-5, atol=1e-4 * float(ref.abs().max()))


def _packed(minimums: bool, n: int = 32, k: int = 160):
    """A random Q8 matrix, or a Q4_1 one (nibbles with a minimum per block); 5 blocks of 32
    inputs, so that products take their blocks in groups and a remainder."""
    from vskip.engine.models.native.quant import pack, quantize_q8

    if not minimums:
        return quantize_q8(torch.randn(n, k))
    rng = np.random.default_rng(4)
    d = rng.random((n, k // 32)).astype(np.float32) * 0.1
    return pack(rng.integers(0, 16, (n, k)).astype(np.uint8), d, -8 * d, 0)


@pytest.mark.parametrize("minimums", [False, True])
def test_every_row_of_a_product_is_the_one_row_product_bit_for_bit(minimums):
    torch.manual_seed(3)
    p = _packed(minimums)
    x = torch.randn(20, 160)
    alone = torch.cat([matmul(p, x[i:i + 1]) for i in range(20)])
    for n in range(1, 21):  # every register tiling of the rows (and, with AMX, every tile shape)
        assert torch.equal(matmul(p, x[:n]), alone[:n]), n


@pytest.mark.parametrize("minimums", [False, True])
def test_every_variant_this_cpu_runs_computes_the_same_products(minimums):
    """Products of 1..20 rows, bit for bit, on every variant here (AMX's tiles where the CPU has
    them, which take 9 rows or more, 17..20 in two tiles)."""
    from vskip.engine.models.native.build import library, runnable

    torch.manual_seed(5)
    p, x = _packed(minimums), torch.randn(20, 160)
    qm = p.qmat()
    got = {}
    for isa in runnable():
        outs = []
        for n in range(1, 21):
            out = torch.empty(n, p.N)
            assert library(isa).vs_matmul(ctypes.byref(qm), n, x[:n].contiguous().data_ptr(), out.data_ptr(), THREADS) == 0
            outs.append(out)
        got[isa] = torch.cat(outs)
    first = next(iter(got))
    for isa, out in got.items():
        assert torch.equal(out, got[first]), (isa, first)


@pytest.mark.parametrize("minimums", [False, True])
def test_the_tiled_product_path_computes_the_same_products_on_any_cpu(minimums):
    """AMX's tile path (tile_mx) with a plain C++ stand-in for the tiles, built into the portable
    variant: products of 1..20 rows (one tile, two, and blocks in fours with a remainder) equal the
    portable variant's bit for bit; and a stand-in one off in one sum is seen from 5 rows on (where
    the path starts: TILE_ROWS + 1) and not below, so the path is the one compared."""
    from vskip.engine.models.native.build import library

    torch.manual_seed(6)
    p, x = _packed(minimums), torch.randn(20, 160)
    qm = p.qmat()
    outs = {}
    for extra in ((), ("-DVSKIP_TEST_MX",), ("-DVSKIP_TEST_MX", "-DVSKIP_TEST_MX_WRONG")):
        lib = library("portable", extra)
        outs[extra] = []
        for n in range(1, 21):
            out = torch.empty(n, p.N)
            assert lib.vs_matmul(ctypes.byref(qm), n, x[:n].contiguous().data_ptr(), out.data_ptr(), THREADS) == 0
            outs[extra].append(out)
    plain, tiled, wrong = outs.values()
    assert all(torch.equal(a, b) for a, b in zip(plain, tiled))
    assert [not torch.equal(a, b) for a, b in zip(plain, wrong)] == [n >= 5 for n in range(1, 21)]


# --- tiny transformers models ------------------------------------------------------------------

V = 256


def tiny(kind="llama", seed=0, **over):
    """A tiny random transformers model of a family the kernels compute: Llama, Qwen2 (q/k/v
    biases) or Qwen3 (each query and key head RMS-normed before RoPE; a head size other than the
    width over the heads)."""
    from transformers import (LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM, Qwen3Config,
                              Qwen3ForCausalLM)

    torch.manual_seed(seed)
    kw = dict(vocab_size=V, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=512, tie_word_embeddings=False) | over
    m = {"llama": lambda: LlamaForCausalLM(LlamaConfig(rope_theta=10000.0, **kw)),
         "qwen2": lambda: Qwen2ForCausalLM(Qwen2Config(rope_theta=1e6, **kw)),
         "qwen3": lambda: Qwen3ForCausalLM(Qwen3Config(rope_theta=1e6, head_dim=32, **kw))}[kind]().eval()
    with torch.no_grad():  # peakier logits, so that greedy decoding is less degenerate
        m.model.embed_tokens.weight.mul_(3.0)
        m.lm_head.weight.normal_(0.0, 1.0)
        for layer in m.model.layers:
            if kind == "qwen2":
                layer.self_attn.q_proj.bias.normal_(0.0, 0.5)
            if kind == "qwen3":  # norms far from ones, so that one left out shows
                layer.self_attn.q_norm.weight.uniform_(0.2, 3.0)
                layer.self_attn.k_norm.weight.uniform_(0.2, 3.0)
    return m


FAMILIES = ["llama", "qwen2", "qwen3"]


@pytest.fixture(scope="module", params=FAMILIES)
def model(request):
    from vskip.engine.models.native.model import from_hf_model

    hf = tiny(request.param, seed=1 if request.param == "qwen3" else 0)  # seed 0's qwen3 ends a prompt at once
    return hf, from_hf_model(hf, THREADS)


def test_forward_is_close_to_transformers_float32(model):
    hf, net = model
    ids = torch.randint(0, V, (40,)).tolist()
    with torch.no_grad():
        ref = hf(torch.tensor([ids])).logits[0]
    _, z = net.forward(net.new_cache(1), [0] * len(ids), ids, list(range(len(ids))))
    assert float((z - ref).abs().mean()) < 0.02 * float(ref.abs().mean())
    assert float((z.argmax(-1) == ref.argmax(-1)).float().mean()) >= 0.9


def test_qwen3_query_and_key_norms_are_computed_not_dropped():
    """Without its q/k norms a Qwen3 model is another function: the check above would see it."""
    from vskip.engine.models.native.model import from_hf_model

    hf = tiny("qwen3")
    net = from_hf_model(hf, THREADS)
    assert all(ly.q_norm is not None and ly.k_norm is not None for ly in net.layers)
    ids = torch.randint(0, V, (24,)).tolist()
    _, z = net.forward(net.new_cache(1), [0] * 24, ids, list(range(24)))
    for ly in net.layers:
        ly.q_norm = ly.k_norm = None
    net._struct = net._make_struct()
    _, z0 = net.forward(net.new_cache(1), [0] * 24, ids, list(range(24)))
    with torch.no_grad():
        ref = hf(torch.tensor([ids])).logits[0]
    assert float((z - ref).abs().mean()) < 0.02 * float(ref.abs().mean())
    assert float((z0 - ref).abs().mean()) > 0.1 * float(ref.abs().mean())


def test_a_block_computes_what_one_token_steps_compute_bit_for_bit(model):
    _, net = model
    ids = torch.randint(0, V, (37,)).tolist()
    cache = net.new_cache(3)
    hb, zb = net.forward(cache, [0] * 37, ids, list(range(37)), hidden=True)
    steps = [net.forward(cache, [1], [t], [i], hidden=True) for i, t in enumerate(ids)]
    assert torch.equal(torch.cat([h for h, _ in steps]), hb) and torch.equal(torch.cat([z for _, z in steps]), zb)
    assert torch.equal(cache.k[0][:, :, :2], cache.k[1][:, :, :2])  # tiles of 16 keys: 37 fill 2, start a third
    assert torch.equal(cache.k[0][:, :, 2, :, :5], cache.k[1][:, :, 2, :, :5])
    assert torch.equal(cache.v[0][:, :, :37], cache.v[1][:, :, :37])
    # two slots' rows packed in one forward: each as it was alone
    other = torch.randint(0, V, (9,)).tolist()
    _, zp = net.forward(cache, [0] * 9 + [2] * 9, ids[:9] + other, list(range(9)) * 2)
    assert torch.equal(zp[:9], zb[:9])
    _, zo = net.forward(cache, [1] * 9, other, list(range(9)))
    assert torch.equal(zp[9:], zo)


def test_pieces_of_attention_keep_every_rows_bits():
    """A layer's attention is cut in pieces that share the keys they load: the rows of one slot
    together, at most 32 queries a piece, and each key-value head's rows in two pieces where 3
    heads would leave one of 2 threads idle. With 3 key-value heads of 4 queries each (8 rows a
    piece), a 21-row block, a 5-row one, and rows of two slots interleaved: every row's logits
    equal its one-token step's, bit for bit, on 1, 2 and 3 threads."""
    from vskip.engine.models.native.model import from_hf_model

    hf = tiny("llama", seed=3, hidden_size=192, num_attention_heads=12, num_key_value_heads=3)
    for threads in (1, 2, 3):
        net = from_hf_model(hf, threads)
        g = torch.Generator().manual_seed(threads)
        a, b = torch.randint(0, V, (30,), generator=g).tolist(), torch.randint(0, V, (30,), generator=g).tolist()
        cache = net.new_cache(4)
        _, block = net.forward(cache, [0] * 21, a[:21], list(range(21)))
        _, five = net.forward(cache, [0] * 5, a[21:26], list(range(21, 26)))  # 3 heads x 2 pieces on 2 threads
        _, mixed = net.forward(cache, [0, 1, 0, 1, 1, 0], [a[26], b[0], a[27], b[1], b[2], a[28]],
                               [26, 0, 27, 1, 2, 28])
        steps = [net.forward(cache, [2], [t], [i])[1] for i, t in enumerate(a[:29])]
        other = [net.forward(cache, [3], [t], [i])[1] for i, t in enumerate(b[:3])]
        assert torch.equal(block, torch.cat(steps[:21])), threads
        assert torch.equal(five, torch.cat(steps[21:26])), threads
        assert torch.equal(mixed[[0, 2, 5]], torch.cat(steps[26:29])), threads
        assert torch.equal(mixed[[1, 3, 4]], torch.cat(other)), threads


def test_a_slot_grows_past_its_capacity_keeping_what_it_holds(model):
    _, net = model
    ids = torch.randint(0, V, (300,)).tolist()
    cache = net.new_cache(1)
    cache._capacity = 64
    cache.resize(0)
    cache.resize(1)
    _, z1 = net.forward(cache, [0] * 50, ids[:50], list(range(50)))
    _, z2 = net.forward(cache, [0] * 250, ids[50:], list(range(50, 300)))
    _, zall = net.forward(net.new_cache(1), [0] * 300, ids, list(range(300)))
    assert cache.capacity(0) >= 300 and torch.equal(torch.cat([z1, z2]), zall)


def test_bad_rows_are_refused(model):
    _, net = model
    with pytest.raises(ValueError):
        net.forward(net.new_cache(1), [0], [V + 5], [0])
    with pytest.raises(ValueError):
        net.forward(net.new_cache(1), [0], [1], [net.shape.max_positions])


def test_shapes_the_kernels_cannot_run_are_refused():
    from transformers import LlamaConfig, LlamaForCausalLM

    from vskip.engine.models.native.model import from_hf_model

    m = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                     num_attention_heads=4, num_key_value_heads=2))
    with pytest.raises(ValueError, match="head size 8"):
        from_hf_model(m)


def Oracle(n0, ref, error, seed=0):
    """The shared oracle drafter (tests/fakes.py) over the tiny models' vocabulary."""
    return fakes.Oracle(n0, ref, error, seed, filler=7, vocab=(0, V))


def test_strict_sdd_equals_its_own_ar_on_the_native_verifier(model):
    from vskip.engine.decode import DecodeConfig, decode
    from vskip.engine.models.native.verifier import NativeVerifier
    from vskip.engine.policy import PolicyConfig

    _, net = model
    ver = NativeVerifier(net, eos_ids=[V - 1])
    cfg = DecodeConfig(gamma=8, max_new_tokens=60)
    for seed in range(3):
        ids = torch.randint(0, V - 1, (12,), generator=torch.Generator().manual_seed(seed)).tolist()
        ar = decode(ids, None, ver, PolicyConfig(name="ar"), cfg)
        for cache in (True, False):
            ver.set_cache(cache)
            oracle = decode(ids, Oracle(len(ids), ar.tokens, 0.25, seed), ver, PolicyConfig(name="strict"), cfg)
            assert oracle.tokens == ar.tokens, (seed, cache)
            assert max(r.L for r in oracle.rounds) >= 4
        ver.set_cache(True)
        skip = decode(ids, Oracle(len(ids), ar.tokens, 0.0), ver, PolicyConfig(name="raw", k_min=1, s_max=16), cfg)
        assert skip.skipped_rounds > 0 and skip.tokens == ar.tokens


def test_the_lossless_check_goes_red_when_a_forward_depends_on_what_else_it_holds(model, monkeypatch):
    """The check above, against a forward whose logits shift with its number of rows (as a kernel
    that sums in another order for a wider call would): Strict SDD then no longer equals ar."""
    from vskip.engine.decode import DecodeConfig, decode
    from vskip.engine.models.native.verifier import NativeVerifier
    from vskip.engine.policy import PolicyConfig

    _, net = model
    ver = NativeVerifier(net, eos_ids=[V - 1])
    honest = net.forward

    def wider_differs(cache, slots, tokens, *a, **kw):
        h, z = honest(cache, slots, tokens, *a, **kw)
        if z is not None and len(tokens) > 1:
            z = z + torch.linspace(0.0, 3.0, z.shape[-1])  # a shift that grows across the vocabulary
            if kw.get("argmax_out") is not None:  # the argmax the runtime reports shifts with it
                kw["argmax_out"][:] = z.numpy().argmax(-1)
        return h, z

    cfg = DecodeConfig(gamma=8, max_new_tokens=40)
    ids = torch.randint(0, V - 1, (12,), generator=torch.Generator().manual_seed(0)).tolist()
    ar = decode(ids, None, ver, PolicyConfig(name="ar"), cfg)
    assert decode(ids, Oracle(len(ids), ar.tokens, 0.25), ver, PolicyConfig(name="strict"), cfg).tokens == ar.tokens
    monkeypatch.setattr(net, "forward", wider_differs)
    ver.reset()
    ar_bad = decode(ids, None, ver, PolicyConfig(name="ar"), cfg)
    strict_bad = decode(ids, Oracle(len(ids), ar_bad.tokens, 0.25), ver, PolicyConfig(name="strict"), cfg)
    assert strict_bad.tokens != ar_bad.tokens


def test_batched_decodes_equal_batch_one_on_the_native_verifier(model):
    from vskip.engine.decode import DecodeConfig, Job, decode, decode_many
    from vskip.engine.models.native.verifier import NativeVerifier
    from vskip.engine.policy import PolicyConfig

    _, net = model
    ver = NativeVerifier(net, eos_ids=[V - 1])
    cfg = DecodeConfig(gamma=6, max_new_tokens=40)
    prompts = [torch.randint(0, V - 1, (5 + 3 * i,), generator=torch.Generator().manual_seed(i)).tolist()
               for i in range(5)]
    refs = [decode(p, None, ver, PolicyConfig(name="ar"), cfg).tokens for p in prompts]
    ver.open_slots(1)
    oracles = [Oracle(len(p), r, 0.3, i) for i, (p, r) in enumerate(zip(prompts, refs))]

    class Many(fakes.Oracle):
        def propose(self, seq, gamma, features=False, sampling=None, slot=0):
            i = next(i for i, p in enumerate(prompts) if list(seq[: len(p)]) == p)  # prompt lengths differ
            return oracles[i].propose(seq, gamma, features, sampling, slot)

    jobs = [Job(prompt=p, task_id=str(i)) for i, p in enumerate(prompts)]
    got = {int(job.task_id): res.tokens for job, res in decode_many(jobs, Many(0, [], 0.0), ver,
                                                                    PolicyConfig(name="strict"), cfg, batch_size=3)}
    assert [got[i] for i in range(5)] == refs


def test_auto_runtime_picks_native_here_and_transformers_when_a_dtype_is_asked():
    from vskip.engine.models.config import ModelConfig
    from vskip.engine.door import runtime_of

    assert runtime_of(ModelConfig(device="cpu")).verifier_runtime == "native"
    assert runtime_of(ModelConfig(device="cpu", dtype="float32")).verifier_runtime == "transformers"
    assert runtime_of(ModelConfig(device="cpu", runtime="transformers")).verifier_runtime == "transformers"
    with pytest.raises(ValueError, match="unknown runtime"):
        ModelConfig(runtime="fast")


def test_llamacpp_configurations_parse_and_refuse_what_they_cannot_do():
    from vskip.engine.decode import DecodeConfig
    from vskip.engine.policy import Sampling
    from vskip.study.variants import parse_variant

    base = DecodeConfig()
    assert parse_variant("llamacpp", base, 1).engine == "llamacpp"
    assert parse_variant("llamacpp-ngram-mod", base, 1).hf
    with pytest.raises(ValueError, match="unknown llama.cpp configuration"):
        parse_variant("llamacpp-lookahead", base, 1)
    from dataclasses import replace

    with pytest.raises(ValueError, match="greedily"):
        parse_variant("llamacpp", replace(base, sampling=Sampling(temperature=0.7)), 1)


# --- the embedded pair on the native runtime ------------------------------------------------------

@pytest.fixture(scope="module")
def native_pair():
    from vskip.engine.models.load import load_pair
    from vskip.engine.runtime import resolve_runtime

    return load_pair(resolve_runtime("cpu", threads=THREADS, verifier_runtime="native"))


@pytest.mark.model
def test_strict_equals_native_ar_on_the_embedded_pair(native_pair):
    from vskip.bench import tasks
    from vskip.engine.decode import DecodeConfig, Job, decode, decode_many
    from vskip.engine.models.native.drafter import NativeBody
    from vskip.engine.models.native.verifier import NativeVerifier
    from vskip.engine.policy import PolicyConfig
    from vskip.engine.prompting import encode_chat

    pair = native_pair
    assert isinstance(pair.verifier, NativeVerifier) and isinstance(pair.drafter.body, NativeBody)
    probs = tasks.load_task("humaneval", ids=["HumanEval/0", "HumanEval/2", "HumanEval/17"])
    prompts = [encode_chat(pair.tokenizer, tasks.user_prompt(p)) for p in probs]
    cfg = DecodeConfig(gamma=4, gamma_max=16, min_match=6, trim=0.3, max_new_tokens=64)
    refs = []
    for ids in prompts:
        ar = decode(ids, None, pair.verifier, PolicyConfig(name="ar"), cfg)
        strict = decode(ids, pair.drafter, pair.verifier, PolicyConfig(name="strict"), cfg)
        assert strict.tokens == ar.tokens
        assert strict.verifier_calls < ar.verifier_calls  # the drafter's blocks were accepted
        oracle = decode(ids, fakes.Oracle(len(ids), ar.tokens, 0.2), pair.verifier, PolicyConfig(name="strict"),
                        DecodeConfig(gamma=16, max_new_tokens=64))
        assert oracle.tokens == ar.tokens and max(r.L for r in oracle.rounds) >= 8
        refs.append(ar.tokens)
    jobs = [Job(prompt=p, task_id=str(i)) for i, p in enumerate(prompts)]
    for chunk in (None, 32):  # prompts read whole, or 32 tokens a round (the server's chunked prefill)
        got = {int(j.task_id): r.tokens for j, r in decode_many(jobs, pair.drafter, pair.verifier,
                                                                PolicyConfig(name="strict"), cfg, batch_size=2,
                                                                prefill_chunk=chunk)}
        assert [got[i] for i in range(len(prompts))] == refs
    # a skipping policy's text depends on the drafts: read in chunks, the caches hold the same bits
    raw = PolicyConfig.make("raw", eta_b=0.6, eta_c=0.6, k_min=2, s_max=16)
    whole, chunked = ({j.task_id: r.tokens for j, r in decode_many(jobs, pair.drafter, pair.verifier, raw, cfg,
                                                                   batch_size=2, prefill_chunk=c)} for c in (None, 7))
    assert whole == chunked


def test_sampled_strict_sdd_commits_the_native_verifiers_own_draws(model):
    """With a temperature, Strict SDD commits exactly the tokens ar draws with the same seed."""
    from dataclasses import replace

    from vskip.engine.decode import DecodeConfig, decode
    from vskip.engine.models.native.verifier import NativeVerifier
    from vskip.engine.policy import PolicyConfig, Sampling

    _, net = model
    ver = NativeVerifier(net, eos_ids=[V - 1])
    cfg = replace(DecodeConfig(gamma=6, max_new_tokens=40), sampling=Sampling(temperature=0.8, seed=3))
    ids = torch.randint(0, V - 1, (10,), generator=torch.Generator().manual_seed(7)).tolist()
    ar = decode(ids, None, ver, PolicyConfig(name="ar"), cfg, task_id="t")
    greedy = decode(ids, None, ver, PolicyConfig(name="ar"), DecodeConfig(gamma=6, max_new_tokens=40))
    assert ar.tokens != greedy.tokens  # the draws are not the argmax
    strict = decode(ids, Oracle(len(ids), ar.tokens, 0.25), ver, PolicyConfig(name="strict"), cfg, task_id="t")
    assert strict.tokens == ar.tokens


def test_the_native_drafter_drafts_a_batch_as_it_drafts_each_row():
    """A tiny block-attention drafter on the native runtime: a batch's blocks are each row's own,
    bit for bit, and close to what the torch drafter drafts from the same weights."""
    from vskip.engine.models.backbone import BackboneConfig
    from vskip.engine.models.diffusion_lm import DiffusionLM, DrafterSpec
    from vskip.engine.models.drafter import DiffusionDrafter
    from vskip.engine.models.native.drafter import NativeBody

    torch.manual_seed(4)
    spec = DrafterSpec(BackboneConfig(vocab_size=V, hidden_size=64, intermediate_size=128, num_layers=2,
                                      num_heads=4, num_kv_heads=2), mask_token_id=None, attention="block")
    lm = DiffusionLM(spec).eval()
    with torch.no_grad():
        lm.backbone.embed_tokens.weight.mul_(3.0)
        lm.mask_embedding.normal_()
    torch_drafter = DiffusionDrafter(lm, steps=2)
    native = DiffusionDrafter(lm, steps=2, body=NativeBody.of(lm, max_positions=512, threads=THREADS))
    seqs = [torch.randint(0, V, (n,), generator=torch.Generator().manual_seed(n)).tolist() for n in (9, 14, 20)]
    alone = [native.propose(s, 6, slot=i) for i, s in enumerate(seqs)]
    native.reset()
    together = native.propose_many([(i, s, 6) for i, s in enumerate(seqs)])
    for a, b in zip(alone, together):
        assert np.array_equal(a.tokens, b.tokens) and np.array_equal(a.confidence, b.confidence)
    # the same slot drafting again after its sequence grew: the cache keeps the context it shares
    grown = seqs[0] + [int(t) for t in alone[0].tokens[:3]]
    again = native.propose(grown, 6, slot=0)
    native.reset()
    fresh = native.propose(grown, 6, slot=0)
    assert np.array_equal(again.tokens, fresh.tokens) and np.array_equal(again.confidence, fresh.confidence)
    ref = [torch_drafter.propose(s, 6) for s in seqs]
    agree = np.mean([np.mean(a.tokens == r.tokens) for a, r in zip(alone, ref)])
    assert agree >= 0.8, agree
    # a context read ahead in chunks (chunked prefill) drafts the same block: bit for bit natively,
    # to float32 rounding on torch
    for d, exact in ((native, True), (torch_drafter, False)):
        d.reset()
        s = seqs[2]
        d.prefill(s[:5], slot=1)
        d.prefill(s[:12], slot=1)
        d.prefill(s[:-1], slot=1)
        read = d.propose(s, 6, slot=1)
        d.reset()
        whole = d.propose(s, 6, slot=1)
        assert np.array_equal(read.tokens, whole.tokens)
        if exact:
            assert np.array_equal(read.confidence, whole.confidence)
        else:
            np.testing.assert_allclose(read.confidence, whole.confidence, rtol=1e-4, atol=1e-5)


def test_biases_the_kernels_lack_are_refused_not_dropped():
    from transformers import LlamaConfig, LlamaForCausalLM

    from vskip.engine.models.native.model import from_hf_model

    m = LlamaForCausalLM(LlamaConfig(vocab_size=V, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                                     num_attention_heads=4, num_key_value_heads=2, mlp_bias=True))
    with pytest.raises(ValueError, match="no bias on layer 0 gate_proj"):
        from_hf_model(m)
    m = LlamaForCausalLM(LlamaConfig(vocab_size=V, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                                     num_attention_heads=4, num_key_value_heads=2, attention_bias=True))
    with pytest.raises(ValueError, match="no bias on layer 0 o_proj"):
        from_hf_model(m)


def test_llamacpp_configurations_refuse_before_any_model_loads(monkeypatch, tmp_path):
    from vskip.study import llamacpp
    from vskip.study.compare import _fill_placement

    monkeypatch.setattr(llamacpp, "server_binary", lambda: None)
    with pytest.raises(llamacpp.LlamaCppMissing, match="not built here"):
        llamacpp.check_available(["llamacpp"], None)
    monkeypatch.setattr(llamacpp, "server_binary", lambda: tmp_path / "llama-server")
    llamacpp.check_available(["llamacpp"], None)
    with pytest.raises(ValueError, match="embedded verifier's GGUF"):
        llamacpp.check_available(["llamacpp"], str(tmp_path))
    # a comparison recorded before the native runtime existed was decoded with transformers
    assert _fill_placement({"runtime": {"device": "cpu"}})["runtime"]["verifier_runtime"] == "transformers"


# --- the same bits on every CPU -------------------------------------------------------------------

def _calls(seed=0, n_prompt=23):
    """A prompt, then one call of each size 1..9 continuing it (the rows a verification holds)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, V - 1, (n_prompt + 45,), generator=g).tolist()
    calls, at = [(ids[:n_prompt], list(range(n_prompt)))], n_prompt
    for n in range(1, 10):
        calls.append((ids[at: at + n], list(range(at, at + n))))
        at += n
    return calls


def _logits(net, calls) -> np.ndarray:
    cache = net.new_cache(1)
    return torch.cat([net.forward(cache, [0] * len(t), t, p)[1] for t, p in calls]).numpy()


def test_variants_are_chosen_from_the_cpu_and_refused_where_it_cannot_run_them(monkeypatch):
    from vskip.engine.models.native import build

    v3 = {"avx", "avx2", "fma", "f16c", "bmi1", "bmi2", "movbe", "abm"}
    assert build.runnable(v3, "x86_64") == ["avx2", "portable"]
    assert build.runnable(v3 | {"avx_vnni"}, "x86_64")[0] == "avxvnni"
    skx = v3 | {"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl", "avx512_vnni"}
    assert build.runnable(skx, "x86_64")[0] == "avx512vnni"
    assert build.runnable(skx | {"amx_tile", "amx_int8"}, "x86_64")[:2] == ["amx", "avx512vnni"]
    assert build.cannot_run("amx", skx | {"amx_tile"}, "x86_64").endswith("it lacks amx_int8")
    assert build.runnable({"avx", "sse4_2"}, "x86_64") == ["portable"]
    assert build.runnable({"asimd", "asimddp"}, "aarch64") == ["neon-dotprod", "neon", "portable"]
    assert build.runnable({"asimd"}, "aarch64") == ["neon", "portable"]
    assert build.cannot_run("avx512vnni", skx - {"avx512_vnni"}, "x86_64").endswith("it lacks avx512_vnni")
    assert "aarch64" in build.cannot_run("neon", v3, "x86_64")
    assert build.parse_variants(" portable ") == ["portable"] and build.parse_variants("") == build.runnable()
    with pytest.raises(ValueError, match="'sse9' is not a variant"):
        build.parse_variants("portable,sse9")
    monkeypatch.setenv(build.ENV, "sse9")
    with pytest.raises(build.NativeUnavailable, match="VSKIP_NATIVE_ISA=sse9: 'sse9' is not a variant"):
        build.chosen_isa()
    monkeypatch.setenv(build.ENV, "portable")
    assert build.chosen_isa() == "portable" and build.unsupported_reason() is None


def test_amx_is_refused_where_the_system_withholds_its_tiles_and_skipped_where_it_does_not_build(monkeypatch,
                                                                                                   capsys):
    from vskip.engine.models.native import build

    skx = {"avx", "avx2", "fma", "f16c", "bmi1", "bmi2", "movbe", "abm", "avx512f", "avx512bw", "avx512cd",
           "avx512dq", "avx512vl", "avx512_vnni"}
    monkeypatch.setattr(build, "cpu_flags", lambda: ("a Xeon", skx | {"amx_tile", "amx_int8"}))
    monkeypatch.setattr(build, "machine_arch", lambda: "x86_64")
    monkeypatch.delenv(build.ENV, raising=False)
    monkeypatch.setattr(build, "tiles_granted", lambda: False)
    assert "does not let this process use its tiles" in build.cannot_run("amx")
    assert build.chosen_isa() == "avx512vnni"
    monkeypatch.setattr(build, "tiles_granted", lambda: True)
    real = build.library_path

    def no_amx(name=None, extra=()):
        if name == "amx":
            raise build.NativeUnavailable("compiling the native kernels failed (g++ ...):\nunknown -mamx-int8")
        return real(name, extra)

    monkeypatch.setattr(build, "library_path", no_amx)
    build._builds.cache_clear()
    try:
        assert build.chosen_isa() == "avx512vnni"
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "the amx variant of the native kernels does not build here" in err[0]
    finally:
        build._builds.cache_clear()


def test_a_variant_the_cpu_cannot_run_is_refused_in_one_line_before_any_model_loads(monkeypatch):
    from vskip.engine.models.config import ModelConfig
    from vskip.engine.models.native import build
    from vskip.engine.runtime import resolve_runtime, runtime_name
    from vskip.engine.door import runtime_of

    other = "neon" if build.machine_arch() == "x86_64" else "avx2"
    monkeypatch.setenv(build.ENV, other)
    with pytest.raises(ValueError, match=f"VSKIP_NATIVE_ISA={other}: the {other} variant runs on"):
        runtime_of(ModelConfig(device="cpu"))
    monkeypatch.setenv(build.ENV, "portable")
    assert runtime_name(resolve_runtime("cpu", verifier_runtime="native")) == "native portable"


@pytest.mark.parametrize("kind", FAMILIES)
def test_every_variant_this_cpu_runs_computes_the_same_bits(kind):
    """Logits of a prompt and of calls of 1..9 rows, bit for bit, on every variant here (portable,
    and on x86-64 avx2 and up as the CPU allows)."""
    from vskip.engine.models.native.build import runnable
    from vskip.engine.models.native.model import from_hf_model

    net = from_hf_model(tiny(kind), THREADS)
    calls = _calls()
    variants = runnable()
    assert variants[-1] == "portable"  # and, on any x86-64 since Haswell, avx2 and up before it
    got = {}
    for isa in variants:
        net.isa = isa
        got[isa] = _logits(net, calls)
    for isa in variants[1:]:
        assert np.array_equal(got[isa], got[variants[0]]), (isa, variants[0])


def test_the_runtimes_argmax_is_numpys_on_every_variant_ties_included():
    """The argmax the forward returns beside the logits: numpy's (the first id at the greatest
    logit) on every variant here, where head rows repeat one another so that the greatest logit
    stands at several ids, apart and side by side, in different parts of the vocabulary."""
    from vskip.engine.models.native.build import runnable
    from vskip.engine.models.native.model import from_hf_model

    hf = tiny("llama")
    with torch.no_grad():
        w = hf.lm_head.weight
        w[7] *= 6.0  # the greatest logit in most rows, and at every id that repeats it
        for v in (8, 40, 41, 130, 255):
            w[v] = w[7]
    net = from_hf_model(hf, THREADS)
    calls = _calls(seed=2)
    tied = 0
    for isa in runnable():
        net.isa = isa
        cache = net.new_cache(1)
        for t, p in calls:
            top = np.empty(len(t), dtype=np.int32)
            _, z = net.forward(cache, [0] * len(t), t, p, argmax_out=top)
            zn = z.numpy()
            assert np.array_equal(top, zn.argmax(-1)), (isa, top, zn.argmax(-1))
            tied += int(((zn == zn.max(-1, keepdims=True)).sum(-1) > 1).sum())
    assert tied > 0  # the ties were there to break


def test_the_runtime_keeps_freed_memory_unless_the_environment_chose(monkeypatch):
    from vskip.engine.models.native import build

    build.keep_freed_memory.cache_clear()
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "131072")
    assert build.keep_freed_memory() is False  # the user's setting stands
    build.keep_freed_memory.cache_clear()
    monkeypatch.delenv("MALLOC_TRIM_THRESHOLD_")
    for k in build.MALLOC_SETTINGS:
        monkeypatch.delenv(k, raising=False)
    import platform

    expected = sys.platform == "linux" and platform.libc_ver()[0] == "glibc"
    assert build.keep_freed_memory() is expected


def test_a_verdict_leaves_a_row_whose_logits_are_not_finite_to_numpy():
    from vskip.engine.models.native.verifier import verdict

    z = torch.zeros(3, 64)
    z[0, 5], z[1, 9], z[2, 3] = 2.0, float("nan"), float("inf")
    v = verdict(z, [5, 4], np.array([5, -1, -1], dtype=np.int32))
    assert v.tokens.tolist() == z.numpy().argmax(-1).tolist() == [5, 9, 3]
    assert verdict(z, [5, 4], np.array([5, 2, 3], dtype=np.int32)).tokens.tolist() == [5, 2, 3]  # as reported


def test_the_same_bits_check_goes_red_when_one_variant_sums_in_another_order(monkeypatch):
    """The comparison above, against a build of this CPU's variant whose 16-lane sums (norms,
    softmax) run left to right instead of the fixed tree: its logits differ, so the check sees it."""
    from vskip.engine.models.native import build
    from vskip.engine.models.native.model import from_hf_model

    net = from_hf_model(tiny("llama"), THREADS)
    calls = _calls()
    honest = _logits(net, calls)
    altered = build.library(build.chosen_isa(), ("-DVSKIP_TEST_OTHER_REDUCTION",))
    monkeypatch.setattr(build, "library", lambda *a, **k: altered)
    other = _logits(net, calls)
    assert np.allclose(other, honest, rtol=1e-3, atol=1e-3)  # the same model, summed otherwise
    assert not np.array_equal(other, honest)


@pytest.mark.parametrize("variant", ["neon-dotprod", "neon"])
def test_arm64_variants_compute_the_same_bits_under_an_emulator(variant, tmp_path):
    """ARM64's kernels, cross-compiled and run under qemu on the tiny model: the same logits as
    this machine's (.ci/run installs the cross compiler and qemu where it can)."""
    import probe
    from vskip.engine.models.native.model import from_hf_model

    if platform.machine() == "aarch64":
        pytest.skip("an ARM64 machine runs its variants natively (the test above)")
    if probe.cross_tools("aarch64") is None:
        pytest.skip("no aarch64 cross compiler and qemu-aarch64-static here "
                    "(apt: g++-aarch64-linux-gnu qemu-user-static)")
    net = from_hf_model(tiny("qwen2"), THREADS)
    calls = _calls(seed=1)
    probe.write(tmp_path / "model.bin", net, calls)
    isa, z = probe.run(variant, tmp_path / "model.bin", tmp_path / "logits.bin", tmp_path)
    assert isa == variant
    assert np.array_equal(z, _logits(net, calls).ravel())


def test_auto_falls_back_in_one_line_where_no_compiler_is_found(monkeypatch, capsys):
    from vskip.engine.models.config import ModelConfig
    from vskip.engine.door import runtime_of

    monkeypatch.setenv("CXX", "no-such-compiler-here")
    assert runtime_of(ModelConfig(device="cpu")).verifier_runtime == "transformers"
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no-such-compiler-here not found" in err[0] and "float32 transformers" in err[0]
    with pytest.raises(ValueError, match="--runtime native: .*no-such-compiler-here not found"):
        runtime_of(ModelConfig(device="cpu", runtime="native"))


@pytest.mark.model
def test_payoff_drafts_keep_strict_equal_to_ar_on_the_embedded_pair(native_pair):
    """The default decode (each round the copy hint, the drafter or the verifier alone, chosen by
    measured costs) on the real pair: the verifier's own text, alone and three side by side, with
    copied rounds among its rounds."""
    from vskip.bench import tasks
    from vskip.engine.chooser import Chooser
    from vskip.engine.decode import DecodeConfig, Job, decode, decode_many
    from vskip.engine.policy import PolicyConfig
    from vskip.engine.prompting import encode_chat

    pair = native_pair
    probs = tasks.load_task("humaneval", ids=["HumanEval/0", "HumanEval/2", "HumanEval/17"])
    prompts = [encode_chat(pair.tokenizer, tasks.user_prompt(p)) for p in probs]
    cfg = DecodeConfig(gamma=4, gamma_max=16, min_match=6, trim=0.3, max_new_tokens=96, drafts="payoff")
    chooser, reasons, refs = Chooser(), set(), []
    for ids in prompts:
        ar = decode(ids, None, pair.verifier, PolicyConfig(name="ar"), cfg)
        strict = decode(ids, pair.drafter, pair.verifier, PolicyConfig(name="strict"), cfg, chooser=chooser)
        assert strict.tokens == ar.tokens
        reasons |= {r.reason for r in strict.rounds}
        refs.append(ar.tokens)
    assert "copy" in reasons and chooser.costs() is not None
    jobs = [Job(prompt=p, task_id=str(i)) for i, p in enumerate(prompts)]
    got = {job.task_id: r.tokens for job, r in decode_many(jobs, pair.drafter, pair.verifier,
                                                            PolicyConfig(name="strict"), cfg, batch_size=3,
                                                            chooser=chooser)}
    assert [got[str(i)] for i in range(3)] == refs


@pytest.mark.model
def test_every_variant_decodes_the_same_tokens_on_the_embedded_pair(native_pair):
    """The decodes users see, on every variant this CPU runs: ar, Strict SDD with the real drafter
    (on the same kernels), and a skipping policy, whose text follows the drafter's bits too."""
    from vskip.bench import tasks
    from vskip.engine.decode import DecodeConfig, decode
    from vskip.engine.models.native.build import runnable
    from vskip.engine.policy import PolicyConfig
    from vskip.engine.prompting import encode_chat

    pair = native_pair
    probs = tasks.load_task("humaneval", ids=["HumanEval/2", "HumanEval/17"])
    prompts = [encode_chat(pair.tokenizer, tasks.user_prompt(p)) for p in probs]
    cfg = DecodeConfig(gamma=4, gamma_max=16, min_match=6, trim=0.3, max_new_tokens=32)
    policies = [PolicyConfig(name="ar"), PolicyConfig(name="strict"),
                PolicyConfig.make("raw", eta_b=0.6, eta_c=0.6, k_min=2, s_max=16)]
    got = {}
    try:
        for isa in runnable():
            pair.verifier.net.isa = pair.drafter.body.net.isa = isa
            pair.verifier.reset()
            pair.drafter.reset()
            got[isa] = [decode(ids, None if pol.name == "ar" else pair.drafter, pair.verifier, pol, cfg).tokens
                        for ids in prompts for pol in policies]
    finally:
        pair.verifier.net.isa = pair.drafter.body.net.isa = None
    first = next(iter(got.values()))
    assert all(tokens == first for tokens in got.values()), {isa: [len(t) for t in v] for isa, v in got.items()}
    assert first[0] == first[1] and first[3] == first[4]  # Strict SDD = ar on each prompt


def test_every_variant_decodes_the_same_tokens_on_tiny_models(model):
    from vskip.engine.decode import DecodeConfig, decode
    from vskip.engine.models.native.build import runnable
    from vskip.engine.models.native.verifier import NativeVerifier
    from vskip.engine.policy import PolicyConfig

    _, net = model
    cfg = DecodeConfig(gamma=8, max_new_tokens=40)
    ids = torch.randint(0, V - 1, (12,), generator=torch.Generator().manual_seed(5)).tolist()
    got = {}
    try:
        for isa in runnable():
            net.isa = isa
            ver = NativeVerifier(net, eos_ids=[V - 1])
            ar = decode(ids, None, ver, PolicyConfig(name="ar"), cfg)
            strict = decode(ids, Oracle(len(ids), ar.tokens, 0.25), ver, PolicyConfig(name="strict"), cfg)
            got[isa] = (ar.tokens, strict.tokens)
    finally:
        net.isa = None
    first = next(iter(got.values()))
    assert first[0] == first[1] and all(v == first for v in got.values())


def test_a_compiler_without_openmp_builds_the_kernels_single_threaded(monkeypatch, tmp_path, capsys):
    """Apple's clang has no -fopenmp: the kernels then build without it, on one thread, the same bits."""
    from vskip.engine.models.native import build

    wrapper = tmp_path / "cxx-without-openmp"
    wrapper.write_text('#!/bin/sh\nfor a in "$@"; do [ "$a" = -fopenmp ] && { echo "unsupported: $a" >&2; exit 1; }; '
                       'done\nexec g++ "$@"\n')
    wrapper.chmod(0o755)
    monkeypatch.setenv("CXX", str(wrapper))
    monkeypatch.setenv("VSKIP_CACHE", str(tmp_path / "cache"))
    lib = build.library_path("portable")
    assert lib.exists() and "no OpenMP" in capsys.readouterr().err


def test_rotary_tables_are_the_float32_rounding_of_cos_and_sin_without_any_libm():
    """The tables come from IEEE float64 arithmetic alone (the same bits on every CPU); they agree
    with numpy's float64 cos and sin to float32's rounding, up to long contexts."""
    from vskip.engine.models.native.model import Shape, rope_tables

    for theta, hd, n in ((1e4, 16, 512), (1e5, 64, 8192), (1e6, 128, 40000)):
        cos, sin = rope_tables(Shape(1, 64, 4, 2, hd, 128, 256, 1e-5, theta, n))
        ang = np.arange(n, dtype=np.float64)[:, None] * theta ** (-np.arange(0, hd, 2) / hd)[None]
        for got, ref in ((cos, np.cos(ang)), (sin, np.sin(ang))):
            assert got.dtype == torch.float32 and got.shape == (n, hd // 2)
            err = np.abs(got.numpy().astype(np.float64) - ref)
            assert float(err.max()) <= 2.0 ** -24 + 1e-12, (theta, hd, float(err.max()))


def test_blocks_of_a_format_the_kernels_do_not_compute_are_refused_when_packed():
    from vskip.engine.models.native.quant import pack

    d = np.full((16, 1), 0.1, dtype=np.float32)
    with pytest.raises(ValueError, match="offset 0 with values up to 200"):
        pack(np.full((16, 32), 200, dtype=np.uint8), d, None, 0)
    with pytest.raises(ValueError, match="and minimums"):
        pack(np.full((16, 32), 200, dtype=np.uint8), d, d, 128)
    assert pack(np.full((16, 32), 15, dtype=np.uint8), d, d, 0).nibbles
