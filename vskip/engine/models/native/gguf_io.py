"""Reading a Llama-architecture GGUF file into the native runtime's blocks, as the file holds them
(Q4_1 and Q8_0 blocks unchanged; F32/F16 matrices quantized to Q8_0)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from .model import Shape, Transformer, from_blocks
from .quant import gguf_blocks, pack, permute_rows, quantize_q8, unrotate_index

HF_NAMES = {"attn_q": "q_proj", "attn_k": "k_proj", "attn_v": "v_proj", "attn_output": "o_proj",
            "ffn_gate": "gate_proj", "ffn_up": "up_proj", "ffn_down": "down_proj",
            "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm"}


def _field(reader, key, default=None):
    f = reader.fields.get(key)
    if f is None:
        return default
    v = f.parts[f.data[0]]
    return v.tobytes().decode() if v.dtype == np.uint8 else v.item()


def shape_of_gguf(reader) -> Shape:
    arch = _field(reader, "general.architecture")
    if arch != "llama":
        raise ValueError(f"the native runtime reads Llama-architecture GGUF files, not {arch!r}")
    g = lambda k, d=None: _field(reader, f"llama.{k}", d)  # noqa: E731
    heads = int(g("attention.head_count"))
    dim = int(g("embedding_length"))
    emb = next(t for t in reader.tensors if t.name == "token_embd.weight")
    return Shape(int(g("block_count")), dim, heads, int(g("attention.head_count_kv", heads)),
                 int(g("rope.dimension_count", dim // heads)), int(g("feed_forward_length")), int(emb.shape[1]),
                 float(g("attention.layer_norm_rms_epsilon")), float(g("rope.freq_base", 10000.0)),
                 int(g("context_length")))


def _matrix(t):
    N, K = int(t.shape[1]), int(t.shape[0])
    kind = t.tensor_type.name
    if kind in ("F32", "F16"):
        return None, torch.from_numpy(np.asarray(t.data, dtype=np.float32).reshape(N, K).copy())
    return gguf_blocks(kind, np.asarray(t.data), N, K), None


def load_gguf(path: Path | str, threads: int | None = None) -> Transformer:
    """The Transformer a GGUF file holds (q and k rows put back in transformers' rotary order)."""
    import gguf

    reader = gguf.GGUFReader(str(path))
    shape = shape_of_gguf(reader)
    tensors: dict = {}
    for t in reader.tensors:
        name = t.name
        if name == "token_embd.weight" or name == "output.weight":
            blocks, f = _matrix(t)
            if name == "token_embd.weight":
                if f is not None:
                    tensors["embed"] = f
                else:
                    q, d, m, off = blocks
                    if m is not None:  # a Q4_1 embedding: dequantize rows once
                        w = (q.astype(np.float32) - off) * np.repeat(d, 32, 1) + np.repeat(m, 32, 1)
                        tensors["embed"] = torch.from_numpy(w)
                    else:
                        tensors["embed"] = (torch.from_numpy((q.astype(np.int16) - off).astype(np.int8)),
                                            torch.from_numpy(d.astype(np.float32)))
            key = "head" if name == "output.weight" else "tied"
            tensors[key] = quantize_q8(f, name) if f is not None else pack(*blocks, what=name)
            continue
        if name == "output_norm.weight":
            tensors["norm"] = torch.from_numpy(np.asarray(t.data, dtype=np.float32).copy())
            continue
        parts = name.split(".")
        if parts[0] != "blk" or parts[2] not in HF_NAMES:
            continue
        key = f"layers.{parts[1]}.{HF_NAMES[parts[2]]}"
        if parts[2].endswith("norm"):
            tensors[key] = torch.from_numpy(np.asarray(t.data, dtype=np.float32).copy())
            continue
        blocks, f = _matrix(t)
        if parts[2] in ("attn_q", "attn_k"):
            n_head = shape.n_heads if parts[2] == "attn_q" else shape.n_kv
            idx = unrotate_index(f.shape[0] if f is not None else blocks[0].shape[0], n_head)
            if f is not None:
                f = f[idx]
            else:
                blocks = (blocks[0][idx], blocks[1][idx], permute_rows(blocks[2], idx), blocks[3])
        tensors[key] = quantize_q8(f, key) if f is not None else pack(*blocks, what=key)
    tensors.setdefault("head", tensors.pop("tied", None))
    tensors.pop("tied", None)
    return from_blocks(shape, tensors, threads)
