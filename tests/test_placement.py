"""Placement over devices, the memory plan, and the paper's pair layout (Qwen3 verifier, Dream
drafter whose tokenizers differ in special tokens), on tiny random checkpoints and the published
configs of DiffuCoder-7B-Instruct and Qwen3-32B (tests/data/paper)."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from vskip.cli import main
from vskip.engine.decode import DecodeConfig, decode
from vskip.engine.models import tiny
from vskip.engine.models.config import ModelConfig
from vskip.engine.models.verifiers import load_verifier
from vskip.engine.models.vocab import read_token_table, vocabulary_fit
from vskip.engine.door import open_models
from vskip.engine.models.placement import MemoryPlanError, Shape, plan_memory, read_shape
from vskip.engine.policy import PolicyConfig
from vskip.engine.prompting import encode_chat
from vskip.engine.runtime import Runtime, parse_max_memory, resolve_runtime, set_sync, sync

PAPER = Path(__file__).parent / "data" / "paper"
GIB = 1 << 30


@pytest.fixture(scope="module")
def pair_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny")
    return tiny.tiny_qwen3(root / "qwen3"), tiny.tiny_dream(root / "dream", favour=tiny.CLASHING_IDS)


def test_parse_max_memory():
    assert parse_max_memory("0=40GiB, 1=2MiB,cpu=1GB") == {"cuda:0": 40 * GIB, "cuda:1": 2 << 20, "cpu": 10**9}
    assert parse_max_memory(None) is None
    for bad in ("40GiB", "0=lots", "tpu=4GiB", "0=0GiB", ","):
        with pytest.raises(ValueError):
            parse_max_memory(bad)


@pytest.mark.parametrize("kind", ["qwen3", "qwen2", "llama", "qwen3_tied"])
def test_shape_counts_the_parameters_transformers_builds(kind):
    import transformers

    common = dict(vocab_size=300, hidden_size=48, intermediate_size=80, num_hidden_layers=3, num_attention_heads=4,
                  num_key_value_heads=2)
    if kind.startswith("qwen3"):
        cfg = transformers.Qwen3Config(head_dim=16, tie_word_embeddings=kind.endswith("tied"), **common)
        model = transformers.Qwen3ForCausalLM(cfg)
    elif kind == "qwen2":
        cfg = transformers.Qwen2Config(tie_word_embeddings=False, **common)
        model = transformers.Qwen2ForCausalLM(cfg)
    else:
        cfg = transformers.LlamaConfig(tie_word_embeddings=False, **common)
        model = transformers.LlamaForCausalLM(cfg)
    n = sum(p.numel() for p in model.parameters())  # tied weights are counted once
    assert Shape.from_hf(cfg.to_dict()).params == n


def test_paper_pair_shapes_match_their_published_sizes():
    v = read_shape(PAPER / "Qwen3-32B", "verifier")
    d = read_shape(PAPER / "DiffuCoder-7B-Instruct", "drafter")
    assert v.params == pytest.approx(32.76e9, rel=1e-3) and v.qk_norm and not v.recompute
    assert d.params == pytest.approx(7.62e9, rel=1e-3) and d.bias and d.recompute


def test_a_vskip_drafter_counts_its_restricted_head():
    """The shipped drafter's output head holds only the rows of its manifest's head_size, and its
    layers, mask embedding and copy-hint input are exactly what its safetensors hold besides the head's ids."""
    import json
    import math

    from safetensors import safe_open

    from vskip.engine.models.embedded import embedded_drafter_dir

    ddir = embedded_drafter_dir()
    d = read_shape(ddir, "drafter")
    head = json.loads((ddir / "drafter.json").read_text())["meta"]["head_size"]
    assert d.head_rows == head and d.head_params == head * d.hidden
    with safe_open(str(ddir / "drafter.safetensors"), framework="pt") as f:
        stored = {k: math.prod(f.get_slice(k).get_shape()) for k in f.keys()}
    assert stored.pop("head_ids") == head
    assert sum(stored.values()) == d.params - d.embed_params - d.head_params


def _paper_plan(**kw):
    base = dict(dtype="bfloat16", drafter_dtype="bfloat16", prompt_tokens=1024, max_new_tokens=512, gamma=32,
                verifier_cache=False)
    return plan_memory(PAPER / "Qwen3-32B", PAPER / "DiffuCoder-7B-Instruct", **(base | kw))


