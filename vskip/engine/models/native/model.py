"""The native runtime's transformer: a Llama-family body (Llama, SmolLM, Qwen2) whose whole forward
is one call into the compiled kernels, and the slot cache it reads and writes.

A forward takes rows (a token, its position, its slot and how many of the slot's keys it sees) and
returns the final hidden states and head logits of the rows asked for. Causal decoding gives a row
at position p the keys below p + 1; a drafter's bidirectional block gives every row of the block
the keys up to the block's end. The arithmetic lives in ``kernels.cpp``; this module holds the
weights, the rotary tables and the caches, and checks what it passes.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from . import abi
from .cache import SlotCache
from .shape import FAMILIES, Shape, family_of, shape_of_config, shape_of_hf  # noqa: F401 - read from here too
from .quant import Packed, quantize_q8


@dataclass
class LayerWeights:
    attn_norm: torch.Tensor
    qkv: Packed
    qkv_bias: torch.Tensor | None
    o: Packed
    ffn_norm: torch.Tensor
    gate_up: Packed
    down: Packed
    q_norm: torch.Tensor | None = None
    k_norm: torch.Tensor | None = None


class Transformer:
    """Weights packed for the kernels, and the forward over rows."""

    def __init__(self, shape: Shape, layers: list[LayerWeights], final_norm: torch.Tensor | None,
                 embed: torch.Tensor | tuple[torch.Tensor, torch.Tensor], head: Packed | None, threads: int | None = None):
        shape.check()
        self.shape = shape
        self.layers = layers
        self.final_norm = final_norm
        self.embed = embed  # float32 [V, D], (int8 [V, D], float32 [V, D/32]) blocks, or None
        self.head = head
        self.threads = threads
        #: the kernels' variant this model runs on (None: the one build.chosen_isa() names)
        self.isa: str | None = None
        self.rope_cos, self.rope_sin = rope_tables(shape)
        self._struct = self._make_struct()

    @property
    def variant(self) -> str:
        """The kernels' variant this model runs on (``avx2``, ...)."""
        from .build import chosen_isa

        return self.isa or chosen_isa()

    @property
    def vocab(self) -> int:
        return self.shape.vocab

    @property
    def nbytes(self) -> int:
        """Bytes of weights a full forward reads (embeddings aside: a row reads one of them)."""
        n = sum(p.nbytes for ly in self.layers for p in (ly.qkv, ly.o, ly.gate_up, ly.down))
        return n + (self.head.nbytes if self.head is not None else 0)

    def _make_struct(self) -> abi.Model:
        s = self.shape
        arr = (abi.Layer * len(self.layers))()
        for i, ly in enumerate(self.layers):
            ptr = lambda t: t.data_ptr() if t is not None else None  # noqa: E731
            arr[i] = abi.Layer(ly.attn_norm.data_ptr(), ly.qkv.qmat(), ptr(ly.qkv_bias), ly.o.qmat(),
                               ly.ffn_norm.data_ptr(), ly.gate_up.qmat(), ly.down.qmat(), ptr(ly.q_norm),
                               ptr(ly.k_norm))
        self._layer_array = arr
        self._head_struct = self.head.qmat() if self.head is not None else None
        if self.embed is None:  # every row comes as a float vector (a drafter embeds its own inputs)
            ef, eq, ed = None, None, None
        elif isinstance(self.embed, torch.Tensor):
            ef, eq, ed = self.embed.data_ptr(), None, None
        else:
            ef, eq, ed = None, self.embed[0].data_ptr(), self.embed[1].data_ptr()
        return abi.Model(s.n_layers, s.dim, s.n_heads, s.n_kv, s.head_dim, s.ffn, s.vocab, s.max_positions, s.eps,
                         arr, self.final_norm.data_ptr() if self.final_norm is not None else None, ef, eq, ed,
                         ctypes.pointer(self._head_struct) if self._head_struct is not None else None,
                         self.rope_cos.data_ptr(), self.rope_sin.data_ptr())

    def new_cache(self, slots: int) -> SlotCache:
        return SlotCache(self.shape, slots)

    def forward(self, cache: SlotCache, slots: Sequence[int], tokens: Sequence[int], positions: Sequence[int],
                seen: Sequence[int] | None = None, out_rows: Sequence[int] | None = None, hidden: bool = False,
                logits: bool = True, embeds: torch.Tensor | None = None, taps: Sequence[int] = (),
                tap_out: torch.Tensor | None = None, argmax_out: np.ndarray | None = None):
        """One forward over rows: row r is token ``tokens[r]`` (or, where it is negative, the float
        vector ``embeds[r]``) at ``positions[r]`` of slot ``slots[r]``, seeing that slot's keys
        below ``seen[r]`` (default: its own position + 1, causal); its key and value are written
        at its position. Returns (hidden [n_out, D] or None, logits [n_out, V] or None) of the rows
        ``out_rows`` (default: all). ``taps``: layers whose output every row writes into
        ``tap_out`` [n, len(taps), D] (the last layer's final-normed: transformers' hidden states).
        ``argmax_out``: int32 [n_out], with logits, receives each out row's first id at its
        greatest logit (numpy's argmax), or -1 where a logit is not finite."""
        from .build import library

        lib = library(self.isa)
        n = len(tokens)
        assert n == len(positions) == len(slots) and n > 0, (n, len(positions), len(slots))
        pos = np.asarray(positions, dtype=np.int32)
        kv = pos + 1 if seen is None else np.asarray(seen, dtype=np.int32)
        cache.reserve(slots, int(max(pos.max(), kv.max())) + 1)
        tok = np.asarray(tokens, dtype=np.int64)
        outs = np.arange(n, dtype=np.int32) if out_rows is None else np.asarray(out_rows, dtype=np.int32)
        kp, vp, cap = cache.pointers(slots)
        emb = None
        if embeds is not None:
            emb = embeds.detach().float().contiguous()
            assert emb.shape == (n, self.shape.dim), emb.shape
        h = torch.empty((len(outs), self.shape.dim), dtype=torch.float32) if hidden else None
        z = torch.empty((len(outs), self.shape.vocab), dtype=torch.float32) if logits else None
        threads = self.threads or torch.get_num_threads()
        tl = np.asarray(list(taps), dtype=np.int32)
        if len(tl):
            assert tap_out is not None and tap_out.dtype == torch.float32 and tap_out.is_contiguous() \
                and tuple(tap_out.shape) == (n, len(tl), self.shape.dim), (None if tap_out is None else tap_out.shape)
        if argmax_out is not None:
            assert logits and argmax_out.dtype == np.int32 and argmax_out.shape == (len(outs),) \
                and argmax_out.flags.c_contiguous, (argmax_out.dtype, argmax_out.shape)
        rc = lib.vs_forward(ctypes.byref(self._struct), n, tok.ctypes.data, emb.data_ptr() if emb is not None else None,
                                  pos.ctypes.data, kv.ctypes.data, kp.ctypes.data, vp.ctypes.data, cap.ctypes.data,
                                  len(outs), outs.ctypes.data, h.data_ptr() if h is not None else None,
                                  z.data_ptr() if z is not None else None,
                                  argmax_out.ctypes.data if argmax_out is not None else None, threads, len(tl),
                                  tl.ctypes.data if len(tl) else None, tap_out.data_ptr() if len(tl) else None)
        if rc != 0:
            raise ValueError(f"native forward refused its arguments (code {rc}): a position past the context "
                             f"({self.shape.max_positions}), a token outside the vocabulary, a head it lacks, "
                             "blocks of a format it does not compute, or a layer it lacks to tap")
        return h, z


