"""What a GGUF file's tensors stand for: the transformers-style config its metadata says, every
tensor a model of that shape must hold checked (present once, of its size and a type read here,
finite), the native runtime's Transformer (Q4_0, Q4_1 and Q8_0 blocks as they are; F32, F16 and
BF16 matrices quantized to Q8_0), and the float tensors the drafter's torch body reads.

The compiled kernels trust every pointer and size they are given, so this module and the format's
reader (:mod:`.gguf`) are their guard: every inconsistency of a file refuses with a
:class:`~.gguf.FormatError` of one line that names the file and, where one is concerned, the tensor,
before anything reaches :func:`~vskip.engine.models.native.model.from_blocks`.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from .gguf import (BLOCK_TYPES, FLOAT_TYPES, READ_TYPES, TENSOR_TYPES, TYPE_IDS, FormatError, GGUFArray,  # noqa: F401
                   GGUFFile, TensorInfo, format_error, read_gguf)
from .model import Transformer, from_blocks
from .shape import FAMILIES, Shape, family_of, shape_of_config
from .quant import check_block_scales, gguf_blocks, pack, permute_rows, quantize_q8, unrotate_index

_fail = format_error


# --- the config its metadata stands for --------------------------------------------------------------

#: llama.cpp's architecture names -> transformers' model_type. llama.cpp's converter writes Mistral's
#: models (MistralForCausalLM) as 'llama', so FAMILIES' mistral is read through 'llama'.
GGUF_ARCHS = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3"}
#: architectures whose q and k rows llama.cpp's converter permutes (its LlamaModel.permute: rotary pairs
#: adjacent, as its "normal" RoPE computes them). Qwen2 and Qwen3 (TextModel subclasses there, "neox"
#: RoPE) are written in transformers' order, so only these are put back.
PERMUTED_ARCHS = ("llama",)

_REQUIRED = object()


def _meta(gf: GGUFFile, key: str, kind: str, default=_REQUIRED):
    v = gf.metadata.get(key, _REQUIRED)
    if v is _REQUIRED:
        if default is _REQUIRED:
            raise gf.fail(f"no metadata {key!r}, which the native runtime needs")
        return default
    if kind == "str":
        ok = isinstance(v, str)
    elif kind == "int":
        ok = isinstance(v, int) and not isinstance(v, bool) and v > 0
    else:
        ok = isinstance(v, (int, float)) and not isinstance(v, bool) and bool(np.isfinite(v))
    if not ok:
        what = {"str": "a string", "int": "a positive integer", "float": "a finite number"}[kind]
        shown = repr(v) if not isinstance(v, (np.ndarray, GGUFArray)) else f"an array of {len(v)}"
        raise gf.fail(f"metadata {key!r} is {shown[:60]}, not {what}"
                      + (" (per-layer values are not read)" if isinstance(v, (np.ndarray, GGUFArray)) else ""))
    return v


def gguf_config(gf: GGUFFile) -> dict:
    """A transformers-style config dict of a GGUF file's metadata (its ``model_type`` from
    ``general.architecture``); architectures the native runtime does not run refuse."""
    arch = _meta(gf, "general.architecture", "str")
    if arch not in GGUF_ARCHS:
        if arch in FAMILIES:
            raise gf.fail(f"architecture {arch!r}, which llama.cpp does not write (its Mistral models are 'llama'); "
                          f"the native runtime reads {', '.join(GGUF_ARCHS)}")
        try:
            family_of({"model_type": arch})
        except ValueError as e:
            raise gf.fail(f"{e} (GGUF architecture {arch!r})") from None
    model_type = GGUF_ARCHS[arch]
    g = lambda k, kind, d=_REQUIRED: _meta(gf, f"{arch}.{k}", kind, d)  # noqa: E731
    heads = g("attention.head_count", "int")
    dim = g("embedding_length", "int")
    key_len, value_len = g("attention.key_length", "int", None), g("attention.value_length", "int", None)
    rope_dims = g("rope.dimension_count", "int", None)
    head_dim = key_len or rope_dims or dim // heads
    if value_len is not None and value_len != head_dim:
        raise gf.fail(f"keys of {head_dim} and values of {value_len} per head (the native runtime needs them equal)")
    if rope_dims is not None and rope_dims != head_dim:
        raise gf.fail(f"RoPE over {rope_dims} of each head's {head_dim} dimensions (the native runtime rotates "
                      "whole heads)")
    emb = gf.tensors.get("token_embd.weight")
    if emb is None:
        raise gf.fail("missing, so the vocabulary size is unknown", "token_embd.weight")
    if len(emb.dims) != 2:
        raise gf.fail(f"dimensions {list(emb.dims)}, not a matrix", "token_embd.weight")
    cfg = {
        "model_type": model_type,
        "num_hidden_layers": g("block_count", "int"),
        "hidden_size": dim,
        "num_attention_heads": heads,
        "num_key_value_heads": g("attention.head_count_kv", "int", heads),
        "head_dim": head_dim,
        "intermediate_size": g("feed_forward_length", "int"),
        "vocab_size": int(emb.dims[1]),
        "rms_norm_eps": float(g("attention.layer_norm_rms_epsilon", "float")),
        "rope_theta": float(g("rope.freq_base", "float", 10000.0)),
        "max_position_embeddings": g("context_length", "int"),
        "tie_word_embeddings": "output.weight" not in gf.tensors,
        "attention_bias": "blk.0.attn_q.bias" in gf.tensors,
    }
    scaling = g("rope.scaling.type", "str", None)
    factor = g("rope.scaling.factor", "float", None)
    if scaling not in (None, "none") or (factor is not None and factor != 1.0 and scaling is None):
        cfg["rope_scaling"] = {"rope_type": scaling or "linear", "factor": factor}
    for key in ("bos_token_id", "eos_token_id"):
        v = gf.metadata.get(f"tokenizer.ggml.{key}")
        if isinstance(v, int) and not isinstance(v, bool):
            cfg[key] = v
    return cfg


# --- the Transformer its tensors hold --------------------------------------------------------------

#: per layer: GGUF name -> from_blocks' name
MATRICES = {"attn_q": "q_proj", "attn_k": "k_proj", "attn_v": "v_proj", "attn_output": "o_proj",
            "ffn_gate": "gate_proj", "ffn_up": "up_proj", "ffn_down": "down_proj"}
NORMS = {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm"}
BIASES = {"attn_q": "q_bias", "attn_k": "k_bias", "attn_v": "v_bias"}
QK_NORMS = {"attn_q_norm": "q_norm", "attn_k_norm": "k_norm"}
#: tensors a file may hold that change nothing here (rope_freqs.weight only when every factor is 1)
HARMLESS = ("rope_freqs.weight",)


def expected_tensors(shape: Shape, cfg: dict) -> dict[str, tuple[tuple[int, ...], bool]]:
    """Every tensor name a GGUF file of this shape and config must hold, with its dimensions (GGUF
    order, innermost first) and whether it is a matrix."""
    fam = family_of(cfg)
    D, F, V, hd = shape.dim, shape.ffn, shape.vocab, shape.head_dim
    q, kv = shape.n_heads * hd, shape.n_kv * hd
    mats = {"attn_q": (D, q), "attn_k": (D, kv), "attn_v": (D, kv), "attn_output": (q, D),
            "ffn_gate": (D, F), "ffn_up": (D, F), "ffn_down": (F, D)}
    out: dict[str, tuple[tuple[int, ...], bool]] = {"token_embd.weight": ((D, V), True),
                                                     "output_norm.weight": ((D,), False)}
    if not cfg.get("tie_word_embeddings"):
        out["output.weight"] = ((D, V), True)
    for i in range(shape.n_layers):
        for g, dims in mats.items():
            out[f"blk.{i}.{g}.weight"] = (dims, True)
        for g in NORMS:
            out[f"blk.{i}.{g}.weight"] = ((D,), False)
        if fam["qkv_bias"] or cfg.get("attention_bias"):
            for g, n in (("attn_q", q), ("attn_k", kv), ("attn_v", kv)):
                out[f"blk.{i}.{g}.bias"] = ((n,), False)
        if fam["qk_norm"]:
            for g in QK_NORMS:
                out[f"blk.{i}.{g}.weight"] = ((hd,), False)
    return out


def _strip(dims: tuple[int, ...]) -> tuple[int, ...]:
    while len(dims) > 1 and dims[-1] == 1:
        dims = dims[:-1]
    return dims


def _floats(t: TensorInfo) -> np.ndarray:
    """A float tensor's values as float32 (a copy)."""
    kind = t.type_name
    if kind == "F32":
        return t.data.view("<f4").astype(np.float32)
    if kind == "F16":
        return t.data.view("<f2").astype(np.float32)
    return (t.data.view("<u2").astype(np.uint32) << 16).view(np.float32)  # BF16: the high half of a float32