def test_paper_pair_plans():
    one = _paper_plan(verifier_device="cuda:0", drafter_device="cuda:0", capacity=parse_max_memory("0=80GiB"))
    assert one.fits and one.devices[0].verdict == "tight"
    assert one.devices[0].weights == (32_762_123_264 + 7_615_616_512) * 2
    apart = _paper_plan(verifier_device="cuda:1", drafter_device="cuda:0", capacity=parse_max_memory("0=40GiB,1=40GiB"))
    assert not apart.fits and "cuda:1 needs" in apart.refusal()
    split = _paper_plan(verifier_device="balanced", drafter_device="cuda:0", capacity=parse_max_memory("0=40GiB,1=40GiB"))
    assert not split.fits and "disk" in split.refusal()
    assert {d for d in split.verifier_map.values()} >= {"cuda:0", "cuda:1"}
    big = _paper_plan(verifier_device="balanced", drafter_device="cuda:0", capacity=parse_max_memory("0=80GiB,1=80GiB"))
    assert big.fits and set(big.verifier_map.values()) == {"cuda:0", "cuda:1"}
    layers = [int(h.split("(")[1].split()[0]) for d in big.devices for h in d.holds if h.startswith("verifier (")]
    assert sum(layers) == 64
    # the cache kept: its keys/values at the budget are counted on the devices holding the layers
    cached = _paper_plan(verifier_device="balanced", drafter_device="cuda:0", verifier_cache=True,
                         capacity=parse_max_memory("0=80GiB,1=80GiB"))
    # (each row's buffers doubled from the first forward's 1057 columns past the 1569 decoded: 2114)
    assert sum(d.cache for d in cached.devices) == 2 * 64 * 8 * 128 * 2114 * 2
    batched = _paper_plan(verifier_device="balanced", drafter_device="cuda:0", verifier_cache=True, batch=4,
                          capacity=parse_max_memory("0=400GiB,1=400GiB"))
    # four rows each, on the devices holding the layers (the Dream-layout drafter keeps no cache)
    assert sum(d.cache for d in batched.devices) == 4 * 2 * 64 * 8 * 128 * 2114 * 2


@pytest.mark.parametrize("first,steps", [(40, 3), (150, 1), (300, 2), (700, 5)])
def test_plan_counts_what_the_ragged_cache_grows_to(first, steps):
    """The plan's rule (ragged_capacity) against the cache itself, fed forwards that decode a few
    positions at a time past ``first`` columns."""
    import torch

    from vskip.engine.models.placement import ragged_capacity
    from vskip.engine.models.ragged import RaggedCache

    cache, span = RaggedCache(2), first
    while span <= 1100:
        pos = torch.arange(span - steps, span)[None].expand(2, steps) if span > first else torch.arange(span)[None].expand(2, span)
        cache.begin(torch.arange(2), pos)
        kv = torch.zeros(2, 1, pos.shape[1], 4)
        cache.update(kv, kv, 0)
        assert cache.k[0].shape[2] == ragged_capacity(first, span)
        span += steps


def test_plan_command_writes_json_and_markdown(tmp_path, capsys):
    out = tmp_path / "plan.json"
    rc = main(["plan", "--verifier", str(PAPER / "Qwen3-32B"), "--drafter", str(PAPER / "DiffuCoder-7B-Instruct"),
               "--max-memory", "0=40GiB,1=40GiB", "--drafter-device", "cuda:0", "--verifier-device", "cuda:1",
               "--no-verifier-cache", "--gamma", "32", "--out", str(out)])
    assert rc == 1  # does not fit
    data = json.loads(out.read_text())
    assert data["fits"] is False and data["command"].startswith("vskip plan --verifier")
    assert "does not fit" in (tmp_path / "plan.md").read_text() and "does not fit" in capsys.readouterr().out


def test_run_help_documents_placement(capsys):
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    text = capsys.readouterr().out
    for flag in ("--drafter-device", "--verifier-device", "--max-memory", "balanced"):
        assert flag in text


def test_runtime_validates_placement():
    r = resolve_runtime("cpu", verifier_device="auto", max_memory="cpu=2GiB")
    assert r.verifier_split and r.dtype == "float32" and r.cuda_indices() == []
    with pytest.raises(ValueError, match="no CUDA"):
        resolve_runtime("cpu", drafter_device="cuda:1")
    with pytest.raises(ValueError, match="none is available"):
        resolve_runtime("cpu", verifier_device="balanced")
    with pytest.raises(ValueError, match="unknown device"):
        resolve_runtime("cpu", verifier_device="tpu")