#: pi/2 in three parts (fdlibm's), each with low bits zero, so that k times a part is exact for k < 2^20
_PIO2 = (1.57079632673412561417e+00, 6.07710050650619224932e-11, 2.02226624879595063154e-21)


def rope_tables(shape: Shape) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin [max_positions, head_dim/2] of position p times theta^(-2i/hd), float32.

    The same bits on every CPU by construction: the frequencies come from Python's ``decimal``
    (integer arithmetic, 50 digits) rounded once to float64, and the angles' cos and sin from
    elementwise IEEE float64 operations only (a reduction by pi/2 in three exact parts and two
    Horner polynomials of degree 19 and 18, within an ulp or two of float64), each rounded once to
    float32. Neither numpy's vectorised cos and sin (another code path on AVX512 hosts) nor the C
    library's (its own per platform) enter."""
    from decimal import Decimal, localcontext

    hd = shape.head_dim
    with localcontext() as ctx:
        ctx.prec = 50
        base = Decimal(float(shape.rope_theta))
        inv = np.array([float(1 / base ** (Decimal(i) / Decimal(hd))) for i in range(0, hd, 2)])
    a = np.arange(shape.max_positions, dtype=np.float64)[:, None] * inv[None]
    k = np.rint(a * (2 / np.pi))
    r = ((a - k * _PIO2[0]) - k * _PIO2[1]) - k * _PIO2[2]  # in [-pi/4, pi/4]
    r2 = r * r
    fact = [float(np.prod(np.arange(1, n + 1, dtype=np.float64))) for n in range(20)]  # exact up to 18!
    ps, pc = np.full_like(r, -1 / fact[19]), np.full_like(r, 1 / fact[18])
    for j in range(8, -1, -1):
        ps = ps * r2 + (-1) ** j / fact[2 * j + 1]
        pc = pc * r2 + (-1) ** j / fact[2 * j]
    sn, cs = ps * r, pc
    q = k.astype(np.int64) % 4
    cos = np.select([q == 0, q == 1, q == 2], [cs, -sn, -cs], sn)
    sin = np.select([q == 0, q == 1, q == 2], [sn, cs, -sn], -cs)
    return (torch.from_numpy(np.ascontiguousarray(cos, dtype=np.float32)),
            torch.from_numpy(np.ascontiguousarray(sin, dtype=np.float32)))


