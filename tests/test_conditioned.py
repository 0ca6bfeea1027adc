"""The conditioned drafter (DFlash design): the verifier's hidden states through the loop, the
published DFlash checkpoint format on a tiny Qwen3 target, losslessness, and refusals."""

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from vskip.cli import main
from vskip.engine.decode import DecodeConfig, decode
from vskip.engine.models import tiny
from vskip.engine.models.conditioned import ConditionedDrafter, HiddenTap, default_target_layers
from vskip.engine.models.config import ModelConfig
from vskip.engine.door import open_models
from vskip.engine.policy import PolicyConfig
from vskip.engine.prompting import encode_chat


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("dflash")
    target = tiny.tiny_qwen3(root / "qwen3")
    return target, tiny.tiny_dflash(root / "dflash", target)


@pytest.fixture(scope="module")
def pair(dirs):
    v, d = dirs
    return open_models(ModelConfig(drafter=str(d), verifier=str(v), device="cpu", dtype="float32",
                                 drafter_dtype="float32"))


def test_default_target_layers_follow_dflash():
    assert default_target_layers(36, 5) == (1, 9, 17, 25, 33)  # Qwen3-8B's published drafter
    assert default_target_layers(30, 5) == (1, 8, 14, 20, 27)  # the embedded verifier's
    assert default_target_layers(10, 1) == (5,)


# -- an independent reading of the published format's semantics ---------------------------------


def _rms(x, w, eps=1e-6):
    return w * (x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps))