def test_every_device_a_round_uses_is_synchronised(monkeypatch):
    calls = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda i=None: calls.append(i))
    r = Runtime(device="cuda:0", drafter_device="cuda:2", verifier_device="balanced", max_memory="0=1GiB,1=1GiB")
    assert r.cuda_indices() == [0, 1, 2]
    try:
        r.activate()
        sync()
        assert calls == [0, 1, 2]
    finally:
        set_sync(None)
    assert Runtime(device="cpu").cuda_indices() == []


def test_memory_refusal_comes_before_loading(pair_dirs, monkeypatch):
    import transformers

    v, d = pair_dirs

    def never(*a, **k):
        raise AssertionError("weights were loaded")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", never)
    with pytest.raises(MemoryPlanError, match="offload"):
        open_models(ModelConfig(drafter=str(d), verifier=str(v), device="cpu", verifier_device="auto",
                              max_memory="cpu=64KiB"))
    rc = main(["generate", "hi", "--drafter", str(d), "--verifier", str(v), "--device", "cpu",
               "--verifier-device", "sequential", "--max-memory", "cpu=64KiB"])
    assert rc == 2


def test_tiny_tokenizers_have_the_real_layout(pair_dirs):
    from transformers import AutoTokenizer

    v, d = pair_dirs
    vt, dt = AutoTokenizer.from_pretrained(v), read_token_table(d)
    assert vt.convert_ids_to_tokens([tiny.tiny_id(151645), tiny.tiny_id(151667)]) == ["<|im_end|>", "<think>"]
    assert dt.convert_ids_to_tokens([tiny.tiny_id(151645), tiny.tiny_id(151666)]) == ["<|im_end|>", "<|mask|>"]
    assert json.loads((d / "config.json").read_text())["mask_token_id"] == tiny.tiny_id(151666)
    allowed = vocabulary_fit(dt, vt, torch.arange(tiny.DRAFTER_VOCAB), len(vt))
    ok = set(torch.nonzero(allowed)[:, 0].tolist())
    assert not ok & set(tiny.CLASHING_IDS)  # read differently by the two tokenizers
    assert tiny.tiny_id(151645) in ok and tiny.tiny_id(151664) in ok  # same string in both
    assert max(ok) < len(dt)  # nothing past what the drafter's tokenizer names


@pytest.mark.parametrize("cache", [True, False])
def test_lossless_strict_with_a_qwen3_verifier_and_a_dream_drafter(pair_dirs, cache):
    v, d = pair_dirs
    pair = open_models(ModelConfig(drafter=str(d), verifier=str(v), device="cpu", dtype="float32",
                                 drafter_dtype="float32", verifier_cache=cache))
    assert pair.identity["drafter"] == str(d)
    proposed = []
    propose_many = pair.drafter.propose_many

    def spy(requests, features=False, sampling=None):
        blocks = propose_many(requests, features, sampling)
        for block in blocks:
            proposed.extend(block.tokens.tolist())
        return blocks

    pair.drafter.propose_many = spy
    banned = set(tiny.CLASHING_IDS) | set(pair.verifier.special_ids)
    for text in ("def add(a, b):", "Write a function that reverses a list."):
        ids = encode_chat(pair.tokenizer, text)
        ar = decode(ids, None, pair.verifier, PolicyConfig(name="ar"), DecodeConfig(gamma=8, max_new_tokens=40))
        pair.verifier.reset()
        st = decode(ids, pair.drafter, pair.verifier, PolicyConfig(name="strict"), DecodeConfig(gamma=8, max_new_tokens=40))
        pair.verifier.reset()
        pair.drafter.reset()
        assert st.tokens == ar.tokens and len(ar.tokens) > 0
    assert proposed and not set(proposed) & banned
    # the network itself prefers the clashing ids: the restriction above is what keeps them out
    with torch.no_grad():
        x = torch.tensor([ids + [tiny.tiny_id(151666)] * 8])
        h, _ = pair.drafter.model(x, torch.arange(x.shape[1]))
        top = (h[0] @ pair.drafter.model.lm_head.weight.T).argmax(-1)
    assert set(top.tolist()) & set(tiny.CLASHING_IDS)