# --- building a Transformer from weights ---------------------------------------------------------

def _cat(packs: list[Packed]) -> Packed:
    """Packed matrices over the same inputs, stacked along their outputs (q|k|v, gate|up)."""
    if len({(p.K, p.offset, p.m is None, p.nibbles) for p in packs}) != 1:  # mixed formats: all as Q8_0
        from .quant import quantize_q8

        return quantize_q8(torch.cat([p.dequantize() for p in packs]))
    return Packed(torch.cat([p.q for p in packs]), torch.cat([p.d for p in packs]),
                  None if packs[0].m is None else torch.cat([p.m for p in packs]),
                  sum(p.N for p in packs), packs[0].K, packs[0].offset, packs[0].nibbles)


def from_blocks(shape: Shape, tensors: dict, threads: int | None = None) -> Transformer:
    """A Transformer from packed matrices and float vectors named as transformers names them
    (``layers.{i}.q_proj`` ... ``norm``, ``embed``, ``head``; ``q_bias`` etc. optional)."""
    layers = []
    for i in range(shape.n_layers):
        t = lambda k: tensors.get(f"layers.{i}.{k}")  # noqa: E731
        biases = [t("q_bias"), t("k_bias"), t("v_bias")]
        bias = None
        if any(b is not None for b in biases):
            sizes = (shape.n_heads * shape.head_dim, shape.n_kv * shape.head_dim, shape.n_kv * shape.head_dim)
            bias = torch.cat([b.float() if b is not None else torch.zeros(n) for b, n in zip(biases, sizes)]).contiguous()
        layers.append(LayerWeights(
            attn_norm=t("input_layernorm").float().contiguous(),
            qkv=_cat([t("q_proj"), t("k_proj"), t("v_proj")]), qkv_bias=bias, o=t("o_proj"),
            ffn_norm=t("post_attention_layernorm").float().contiguous(),
            gate_up=_cat([t("gate_proj"), t("up_proj")]), down=t("down_proj"),
            q_norm=_vector(t("q_norm"), shape.head_dim, f"layer {i} q_norm"),
            k_norm=_vector(t("k_norm"), shape.head_dim, f"layer {i} k_norm")))
    norm = tensors.get("norm")
    return Transformer(shape, layers, norm.float().contiguous() if norm is not None else None, tensors.get("embed"),
                       tensors.get("head"), threads)