def _rope(x, pos, theta=1e6):
    hd = x.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, hd, 2).float() / hd)
    ang = pos.float()[:, None] * inv
    cos, sin = torch.cat([ang, ang], -1).cos(), torch.cat([ang, ang], -1).sin()
    a, b = x[..., : hd // 2], x[..., hd // 2 :]
    return x * cos + torch.cat([-b, a], -1) * sin


def reference_logits(ddir: Path, target, seq: list[int], m: int) -> torch.Tensor:
    """Draft logits [block_size - 1, V] of a DFlash checkpoint after ``seq``, its context the
    target's features of ``seq[:m]``: written from the checkpoint's files alone, without cache."""
    from safetensors.torch import load_file

    cfg = json.loads((ddir / "config.json").read_text())
    w = {k: v.float() for k, v in load_file(str(ddir / "model.safetensors")).items()}
    bs, mask = cfg["block_size"], cfg["dflash_config"]["mask_token_id"]
    h_, kvh, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    with torch.no_grad():
        hs = target.model(input_ids=torch.tensor([seq[:m]]), output_hidden_states=True).hidden_states
        ctx = torch.cat([hs[i + 1][0] for i in cfg["dflash_config"]["target_layer_ids"]], -1)
        ctx = _rms(ctx @ w["fc.weight"].T, w["hidden_norm.weight"])
        q_ids = seq[m:] + [mask] * (bs - 1)
        x = target.get_input_embeddings().weight[q_ids].float()
        pq = torch.arange(m, m + len(q_ids))
        pk = torch.arange(0, m + len(q_ids))
        for i in range(cfg["num_hidden_layers"]):
            p = lambda n: w[f"layers.{i}.{n}"]  # noqa: E731
            a = _rms(x, p("input_layernorm.weight"))
            q = _rms((a @ p("self_attn.q_proj.weight").T).view(-1, h_, hd), p("self_attn.q_norm.weight"))
            kin = torch.cat([ctx, a])
            k = _rms((kin @ p("self_attn.k_proj.weight").T).view(-1, kvh, hd), p("self_attn.k_norm.weight"))
            v = (kin @ p("self_attn.v_proj.weight").T).view(-1, kvh, hd)
            q = _rope(q.transpose(0, 1), pq)
            k = _rope(k.transpose(0, 1), pk).repeat_interleave(h_ // kvh, 0)
            v = v.transpose(0, 1).repeat_interleave(h_ // kvh, 0)
            att = torch.softmax(q @ k.transpose(1, 2) / math.sqrt(hd), -1) @ v  # every query sees every key
            x = x + att.transpose(0, 1).reshape(len(q_ids), -1) @ p("self_attn.o_proj.weight").T
            a = _rms(x, p("post_attention_layernorm.weight"))
            gate = torch.nn.functional.silu(a @ p("mlp.gate_proj.weight").T)
            x = x + (gate * (a @ p("mlp.up_proj.weight").T)) @ p("mlp.down_proj.weight").T
        out = _rms(x, w["norm.weight"])[-(bs - 1):]
        return out @ target.get_output_embeddings().weight.float().T


def _never(pair) -> torch.Tensor:
    """Ids the adapter never proposes: special tokens, the mask, ids past the tokenizer."""
    V = pair.verifier.vocab_size
    bad = torch.zeros(V, dtype=torch.bool)
    bad[sorted(pair.verifier.special_ids)] = True
    bad[pair.drafter.spec.mask_token_id] = True
    bad[len(pair.tokenizer):] = True
    return bad


def test_drafts_equal_the_published_semantics(dirs, pair):
    v, d = dirs
    assert pair.drafter.spec.source == "dflash" and pair.drafter.spec.block_size == 8
    ids = encode_chat(pair.tokenizer, "def add(a, b):")
    pair.verifier.reset()
    pair.drafter.reset()
    seq = list(ids)
    assert pair.drafter.reads_verifier
    pair.verifier.prefill(seq[:-1])  # as the loop does before a prompt's first block
    bad = _never(pair)
    checked_tail = False
    for r in range(6):
        block = pair.drafter.propose(seq, 7)
        m = pair.verifier.taps[0].covered(seq)
        ref = reference_logits(d, pair.verifier.model, seq, min(m, len(seq) - 1)).masked_fill(bad, float("-inf"))
        assert block.tokens.tolist() == ref.argmax(-1).tolist()
        np.testing.assert_allclose(block.confidence, torch.softmax(ref, -1).max(-1).values.numpy(), rtol=1e-4, atol=1e-5)
        checked_tail |= len(seq) - 1 - m > 0
        if r % 2 == 0:  # verify: the verifier runs over seq + block, hands over its states
            verdict = pair.verifier.score(seq, block.tokens)
            seq = seq + block.tokens[:2].tolist() + [int(verdict.tokens[2])]
        else:  # skip: committed without the verifier, so the next block has a tail
            seq = seq + block.tokens[:3].tolist()
    assert checked_tail


def test_the_tap_holds_verified_positions_and_a_shadow_call_adds_none(pair):
    ver = pair.verifier
    seq = encode_chat(pair.tokenizer, "Write a function that reverses a list.")
    ver.reset()
    block = [5, 6, 7]
    ver.score(seq, block)
    assert ver.taps[0].ids == seq + block
    with torch.no_grad():
        hs = ver.model.model(input_ids=torch.tensor([seq + block]), output_hidden_states=True).hidden_states
    want = torch.cat([hs[i + 1][0] for i in ver.taps[0].layers], -1)
    torch.testing.assert_close(ver.taps[0].features, want, rtol=1e-4, atol=1e-4)
    before = list(ver.taps[0].ids)
    ver.score(seq + block + [9, 10], [11, 12], shadow=True)
    assert ver.taps[0].ids == before


@pytest.mark.parametrize("cache", [True, False])
def test_strict_sdd_is_lossless_with_a_dflash_drafter(dirs, cache):
    v, d = dirs
    pair = open_models(ModelConfig(drafter=str(d), verifier=str(v), device="cpu", dtype="float32",
                                 drafter_dtype="float32", verifier_cache=cache))
    for text in ("def add(a, b):", "Write a function that reverses a list."):
        ids = encode_chat(pair.tokenizer, text)
        ar = decode(ids, None, pair.verifier, PolicyConfig(name="ar"), DecodeConfig(gamma=7, max_new_tokens=40))
        st = decode(ids, pair.drafter, pair.verifier, PolicyConfig(name="strict"), DecodeConfig(gamma=7, max_new_tokens=40))
        assert st.tokens == ar.tokens and len(ar.tokens) > 0
        # skips commit unverified tails; the loop still runs and the shadow verifier audits them
        raw = decode(ids, pair.drafter, pair.verifier, PolicyConfig(name="raw", eta_b=0.0, eta_c=0.0, k_min=1),
                     DecodeConfig(gamma=7, max_new_tokens=40))
        assert any(not r.verified for r in raw.rounds) and all(r.L is not None for r in raw.rounds)


def test_a_conditioned_drafter_drafts_beside_the_native_verifier(dirs, pair):
    """The native forward hands the tapped layers' states over as transformers' verifier does (the
    last layer's final-normed): the conditioned drafter runs beside the native runtime, reading
    states close to the float32 ones, Strict SDD equal to the native verifier's own ar, and a
    skipping policy's skipped tokens left without states until the verifier runs over them."""
    from vskip.engine.models.native.verifier import NativeVerifier

    v, d = dirs
    nat = open_models(ModelConfig(drafter=str(d), verifier=str(v), device="cpu", runtime="native"))
    assert isinstance(nat.verifier, NativeVerifier) and nat.drafter.reads_verifier
    ids = encode_chat(nat.tokenizer, "Write a function that reverses a list.")
    for p in (nat, pair):
        p.verifier.reset()
        p.verifier.prefill(ids)
    a, b = nat.drafter.tap.features_of(0), pair.drafter.tap.features_of(0)
    assert a.shape == b.shape == (len(ids), len(nat.drafter.tap.layers) * 64)
    assert float((a - b).abs().mean()) < 0.05 * float(b.abs().mean())
    assert float((a - b.roll(1, 0)).abs().mean()) > 0.3 * float(b.abs().mean())  # the check can fail
    for text in ("def add(a, b):", "Write a function that reverses a list."):
        ids = encode_chat(nat.tokenizer, text)
        cfg = DecodeConfig(gamma=7, max_new_tokens=40)
        ar = decode(ids, None, nat.verifier, PolicyConfig(name="ar"), cfg)
        st = decode(ids, nat.drafter, nat.verifier, PolicyConfig(name="strict"), cfg)
        assert st.tokens == ar.tokens and len(ar.tokens) > 0
        raw = decode(ids, nat.drafter, nat.verifier, PolicyConfig(name="raw", eta_b=0.0, eta_c=0.0, k_min=1), cfg)
        assert any(not r.verified for r in raw.rounds) and all(r.L is not None for r in raw.rounds)


@pytest.mark.parametrize("exact_head", [True, False])
def test_sampled_strict_sdd_commits_what_sampled_ar_draws(dirs, exact_head):
    """Through the transformers verifier (exact head or the model's own): at temperature 0.8 and
    top-p 0.9, Strict SDD commits ar's draws for each seed, and seeds draw different text."""
    from vskip.engine.policy import Sampling

    v, d = dirs
    pair = open_models(ModelConfig(drafter=str(d), verifier=str(v), device="cpu", dtype="float32", drafter_dtype="float32"))
    if not exact_head:
        pair.verifier.head = None
    ids = encode_chat(pair.tokenizer, "def add(a, b):")
    outs = set()
    for seed in range(3):
        cfg = DecodeConfig(gamma=7, max_new_tokens=30, sampling=Sampling(temperature=0.8, top_p=0.9, seed=seed))
        ar = decode(ids, None, pair.verifier, PolicyConfig(name="ar"), cfg, task_id="t")
        st = decode(ids, pair.drafter, pair.verifier, PolicyConfig(name="strict"), cfg, task_id="t")
        assert st.tokens == ar.tokens and len(ar.tokens) > 0
        outs.add(tuple(ar.tokens))
    greedy = decode(ids, None, pair.verifier, PolicyConfig(name="ar"), DecodeConfig(gamma=7, max_new_tokens=30))
    assert len(outs) == 3 and tuple(greedy.tokens) not in outs


def test_the_speculative_rule_runs_through_the_transformers_verifier(dirs):
    """--speculative-sampling with the conditioned drafter (one forward per block) and the
    transformers verifier: near temperature 0 both distributions are point masses, so the rule
    commits exactly ar's greedy text; at 0.8 a seed reproduces its text."""
    from vskip.engine.policy import Sampling

    v, d = dirs
    pair = open_models(ModelConfig(drafter=str(d), verifier=str(v), device="cpu", dtype="float32", drafter_dtype="float32"))
    ids = encode_chat(pair.tokenizer, "def add(a, b):")
    strict = PolicyConfig(name="strict")
    greedy = decode(ids, None, pair.verifier, PolicyConfig(name="ar"), DecodeConfig(gamma=7, max_new_tokens=30))
    cold = DecodeConfig(gamma=7, max_new_tokens=30, sampling=Sampling(temperature=1e-4, speculative=True))
    assert decode(ids, pair.drafter, pair.verifier, strict, cold, task_id="t").tokens == greedy.tokens
    warm = DecodeConfig(gamma=7, max_new_tokens=30, sampling=Sampling(temperature=0.8, seed=3, speculative=True))
    a = decode(ids, pair.drafter, pair.verifier, strict, warm, task_id="t")
    b = decode(ids, pair.drafter, pair.verifier, strict, warm, task_id="t")
    assert a.tokens == b.tokens and len(a.tokens) == 30


def test_no_checkpoint_code_runs(dirs, tmp_path):
    """The code a DFlash directory names (its auto_map's dflash.py) never runs: loading the pair
    and decoding with it leave unwritten the file that code would write."""
    import shutil

    v, d = dirs
    mine, marker = tmp_path / "dflash", tmp_path / "ran"
    shutil.copytree(d, mine)
    (mine / "dflash.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    pair = open_models(ModelConfig(drafter=str(mine), verifier=str(v), device="cpu", dtype="float32",
                                   drafter_dtype="float32"))
    ids = encode_chat(pair.tokenizer, "def add(a, b):")
    res = decode(ids, pair.drafter, pair.verifier, PolicyConfig(name="strict"),
                 DecodeConfig(gamma=7, max_new_tokens=12))
    assert isinstance(pair.drafter, ConditionedDrafter) and res.draft_blocks > 0
    assert not marker.exists()


def _variant(tmp_path, d: Path, name: str, **change) -> Path:
    import shutil

    out = tmp_path / name
    shutil.copytree(d, out)
    cfg = json.loads((out / "config.json").read_text())
    for k, val in change.items():
        if k == "target_layer_ids":
            cfg["dflash_config"][k] = val
        else:
            cfg[k] = val
    (out / "config.json").write_text(json.dumps(cfg))
    return out


@pytest.mark.parametrize("case,change,gamma,words", [
    ("layers", {"target_layer_ids": [0, 9]}, 4, "target_layer_ids names layer 9, but the verifier has 4 layers"),
    ("width", {"hidden_size": 32}, 4, "hidden_size 32 is not the verifier's width"),
    ("block", {}, 8, "block size 8"),
])
def test_a_bad_drafter_directory_is_refused_in_one_line(dirs, tmp_path, capsys, monkeypatch, case, change, gamma, words):
    v, d = dirs
    bad = _variant(tmp_path, d, case, **change)
    import vskip.engine.decode

    monkeypatch.setattr(vskip.engine.decode, "decode", lambda *a, **k: pytest.fail("decoding started"))
    rc = main(["generate", "def f():", "--drafter", str(bad), "--verifier", str(v), "--policy", "strict",
               "--gamma", str(gamma), "--max-new-tokens", "8"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and words in err[0], err


def test_tail_is_what_the_verifier_has_not_run_over():
    tap = HiddenTap((0,))
    tap.put(0, [1, 2, 3, 4], torch.zeros(4, 3))
    d = ConditionedDrafter.__new__(ConditionedDrafter)
    d.tap = tap
    assert d.tail([1, 2, 3, 4, 9]) == 0  # the bonus token only
    assert d.tail([1, 2, 3, 4, 9, 8, 7]) == 2
    assert d.tail([1, 2, 5, 6]) == 1  # a rejection: the tap's rejected positions do not count


# -- training ---------------------------------------------------------------------------------


@pytest.fixture()
def llama_dir(tmp_path):
    from test_models import tiny_llama

    m = tiny_llama(0)
    m.config.num_hidden_layers = 2
    m.save_pretrained(tmp_path / "v", safe_serialization=True)
    return tmp_path / "v"


def _tiny_model(llama_dir, **kw):
    from vskip.distill.config import ConditionedTrainConfig
    from vskip.distill.train_conditioned import build_model

    cfg = ConditionedTrainConfig(num_layers=1, block_size=5, blocks_per_seq=5, max_tail=6, **kw)
    torch.manual_seed(0)
    model = build_model(llama_dir, (0, 1), cfg, None)
    with torch.no_grad():
        model.mask_embedding.normal_()
        model.fc.weight.normal_(0, 0.3)
    return model, cfg


def test_packed_training_blocks_compute_what_the_drafter_computes(llama_dir):
    """Every packed block (context before its tail, the tail, the masks) gives the hidden states
    the drafter adapter computes from a tap holding the same features."""
    from transformers import AutoModelForCausalLM

    from vskip.distill.taps import tapped_forward
    from vskip.distill.train_conditioned import pack_row

    model, cfg = _tiny_model(llama_dir, no_tail_share=0.3)
    verifier = AutoModelForCausalLM.from_pretrained(llama_dir).eval()
    row = np.random.default_rng(1).integers(3, 90, 40)
    feats = tapped_forward(verifier, (0, 1))(torch.tensor([row.tolist()]))
    b = pack_row(row, 10, len(row), np.random.default_rng(2), cfg, model.mask_id)
    with torch.no_grad():
        ctx = model.context(feats[: b["C"]][None], torch.arange(b["C"]))
        h = model(b["ids"], b["pos"], ctx, b["mask"])[0]
    tap = HiddenTap((0, 1))
    drafter = ConditionedDrafter(model, tap)
    W = model.head_weight()
    tails = set()
    for s, L, m, a in b["spans"]:
        tap.reset()
        tap.put(0, row[:m].tolist(), feats[:m])
        block = drafter.propose(row[: a + 1].tolist(), cfg.block_size - 1)
        want = torch.softmax(h[s + L - cfg.block_size + 1 : s + L] @ W.T, -1).max(-1).values
        np.testing.assert_allclose(block.confidence, want.numpy(), rtol=1e-4, atol=1e-5)
        tails.add(a - m)
    assert 0 in tails and len(tails) > 1  # blocks with and without an unverified tail


def test_training_lowers_the_loss_and_resumes(llama_dir, tmp_path):
    from vskip.distill.train_conditioned import load_state, read_state, row_loss, save_state, trainable

    model, cfg = _tiny_model(llama_dir)
    rng = np.random.default_rng(0)
    rows = [rng.integers(3, 90, 30) for _ in range(3)]
    feats = [torch.randn(30, 64) for _ in rows]
    head_index = torch.arange(96)
    opt = torch.optim.AdamW(trainable(model).values(), lr=3e-3)

    def loss():
        s, w = zip(*(row_loss(model, r, 8, f, np.random.default_rng(5), cfg, head_index) for r, f in zip(rows, feats)))
        return sum(s) / sum(w)

    first = float(loss().detach())
    for _ in range(20):
        opt.zero_grad()
        loss().backward()
        opt.step()
    assert float(loss().detach()) < first - 0.5
    model.head_ids = torch.arange(96)
    save_state(tmp_path, model, opt, 20, cfg, [{"step": 20}])
    meta, tensors = read_state(tmp_path)
    fresh, _ = _tiny_model(llama_dir)
    load_state(fresh, tensors)
    assert meta["step"] == 20 and meta["layers"] == [0, 1]
    for (n, a), b in zip(trainable(model).items(), trainable(fresh).values()):
        assert torch.equal(a, b), n


def test_checkpoint_code_never_runs_even_when_stdin_says_yes(dirs, tmp_path, monkeypatch, capsys):
    """A verifier directory of an unknown model type whose config and tokenizer name code (auto_map)
    that would leave a mark: with 'y' on standard input, vskip refuses it in one line and runs none
    of it."""
    import io
    import shutil

    v, d = dirs
    mark = tmp_path / "ran"
    evil = tmp_path / "evil"
    shutil.copytree(v, evil)
    code = f"open({str(mark)!r}, 'w').write('ran')\n"
    for name in ("modeling_evil.py", "configuration_evil.py", "tokenization_evil.py"):
        (evil / name).write_text(code)
    cfg = json.loads((evil / "config.json").read_text())
    cfg.update(model_type="evil", architectures=["EvilForCausalLM"],
               auto_map={"AutoConfig": "configuration_evil.EvilConfig", "AutoModelForCausalLM": "modeling_evil.Evil"})
    (evil / "config.json").write_text(json.dumps(cfg))
    tc = json.loads((evil / "tokenizer_config.json").read_text())
    tc.update(tokenizer_class="EvilTokenizer", auto_map={"AutoTokenizer": ["tokenization_evil.EvilTokenizer", None]})
    (evil / "tokenizer_config.json").write_text(json.dumps(tc))
    for extra in ([], ["--drafter", str(d), "--gamma", "4"]):
        monkeypatch.setattr("sys.stdin", io.StringIO("y\n" * 8))
        rc = main(["generate", "def f():", "--verifier", str(evil), "--policy", "strict" if extra else "ar",
                   "--max-new-tokens", "4", *extra])
        # transformers' own warnings may go to stderr too (and, after another test closed the
        # stream its logger holds, as a logging error): vskip's lines are the ones that count
        err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("vskip:")]
        assert rc in (1, 2) and len(err) == 1 and err[0].startswith("vskip: error: "), err
        assert "[y/N]" not in err[0] and not mark.exists()


def test_extract_train_export_and_decode_end_to_end(llama_dir, tmp_path):
    """Features extracted from the verifier equal its hidden states; a training run stops at its
    time limit and resumes; the exported drafter matches its manifest, loads beside the verifier
    and Strict SDD with it equals the verifier's own greedy output."""
    from test_train import _tiny_data
    from transformers import AutoModelForCausalLM

    from vskip.distill.config import ConditionedTrainConfig
    from vskip.distill.rows import load_rows
    from vskip.distill.taps import extract, load_taps, summary
    from vskip.distill.train_conditioned import export, read_state, train
    from vskip.engine.models.conditioned_io import hf_parts, load_conditioned
    from vskip.files import file_sha256

    data = _tiny_data(tmp_path / "data", n=12)
    feats = tmp_path / "feats"
    idx = extract(data, feats, llama_dir, (0, 1), holdout=2, chunk_rows=4, max_rows=4, progress=False)
    assert summary(idx)["chunks"] == 2  # the held-out chunk and one of four training rows
    idx = extract(data, feats, llama_dir, (0, 1), holdout=2, chunk_rows=4, progress=False)  # resumes, extends
    assert summary(idx)["rows"] == 12
    taps = load_taps(feats)
    rows = load_rows(data)
    verifier = AutoModelForCausalLM.from_pretrained(llama_dir).eval()
    with torch.no_grad():
        hs = verifier.model(input_ids=torch.tensor([rows.rows[3].tolist()]), output_hidden_states=True).hidden_states
    want = torch.cat([hs[1][0], hs[2][0]], -1).to(torch.bfloat16)
    assert torch.equal(taps.features[3], want)
    with pytest.raises(ValueError, match="another layers"):
        extract(data, feats, llama_dir, (1,), holdout=2, chunk_rows=4, progress=False)

    cfg = ConditionedTrainConfig(num_layers=1, block_size=5, blocks_per_seq=4, batch_seqs=2, steps=6, warmup=1,
                                 holdout=2, checkpoint_every=2, eval_every=3, eval_blocks=2, replay_answers=2,
                                 replay_tokens=8, max_tail=4, threads=1)
    out = tmp_path / "train"
    train(data, feats, out, llama_dir, cfg, progress=False, until=0.0)  # past its time: a checkpoint, no step
    assert read_state(out)[0]["step"] == 0
    train(data, feats, out, llama_dir, cfg, progress=False)
    meta, _ = read_state(out)
    assert meta["step"] == 6 and [e["step"] for e in meta["log"] if "first_step_top1" in e] == [0, 3, 6]
    ddir = export(out, data, feats, llama_dir)
    m = json.loads((ddir / "manifest.json").read_text())
    assert m["weights"]["sha256"] == file_sha256(ddir / "drafter.safetensors")
    assert m["features"]["layers"] == [0, 1] and set(m["holdout"]["tails"]) == {"0", "1", "2", "4", "8", "16"}
    pos = m["holdout"]["position_top1"]  # each block position's own top-1; the first is P(L >= 1)
    assert len(pos) == 4 and all(0 <= x <= 1 for x in pos)
    assert pos[0] == pytest.approx(m["holdout"]["tails"]["0"]["p_L_ge_1"], abs=1e-4)
    assert (out / "curve.png").exists() and load_conditioned(ddir, *hf_parts(verifier)).spec.block_size == 5
    from vskip.engine.models.verifier import HFVerifier

    ver = HFVerifier(verifier, eos_ids=[2])  # the tiny checkpoint has no tokenizer: wired as the loader wires it
    tap = HiddenTap((0, 1))
    ver.set_tap(tap)
    drafter = ConditionedDrafter(load_conditioned(ddir, *hf_parts(verifier)), tap)
    ids = rows.rows[0][: rows.prompt_lens[0]].tolist()
    ar = decode(ids, None, ver, PolicyConfig(name="ar"), DecodeConfig(gamma=4, max_new_tokens=20))
    st = decode(ids, drafter, ver, PolicyConfig(name="strict"), DecodeConfig(gamma=4, max_new_tokens=20))
    assert st.tokens == ar.tokens and len(ar.tokens) > 0


def test_transformers_baselines_sample_with_the_same_settings_seeded_per_prompt(pair):
    """compare's hf and lookup configurations under --temperature: transformers' own sampling,
    the same tokens for the same seed and prompt, others for another seed; greedy is ar."""
    from vskip.engine.policy import Sampling
    from vskip.study.compare import _hf_generate
    from vskip.study.variants import parse_variant

    ids = encode_chat(pair.tokenizer, "def add(a, b):")
    s = dict(parse_variant("hf", DecodeConfig(gamma=4, sampling=Sampling(temperature=0.9, top_k=20, seed=1)), 1).params)
    assert s == {"seed": 1, "temperature": 0.9, "top_k": 20, "top_p": 1.0}
    a, _ = _hf_generate(pair, ids, 20, None, s, key=7)
    b, _ = _hf_generate(pair, ids, 20, 3, s, key=7)
    c, _ = _hf_generate(pair, ids, 20, None, s | {"seed": 2}, key=7)
    assert a == _hf_generate(pair, ids, 20, None, s, key=7)[0] and a != c and len(b) > 0
    greedy, _ = _hf_generate(pair, ids, 20, None)
    ar = decode(ids, None, pair.verifier, PolicyConfig(name="ar"), DecodeConfig(gamma=4, max_new_tokens=20))
    assert greedy == ar.tokens
    assert parse_variant("hf", DecodeConfig(gamma=4), 1).params == ()  # greedy settings stay as they were


def _damage(d: Path, case: str) -> str:
    """Change the DFlash directory ``d`` as ``case`` says; returns the extra flags the case needs."""
    import os
    import shutil

    cfg = json.loads((d / "config.json").read_text())
    weights = d / "model.safetensors"
    extra = ""
    if case == "list":
        cfg = [cfg]
    elif case == "heads":
        cfg["num_attention_heads"] *= 2
        cfg["num_key_value_heads"] *= 2
    elif case == "fc":
        cfg["dflash_config"]["target_layer_ids"] = [0, 1, 2]
    elif case in ("mask_big", "mask_negative"):
        cfg["dflash_config"]["mask_token_id"] = cfg["vocab_size"] + 5 if case == "mask_big" else -1
    elif case == "float_layers":
        cfg["dflash_config"]["target_layer_ids"] = [0.0, 2.7]
    elif case == "block":
        cfg["block_size"] = 1000000
    elif case == "duplicate":
        shutil.copyfile(weights, d / "model-copy.safetensors")
    elif case == "weights_dir":
        (d / "extra.safetensors").mkdir()
    elif case == "weights_fifo":
        weights.unlink()
        os.mkfifo(weights)
    elif case == "steps":
        extra = "--steps 2"
    if case == "config_fifo":
        (d / "config.json").unlink()
        os.mkfifo(d / "config.json")
    else:
        (d / "config.json").write_text(json.dumps(cfg))
    return extra


@pytest.mark.parametrize("case, words", [
    ("list", "config.json is a JSON list, not an object"),
    ("heads", "_proj.weight has shape"),
    ("fc", "fc.weight has shape"),
    ("mask_big", "dflash_config.mask_token_id"),
    ("mask_negative", "dflash_config.mask_token_id -1 lies outside"),
    ("float_layers", "dflash_config.target_layer_ids[0] must be an integer, got 0.0"),
    ("block", "block_size 1000000 lies outside 2..513"),
    ("duplicate", "is in both"),
    ("weights_dir", "extra.safetensors is a directory, not a file"),
    ("weights_fifo", "model.safetensors is not a regular file"),
    ("config_fifo", "config.json is not a regular file"),
    ("steps", "drafts its block in one forward; --steps 2"),
])
def test_a_drafter_directory_is_checked_before_any_weight_loads(dirs, tmp_path, capsys, monkeypatch, case, words):
    """Issue 52's bad drafter directories: each refuses in one line naming the file and the field,
    exit 2, before the verifier (or any weight) loads, and none hangs on a FIFO."""
    import shutil

    import vskip.engine.models.load as load

    v, d = dirs
    bad = tmp_path / case
    shutil.copytree(d, bad)
    extra = _damage(bad, case)
    monkeypatch.setattr(load, "load_verifier", lambda *a, **k: pytest.fail("the verifier loaded"))
    rc = main(["generate", "def f():", "--drafter", str(bad), "--verifier", str(v), "--policy", "strict", "--gamma",
               "4", "--max-new-tokens", "8", *extra.split()])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and words in err[0], err
    assert str(bad) in err[0] or case == "steps", err


def test_extract_resume_rebuilds_a_damaged_chunk_and_training_names_it(llama_dir, tmp_path, capsys):
    """A chunk cut short or changed in place is not kept by a resume: its size and sha256 are
    checked against index.json and it is extracted again, to the same bytes; before that, reading
    the features refuses in one line naming the chunk."""
    from test_train import _tiny_data

    from vskip.distill.taps import extract, load_taps
    from vskip.files import FileError, file_sha256

    data = _tiny_data(tmp_path / "data", n=12)
    feats = tmp_path / "feats"
    extract(data, feats, llama_dir, (0, 1), holdout=2, chunk_rows=4, max_rows=4, progress=False)
    first, second = feats / "chunk_00000.safetensors", feats / "chunk_00001.safetensors"
    good = {p: p.read_bytes() for p in (first, second)}
    second.write_bytes(good[second][: len(good[second]) // 2])  # a truncated chunk, as a full disk leaves it
    flipped = bytearray(good[first])
    flipped[-1] ^= 0xFF
    first.write_bytes(bytes(flipped))  # same size, other bytes
    with pytest.raises(FileError, match="chunk_00001.safetensors is .* bytes where the index records"):
        load_taps(feats)
    idx = extract(data, feats, llama_dir, (0, 1), holdout=2, chunk_rows=4, max_rows=4, progress=False)
    err = capsys.readouterr().err
    assert "chunk_00000.safetensors is not the bytes the index records" in err and "chunk_00001" in err
    assert {p: p.read_bytes() for p in (first, second)} == good
    assert idx["chunks"]["1"]["sha256"] == file_sha256(second) and len(load_taps(feats).features) == 6


# -- in a batch ------------------------------------------------------------------------------


def test_each_slot_taps_its_own_rows_of_a_shared_forward(pair):
    """Two sequences verified in one forward: each slot's tap holds that row's hidden states, as a
    forward over the sequence alone gives them; a shadow call leaves its slot's tap as it was. (The
    rows differ in length, and a CPU verifier packs them: the taps read the packed positions.)"""
    from vskip.engine.models.protocols import Call

    ver = pair.verifier
    assert ver.packs
    ver.open_slots(2)
    try:
        seqs = [encode_chat(pair.tokenizer, t) for t in ("def add(a, b):", "Write a function that reverses a list.")]
        ver.score_many([Call(seqs[0], [5, 6, 7], slot=0), Call(seqs[1], [8, 9], slot=1)])
        tap = ver.taps[0]
        for slot, (seq, block) in enumerate(zip(seqs, ([5, 6, 7], [8, 9]))):
            assert tap.ids_of(slot) == seq + block
            with torch.no_grad():
                hs = ver.model.model(input_ids=torch.tensor([seq + block]), output_hidden_states=True).hidden_states
            want = torch.cat([hs[i + 1][0] for i in tap.layers], -1)
            torch.testing.assert_close(tap.features_of(slot), want, rtol=1e-4, atol=1e-4)
        before = list(tap.ids_of(1))
        ver.score_many([Call(seqs[0] + [5, 6, 7], [1], slot=0), Call(seqs[1] + [8, 9, 4], [3], shadow=True, slot=1)])
        assert tap.ids_of(1) == before and tap.ids_of(0) == seqs[0] + [5, 6, 7, 1]
        ver.reset(1)
        assert tap.ids_of(1) == [] and tap.ids_of(0) == seqs[0] + [5, 6, 7, 1]
    finally:
        ver.open_slots(1)


@pytest.mark.parametrize("policy", [PolicyConfig(name="strict"), PolicyConfig(name="raw", eta_b=0.0, eta_c=0.0, k_min=1)])
def test_a_conditioned_drafter_decodes_in_a_batch_as_it_does_alone(dirs, policy):
    """Continuous batching with a DFlash drafter: each slot drafts from its own tapped states, so
    every prompt's rounds at batch 3 (five prompts, slots refilled) are those of batch 1, skips and
    shadow verification included."""
    from vskip.engine.decode import Job, decode_many

    v, d = dirs
    pair = open_models(ModelConfig(drafter=str(d), verifier=str(v), device="cpu", dtype="float32",
                                   drafter_dtype="float32"))
    texts = ("def add(a, b):", "Write a function that reverses a list.", "Sort a list.", "def f(x):\n    return",
             "Count the vowels in a string.")
    jobs = [Job(encode_chat(pair.tokenizer, t), f"p{i}") for i, t in enumerate(texts)]
    cfg = DecodeConfig(gamma=7, max_new_tokens=30)
    alone = {j.task_id: r for j, r in decode_many(jobs, pair.drafter, pair.verifier, policy, cfg, batch_size=1)}
    batched = {j.task_id: r for j, r in decode_many(jobs, pair.drafter, pair.verifier, policy, cfg, batch_size=3)}
    for t, r in alone.items():
        assert batched[t].tokens == r.tokens and len(r.tokens) > 0, t
        assert [(x.verified, x.K, x.L) for x in batched[t].rounds] == [(x.verified, x.K, x.L) for x in r.rounds], t
    if policy.name == "strict":
        ar = {j.task_id: r for j, r in decode_many(jobs, None, pair.verifier, PolicyConfig(name="ar"), cfg)}
        assert all(batched[t].tokens == ar[t].tokens for t in ar)
    else:
        assert any(not x.verified for r in batched.values() for x in r.rounds)
