"""Where a verifier comes from: a ``.gguf`` file given to ``--verifier``, a Qwen3 checkpoint directory,
the embedded default read from its GGUF blocks without transformers converting it, and damaged files
refused in one line before anything reaches compiled code."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from test_native import THREADS, V, tiny

ROOT = Path(__file__).resolve().parents[1]


def _tokenizer(out: Path, vocab: int) -> None:
    """A character tokenizer of ``vocab`` pieces with a chat template, saved into ``out``."""
    import string

    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    specials = ["<unk>", "<|im_start|>", "<|im_end|>"]
    chars = sorted(set(string.ascii_letters + string.digits + string.punctuation + " \n"))
    pieces = (specials + chars)[:vocab]
    pieces += [f"<unused{i}>" for i in range(vocab - len(pieces))]
    core = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(pieces)}, merges=[], unk_token="<unk>"))
    core.add_special_tokens(specials)
    tok = PreTrainedTokenizerFast(tokenizer_object=core, unk_token="<unk>", eos_token="<|im_end|>",
                                  pad_token="<|im_end|>")
    tok.chat_template = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
                         "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    tok.save_pretrained(out)


@pytest.fixture(scope="module")
def qwen3_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("qwen3")
    m = tiny("qwen3", seed=1)
    m.config.eos_token_id = 2
    m.save_pretrained(out)
    _tokenizer(out, V)
    return out


def test_the_torch_body_computes_qwen3_as_transformers_does(qwen3_dir):
    """The drafter's float body (training's, and the reference of the native drafter) has Qwen3's
    q/k norms and head size: all layers of a Qwen3 checkpoint give transformers' hidden states."""
    from transformers import AutoModelForCausalLM

    from vskip.engine.models.backbone import Backbone, BackboneConfig, read_hf_config
    from vskip.engine.models.drafter_io import backbone_state_from_hf

    cfg = BackboneConfig.from_hf(read_hf_config(qwen3_dir))
    assert cfg.qk_norm and cfg.head_dim == 32 != cfg.hidden_size // cfg.num_heads
    body = Backbone(cfg)
    sd = backbone_state_from_hf(qwen3_dir, cfg.num_layers)
    sd.pop("lm_head.weight", None)
    body.load_state_dict(sd)
    hf = AutoModelForCausalLM.from_pretrained(qwen3_dir, dtype=torch.float32).eval()
    ids = torch.randint(0, V, (1, 19))
    with torch.no_grad():
        want = hf(ids, output_hidden_states=True).hidden_states[-1]
        got, _ = body(body.embed_tokens(ids), torch.arange(19), mask="causal")
    assert torch.allclose(got, want, atol=1e-4), (got - want).abs().max()
    assert BackboneConfig.from_json(json.loads(json.dumps(cfg.to_json()))) == cfg


def test_a_qwen3_checkpoint_decodes_on_the_native_runtime_with_strict_sdd_equal_to_its_ar(qwen3_dir):
    """A Qwen3 directory as ``--verifier`` on the native runtime (read without transformers, its q/k
    norms in the kernel), with a drafter built from its own layers (also native): Strict SDD and a
    skipping policy's verified rounds, Strict SDD token for token its own greedy decoding."""
    from vskip.engine.decode import DecodeConfig, decode
    from vskip.engine.models.load import load_pair
    from vskip.engine.models.native.drafter import NativeBody
    from vskip.engine.models.native.verifier import NativeVerifier
    from vskip.engine.policy import PolicyConfig
    from vskip.engine.runtime import resolve_runtime

    rt = resolve_runtime("cpu", threads=THREADS, verifier_runtime="native")
    pair = load_pair(rt, drafter="untrained", verifier=str(qwen3_dir), copy_prior="off")
    assert isinstance(pair.verifier, NativeVerifier) and isinstance(pair.drafter.body, NativeBody)
    assert all(ly.q_norm is not None for ly in pair.verifier.net.layers + pair.drafter.body.net.layers)
    cfg = DecodeConfig(gamma=6, max_new_tokens=40)
    calls = 0
    for seed in range(3):
        ids = torch.randint(3, V, (10,), generator=torch.Generator().manual_seed(seed)).tolist()
        ar = decode(ids, None, pair.verifier, PolicyConfig(name="ar"), cfg)
        strict = decode(ids, pair.drafter, pair.verifier, PolicyConfig(name="strict"), cfg)
        assert strict.tokens == ar.tokens, seed
        calls += strict.verifier_calls
    assert calls > 0


def _shipped():
    from vskip.engine.models.embedded import gguf_path

    return gguf_path()


@pytest.mark.model
def test_the_shipped_gguf_file_as_verifier_decodes_as_the_embedded_default():
    from vskip.bench import tasks
    from vskip.engine.decode import DecodeConfig, decode
    from vskip.engine.models.load import load_pair
    from vskip.engine.policy import PolicyConfig
    from vskip.engine.prompting import encode_chat
    from vskip.engine.runtime import resolve_runtime

    rt = resolve_runtime("cpu", threads=THREADS, verifier_runtime="native")
    default = load_pair(rt)
    named = load_pair(rt, verifier=str(_shipped()))
    assert named.identity["verifier"] == str(_shipped()) and default.identity["verifier"] != named.identity["verifier"]
    assert {k: v for k, v in named.identity.items() if k != "verifier"} == \
        {k: v for k, v in default.identity.items() if k != "verifier"}
    probs = tasks.load_task("humaneval", ids=["HumanEval/0", "HumanEval/2"])
    cfg = DecodeConfig(gamma=4, gamma_max=16, min_match=6, trim=0.3, max_new_tokens=48)
    for p in probs:
        ids = encode_chat(default.tokenizer, tasks.user_prompt(p))
        assert ids == encode_chat(named.tokenizer, tasks.user_prompt(p))
        for pol in (PolicyConfig(name="strict"), PolicyConfig(name="raw")):
            a = decode(ids, default.drafter, default.verifier, pol, cfg)
            b = decode(ids, named.drafter, named.verifier, pol, cfg)
            assert a.tokens == b.tokens, (p["task_id"], pol.name)
            assert [r.K for r in a.rounds] == [r.K for r in b.rounds]