def _vector(t: torch.Tensor | None, n: int, what: str) -> torch.Tensor | None:
    if t is None:
        return None
    if tuple(t.shape) != (n,):
        raise ValueError(f"{what}: shape {tuple(t.shape)}, expected ({n},)")
    return t.float().contiguous()


def _layer_tensors(layers, what: str) -> dict:
    """The decoder layers of a Llama/Qwen2-named module list (transformers' or the drafter's
    backbone) as :func:`from_blocks` names them: projections as Q8_0 blocks, biases and norms as they are."""
    tensors = {}
    for i, layer in enumerate(layers):
        a, m = layer.self_attn, layer.mlp
        for name, lin in (("q_proj", a.q_proj), ("k_proj", a.k_proj), ("v_proj", a.v_proj), ("o_proj", a.o_proj),
                          ("gate_proj", m.gate_proj), ("up_proj", m.up_proj), ("down_proj", m.down_proj)):
            tensors[f"layers.{i}.{name}"] = quantize_q8(lin.weight, f"{what} {i} {name}")
            if getattr(lin, "bias", None) is not None and name in ("q_proj", "k_proj", "v_proj"):
                tensors[f"layers.{i}.{name[0]}_bias"] = lin.bias.detach()
        for name in ("q_norm", "k_norm"):
            if getattr(a, name, None) is not None:
                tensors[f"layers.{i}.{name}"] = getattr(a, name).weight.detach()
        tensors[f"layers.{i}.input_layernorm"] = layer.input_layernorm.weight.detach()
        tensors[f"layers.{i}.post_attention_layernorm"] = layer.post_attention_layernorm.weight.detach()
    return tensors


def from_hf_model(model, threads: int | None = None) -> Transformer:
    """A Transformer from a transformers causal LM already in memory (float weights, quantized to
    Q8_0 blocks): the reference that :func:`~.checkpoint_io.load_checkpoint`, the route from files,
    is tested against, and how the tests run tiny models they build without saving them."""
    shape = shape_of_hf(model.config)
    body = model.model
    unbiased = [(f"layer {i} {name}", lin) for i, layer in enumerate(body.layers)
                for name, lin in (("o_proj", layer.self_attn.o_proj), ("gate_proj", layer.mlp.gate_proj),
                                  ("up_proj", layer.mlp.up_proj), ("down_proj", layer.mlp.down_proj))]
    biased = [what for what, lin in unbiased if getattr(lin, "bias", None) is not None]
    if biased:  # only q, k and v carry biases in the kernels (Qwen2's, Llama's attention_bias)
        raise ValueError(f"the native runtime has no bias on {biased[0]}; use --runtime transformers")
    tensors: dict = {"norm": body.norm.weight.detach(), "embed": body.embed_tokens.weight.detach().float().contiguous()}
    tensors |= _layer_tensors(body.layers, "layer")
    tensors["head"] = quantize_q8(model.get_output_embeddings().weight, "output head")
    return from_blocks(shape, tensors, threads)


def from_backbone(backbone, max_positions: int, threads: int | None = None) -> Transformer:
    """A Transformer of a drafter's :class:`~vskip.engine.models.backbone.Backbone` (its layers as
    Q8_0 blocks, no embedding or head of its own: the drafter embeds its inputs and reads hidden states)."""
    c = backbone.config
    shape = Shape(c.num_layers, c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim, c.intermediate_size,
                  c.vocab_size, float(c.rms_norm_eps), float(c.rope_theta), int(max_positions))
    tensors: dict = {"norm": backbone.norm.weight.detach()} | _layer_tensors(backbone.layers, "drafter layer")
    return from_blocks(shape, tensors, threads)