def test_verifier_through_a_device_map(pair_dirs, monkeypatch):
    import transformers

    v, _ = pair_dirs
    maps = []
    load = transformers.AutoModelForCausalLM.from_pretrained

    def spy(*a, **k):
        maps.append(k.get("device_map"))
        return load(*a, **k)

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", spy)
    rt = resolve_runtime("cpu", "float32", verifier_device="auto", max_memory="cpu=4GiB")
    pair = open_models(ModelConfig(verifier=str(v), device="cpu", dtype="float32", verifier_device="auto",
                                 max_memory="cpu=4GiB"), need_drafter=False)
    assert pair.plan.verifier_map and set(pair.plan.verifier_map.values()) == {"cpu"}
    assert maps == [pair.plan.verifier_map]  # what was planned is what loads
    plain, _ = load_verifier(v, Runtime(device="cpu"))
    modules = {"model.embed_tokens": "cpu", "model.norm": "cpu", "model.rotary_emb": "cpu", "lm_head": "cpu"}
    modules |= {f"model.layers.{i}": "cpu" for i in range(4)}
    mapped, _ = load_verifier(v, rt, device_map=modules)
    assert maps[-1] == modules
    seq, block = list(range(3, 40)), [5, 6, 7]
    for ver in (pair.verifier, mapped):
        a, b = ver.score(seq, block), plain.score(seq, block)
        assert np.array_equal(a.tokens, b.tokens) and np.allclose(a.draft_gap, b.draft_gap, atol=1e-5)


def test_gpu_check_script_passes_here(capsys, tmp_path):
    import importlib.util

    path = Path(__file__).parents[1] / "scripts" / "gpu_check.py"
    spec = importlib.util.spec_from_file_location("gpu_check", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    out = tmp_path / "check.json"
    assert mod.main(["--limit", "1", "--max-new-tokens", "12", "--out", str(out)]) == 0
    assert "PASS" in capsys.readouterr().out
    rows = json.loads(out.read_text())["results"]
    assert {(r["policy"], r["verifier_cache"]) for r in rows} == {("ar", True), ("strict", True), ("raw", True),
                                                                 ("ar", False), ("strict", False)}
    assert all(r["equals_ar"] for r in rows if r["policy"] == "strict")


def test_a_qwen3_style_template_gets_thinking_off(pair_dirs):
    from transformers import AutoTokenizer

    v, _ = pair_dirs
    tok = AutoTokenizer.from_pretrained(v)
    assert "enable_thinking" in tok.chat_template
    text = tok.decode(encode_chat(tok, "hi"))
    assert text.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    plain = tiny._verifier_tokenizer(tiny.QWEN_ADDED + tiny.QWEN3_EXTRA)  # no switch: nothing added
    assert plain.decode(encode_chat(plain, "hi")).endswith("<|im_start|>assistant\n")


def test_the_native_plan_counts_blocks_and_the_slot_caches_growth():
    """A plan for the native runtime counts the verifier's blocks as the GGUF file holds them (not
    float32 weights), and each slot at the capacity the slot cache's one growth rule reaches."""
    from vskip.engine.models.drafter_files import resolve_drafter_dir
    from vskip.engine.models.native.cache import SlotCache, capacity_for
    from vskip.engine.models.native.model import Shape as NativeShape
    from vskip.engine.models.source import gguf_file
    from vskip.engine.models.verifiers import resolve_verifier_dir

    kw = dict(verifier_device="cpu", drafter_device="cpu", dtype="float32", drafter_dtype="bfloat16",
              prompt_tokens=300, max_new_tokens=512, gamma=16, batch=4)
    vdir, ddir = resolve_verifier_dir(None), resolve_drafter_dir(None)
    hf = plan_memory(vdir, ddir, **kw)
    native = plan_memory(vdir, ddir, runtime="native", **kw)
    (u,), (h,) = native.devices, hf.devices
    assert "verifier (native)" in u.holds and native.settings["runtime"] == "native"
    drafter_float = read_shape(ddir, "drafter").params * 2
    assert gguf_file(vdir).stat().st_size < u.weights - drafter_float < h.weights - drafter_float
    shape = NativeShape(1, 32, 2, 1, 16, 32, 16, 1e-5, 1e4, 4096)
    for first, need in ((40, 300), (317, 829), (700, 701), (2000, 4096)):
        cache = SlotCache(shape, 1)
        cache.reserve([0], first)
        for n in range(first, need + 1, 3):
            cache.reserve([0], n)
        assert cache.capacity(0) == capacity_for(first, need, shape.max_positions), (first, need)