def _nonfinite(t: TensorInfo) -> int:
    """How many of a float tensor's values are NaN or infinite (read in place)."""
    kind = t.type_name
    if kind == "BF16":
        return int(np.count_nonzero((t.data.view("<u2") & 0x7F80) == 0x7F80))
    return int(t.data.size // (4 if kind == "F32" else 2) - np.count_nonzero(np.isfinite(t.data.view(
        "<f4" if kind == "F32" else "<f2"))))


def check_tensors(gf: GGUFFile, shape: Shape, cfg: dict) -> None:
    """Refuse a file whose tensors are not exactly the ones ``shape`` and ``cfg`` imply, each once,
    of its dimensions, of a type the native runtime reads, with finite scales and values (sizes no
    file backs refuse first: :func:`check_sizes`)."""
    check_sizes(shape, len(gf.tensors), gf.path, "its metadata")
    want = expected_tensors(shape, cfg)
    missing = [n for n in want if n not in gf.tensors]
    if missing:
        more = f" ({len(missing) - 1} more tensors are missing)" if len(missing) > 1 else ""
        raise gf.fail(f"missing from the file, which a {cfg['model_type']} model of {shape.n_layers} layers "
                      f"needs{more}", missing[0])
    for name, t in gf.tensors.items():
        if name in want or name in HARMLESS:
            continue
        parts = name.split(".")
        if parts[0] == "blk" and len(parts) > 1 and parts[1].isdigit() and int(parts[1]) >= shape.n_layers:
            raise gf.fail(f"a layer {parts[1]} in a file whose metadata says {shape.n_layers} layers", name)
        raise gf.fail(f"not a tensor a {cfg['model_type']} model of this config has; the native runtime would "
                      "ignore it, so it refuses the file", name)
    for name, (dims, matrix) in want.items():
        t = gf.tensors[name]
        if _strip(t.dims) != dims:
            raise gf.fail(f"dimensions {list(t.dims)}, but the metadata makes it {list(dims)}", name)
        allowed = READ_TYPES if matrix else FLOAT_TYPES
        if t.type_name not in allowed:
            what = "matrices" if matrix else "vectors (norms, biases)"
            raise gf.fail(f"type {t.type_name}, which the native runtime does not read: it reads {what} of type "
                          f"{', '.join(allowed)}", name)
    hd = shape.head_dim
    for name in HARMLESS:
        t = gf.tensors.get(name)
        if t is None:
            continue
        if t.type_name not in FLOAT_TYPES or _strip(t.dims) != (hd // 2,):
            raise gf.fail(f"type {t.type_name} and dimensions {list(t.dims)}, not {hd // 2} float factors", name)
        if not bool(np.all(_floats(t) == 1.0)):
            raise gf.fail("per-frequency RoPE factors other than 1 (a rope scaling the native runtime does not "
                          "compute)", name)
    for name in want:
        t = gf.tensors[name]
        if t.type_name in BLOCK_TYPES:
            try:
                check_block_scales(t.type_name, t.data, int(t.dims[1]), int(t.dims[0]), f"tensor {name!r}")
            except ValueError as e:
                raise gf.fail(str(e)) from None
        else:
            bad = _nonfinite(t)
            if bad:
                raise gf.fail(f"{bad} of its {t.n_elements} values are NaN or infinite", name)


def _matrix(gf: GGUFFile, name: str, n_head: int | None):
    """A matrix tensor packed for the kernels (rows put back in transformers' rotary order over
    ``n_head`` heads where given)."""
    t = gf.tensors[name]
    N, K = int(t.dims[1]), int(t.dims[0])
    idx = unrotate_index(N, n_head) if n_head else None
    if t.type_name in FLOAT_TYPES:
        f = _floats(t).reshape(N, K)
        if idx is not None:
            f = f[idx]
        return quantize_q8(torch.from_numpy(np.ascontiguousarray(f)), name)
    q, d, m, off = gguf_blocks(t.type_name, t.data, N, K, name)
    if idx is not None:
        q, d, m = q[idx], d[idx], permute_rows(m, idx)
    return pack(q, d, m, off, what=name)


def _vector(gf: GGUFFile, name: str, n_head: int | None = None) -> torch.Tensor:
    v = _floats(gf.tensors[name])
    if n_head:
        v = v[unrotate_index(v.shape[0], n_head)]
    return torch.from_numpy(np.ascontiguousarray(v))


def _embedding(gf: GGUFFile):
    """The embedding rows as the kernels read them: float32 [V, D], or Q8_0 blocks (int8 [V, D],
    float32 [V, D/32]); Q4_0 and Q4_1 rows dequantized once (exactly: a float32 holds d q + m)."""
    t = gf.tensors["token_embd.weight"]
    V, D = int(t.dims[1]), int(t.dims[0])
    if t.type_name in FLOAT_TYPES:
        return torch.from_numpy(_floats(t).reshape(V, D))
    q, d, m, off = gguf_blocks(t.type_name, t.data, V, D, "token_embd.weight")
    if m is not None:
        w = (q.astype(np.float32) - off) * np.repeat(d, 32, 1) + np.repeat(m, 32, 1)
        return torch.from_numpy(w)
    return (torch.from_numpy((q.astype(np.int16) - off).astype(np.int8)), torch.from_numpy(d.astype(np.float32)))


#: the most positions a model may claim: the runtime builds its RoPE tables for all of them up front, so
#: a corrupted context length must not ask for terabytes (the longest models it runs claim about 1M)
MAX_POSITIONS = 1 << 20
#: the fewest tensors a layer has (q, k, v, o, gate, up, down and two norms)
LAYER_TENSORS = 9


def check_sizes(shape: Shape, n_tensors: int, path, what: str) -> None:
    """Refuse sizes that no model has, or that a file of ``n_tensors`` tensors cannot back, before
    anything is allocated for them: a size or epsilon below 0, more layers than its tensors make,
    more positions than :data:`MAX_POSITIONS`."""
    sizes = {"layers": shape.n_layers, "width": shape.dim, "heads": shape.n_heads, "key-value heads": shape.n_kv,
             "head size": shape.head_dim, "feed-forward width": shape.ffn, "vocabulary": shape.vocab,
             "context": shape.max_positions}
    bad = [f"{k} {v}" for k, v in sizes.items() if v <= 0]
    if not (np.isfinite(shape.eps) and shape.eps >= 0):
        bad.append(f"epsilon {shape.eps}")
    if not (np.isfinite(shape.rope_theta) and shape.rope_theta > 0):
        bad.append(f"RoPE base {shape.rope_theta}")
    if bad:
        raise _fail(path, f"{what} gives sizes no model has: {', '.join(bad)}")
    if shape.n_layers * LAYER_TENSORS > n_tensors:
        raise _fail(path, f"{what} says {shape.n_layers} layers, but the model holds only {n_tensors} tensors "
                          f"(a layer has at least {LAYER_TENSORS})")
    if shape.max_positions > MAX_POSITIONS:
        raise _fail(path, f"{what} claims a context of {shape.max_positions} positions; the native runtime "
                          f"reads models of up to {MAX_POSITIONS}")


def load_gguf(path: Path | str, threads: int | None = None) -> Transformer:
    """The Transformer a GGUF file holds (llama-architecture q and k rows put back in
    transformers' rotary order), every tensor checked before any is converted."""
    gf = read_gguf(path)
    cfg = gguf_config(gf)
    try:
        shape = shape_of_config(cfg)
        check_sizes(shape, len(gf.tensors), gf.path, "its metadata")
        shape.check()
    except FormatError:
        raise
    except ValueError as e:
        raise gf.fail(str(e)) from None
    check_tensors(gf, shape, cfg)
    permuted = gf.metadata["general.architecture"] in PERMUTED_ARCHS
    tensors: dict = {}
    try:
        for i in range(shape.n_layers):
            for g, key in MATRICES.items():
                n_head = {"attn_q": shape.n_heads, "attn_k": shape.n_kv}.get(g) if permuted else None
                tensors[f"layers.{i}.{key}"] = _matrix(gf, f"blk.{i}.{g}.weight", n_head)
            for g, key in NORMS.items():
                tensors[f"layers.{i}.{key}"] = _vector(gf, f"blk.{i}.{g}.weight")
            for g, key in BIASES.items():
                if f"blk.{i}.{g}.bias" in gf.tensors:  # permuted as their rows are
                    n_head = {"attn_q": shape.n_heads, "attn_k": shape.n_kv}.get(g) if permuted else None
                    tensors[f"layers.{i}.{key}"] = _vector(gf, f"blk.{i}.{g}.bias", n_head)
            for g, key in QK_NORMS.items():
                if f"blk.{i}.{g}.weight" in gf.tensors:
                    tensors[f"layers.{i}.{key}"] = _vector(gf, f"blk.{i}.{g}.weight")
        tensors["norm"] = _vector(gf, "output_norm.weight")
        tensors["embed"] = _embedding(gf)
        tensors["head"] = _matrix(gf, "output.weight" if "output.weight" in gf.tensors else "token_embd.weight", None)
    except FormatError:
        raise
    except ValueError as e:
        raise gf.fail(str(e)) from None
    return from_blocks(shape, tensors, threads)


def float_state(path: Path, keep=None) -> dict:
    """The transformers-named float32 tensors of GGUF file ``path`` whose names pass ``keep``:
    blocks dequantized as ``d * (q - offset) + m`` in float32, the llama architecture's q and k rows
    put back in transformers' rotary order. Bit for bit what transformers' own GGUF conversion
    writes (tests/test_verifier_sources.py), without converting the tensors nobody asked for."""
    gf = read_gguf(path)
    cfg = gguf_config(gf)
    shape = shape_of_config(cfg)
    check_tensors(gf, shape, cfg)
    permuted = gf.metadata["general.architecture"] in PERMUTED_ARCHS
    names = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
             "output.weight": "lm_head.weight"}
    heads = {}
    for i in range(shape.n_layers):
        for g, hf in MATRICES.items():
            part = "self_attn" if g.startswith("attn") else "mlp"
            names[f"blk.{i}.{g}.weight"] = f"model.layers.{i}.{part}.{hf}.weight"
            if g in BIASES:
                names[f"blk.{i}.{g}.bias"] = f"model.layers.{i}.{part}.{hf}.bias"
        for g, hf in NORMS.items():
            names[f"blk.{i}.{g}.weight"] = f"model.layers.{i}.{hf}.weight"
        for g, hf in QK_NORMS.items():
            names[f"blk.{i}.{g}.weight"] = f"model.layers.{i}.self_attn.{hf}.weight"
        if permuted:
            for g, n in (("attn_q", shape.n_heads), ("attn_k", shape.n_kv)):
                heads[f"blk.{i}.{g}.weight"] = heads[f"blk.{i}.{g}.bias"] = n
    out = {}
    for name, t in gf.tensors.items():
        hf = names.get(name)
        if hf is None or (keep is not None and not keep(hf)):
            continue
        dims = tuple(int(x) for x in reversed(t.dims))
        if t.type_name in FLOAT_TYPES:
            w = _floats(t).reshape(dims)
        else:
            N, K = dims
            q, d, m, off = gguf_blocks(t.type_name, t.data, N, K, name)
            w = (q.astype(np.float32) - np.float32(off)) * np.repeat(d.astype(np.float32), 32, 1)
            if m is not None:
                w = w + np.repeat(m.astype(np.float32), 32, 1)
        if name in heads:
            w = w[unrotate_index(w.shape[0], heads[name])]
        out[hf] = torch.from_numpy(np.ascontiguousarray(w, dtype=np.float32))
    return out