def _run(args, cache: Path, timeout=600) -> subprocess.CompletedProcess:
    env = dict(os.environ, VSKIP_CACHE=str(cache), PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "vskip", *args], capture_output=True, text=True, env=env,
                          timeout=timeout, cwd=ROOT)


def _with_kernels(cache: Path) -> Path:
    """A fresh cache holding only the kernels already built here (no model of any kind)."""
    from vskip.environment import cache_root

    src = cache_root() / "native"
    if src.is_dir():
        shutil.copytree(src, cache / "native")
    return cache


def _one_line_refusal(r: subprocess.CompletedProcess) -> str:
    assert r.returncode not in (0, -11, -6, 139), (r.returncode, r.stderr[-2000:])
    assert "Traceback" not in r.stderr, r.stderr[-3000:]
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("vskip: error:")]
    assert len(lines) == 1, r.stderr[-3000:]
    return lines[0]


@pytest.mark.model
def test_the_native_start_converts_no_gguf_through_transformers(tmp_path):
    """From a cache without any model, ``vskip generate`` on the native runtime reads the GGUF
    blocks as they are: the cache then holds the file's tokenizer and config, and no dequantized copy."""
    cache = _with_kernels(tmp_path / "cache")
    r = _run(["generate", "Say hi.", "--max-new-tokens", "4", "--runtime", "native"], cache)
    assert r.returncode == 0, r.stderr[-3000:]
    assert not list(cache.rglob("*.safetensors")), sorted(p.name for p in cache.rglob("*"))
    (meta,) = [p for p in (cache / "gguf").iterdir() if p.is_dir()]
    assert (meta / "tokenizer.json").is_file() and json.loads((meta / "config.json").read_text())["model_type"] == "llama"


@pytest.mark.model
@pytest.mark.parametrize("damage", ["truncated", "nan-scale"])
def test_a_damaged_copy_of_the_shipped_gguf_is_refused_in_one_line(tmp_path, damage):
    from vskip.engine.models.native.gguf_io import read_gguf

    bad = tmp_path / "bad.gguf"
    shutil.copyfile(_shipped(), bad)
    gf = read_gguf(_shipped())
    t = gf.tensors["blk.3.ffn_up.weight"]
    at = gf.data_start + t.offset
    del gf
    if damage == "truncated":
        with open(bad, "r+b") as f:
            f.truncate(at + 100)
    else:  # the first Q4_1 block's scale d (float16) becomes NaN
        with open(bad, "r+b") as f:
            f.seek(at)
            f.write(np.array([np.nan], dtype=np.float16).tobytes())
    r = _run(["generate", "Say hi.", "--max-new-tokens", "4", "--verifier", str(bad)], _with_kernels(tmp_path / "c"))
    line = _one_line_refusal(r)
    assert "bad.gguf" in line and "blk.3.ffn_up.weight" in line, line


@pytest.mark.model
def test_the_float_tensors_of_the_gguf_are_what_transformers_converts_bit_for_bit():
    """The drafter's base layers and training read the verifier's float weights from the GGUF blocks
    (no conversion cached); they are, tensor for tensor, what transformers' GGUF conversion writes."""
    from safetensors.torch import load_file

    from vskip.engine.models.embedded import embedded_verifier_dir
    from vskip.engine.models.native.gguf_io import float_state

    ours = float_state(_shipped())
    theirs = load_file(str(embedded_verifier_dir() / "model.safetensors"))
    assert sorted(ours) == sorted(theirs) and len(ours) == 2 + 30 * 9
    assert all(torch.equal(ours[k], theirs[k]) for k in theirs), [k for k in theirs if not torch.equal(ours[k], theirs[k])]


def test_configs_the_kernels_would_compute_wrongly_are_refused():
    from vskip.engine.models.native.model import shape_of_config

    base = dict(model_type="llama", num_hidden_layers=2, hidden_size=64, num_attention_heads=4,
                num_key_value_heads=2, intermediate_size=128, vocab_size=256, max_position_embeddings=8192)
    shape_of_config(base).check()
    for bad, match in ((dict(rope_parameters={"rope_type": "llama3", "factor": 8.0}), "rope scaling"),
                       (dict(rope_scaling={"type": "linear", "factor": 2.0}), "rope scaling"),
                       (dict(model_type="mistral", sliding_window=4096), "sliding-window"),
                       (dict(model_type="qwen2", sliding_window=4096, use_sliding_window=True), "sliding-window"),
                       (dict(num_hidden_layers=0), "not positive"),
                       (dict(model_type="gemma"), "not 'gemma'")):
        with pytest.raises(ValueError, match=match):
            shape_of_config(base | bad).check()
    shape_of_config(base | dict(model_type="qwen2", sliding_window=4096, use_sliding_window=False)).check()
