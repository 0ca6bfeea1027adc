"""The conditioned drafter: a block-diffusion drafter that reads the verifier's hidden states
(the DFlash design).

A few decoder layers at the verifier's width draft a whole block in one forward. Their context is
not tokens but the verifier's own hidden states: the outputs of the tapped verifier layers at
every position the verifier has run over are concatenated, fused by one projection (``fc``) and
normalised (``hidden_norm``), and every draft layer projects that fused context with its own
key/value projections and attends to it, beside the block. The query block is

    [ unverified tail ; mask x (block_size - 1) ]

where the tail is the committed tokens that have no verifier features yet: always the last
committed token (the correction or bonus token, as in DFlash), and under verifier skipping also
the tokens a skip committed since the verifier last ran. Attention is bidirectional within the
block and over the whole context; the token at a mask position is read from that position's own
hidden state (no shift). The verifier's embedding and output head are shared and frozen.

:class:`HiddenTap` carries the features from the verifier adapter to the drafter: the verifier
writes the tapped states of the positions it runs over (a shadow call leaves nothing behind), and
the drafter reads those of the longest prefix of the committed sequence it holds, so a rejection
crops them as the verifier's cache is cropped. The drafter never runs the verifier: it declares
``reads_verifier``, and the decode loop has the verifier prefill each prompt before its first block.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from ..policy import Sampling  # the settings' data type only
from .backbone import MLP, BackboneConfig, RMSNorm, rope_tables, rotate_half
from .protocols import DraftBlock, common_prefix
from .tap import HiddenTap  # noqa: F401 - the drafter reads the verifier through it
from .sampling import to_vocabulary, warped_probs

SPEC_FORMAT = "vskip-conditioned-drafter/1"
#: input id standing for the learned mask embedding when the vocabulary has no mask token
LEARNED_MASK = -1


def default_target_layers(num_target_layers: int, count: int) -> tuple[int, ...]:
    """``count`` verifier layers spread from layer 1 to ``num_target_layers - 3``, as DFlash
    chooses them by default (one layer: the middle one)."""
    if count == 1:
        return (num_target_layers // 2,)
    start, end = 1, num_target_layers - 3
    return tuple(int(round(start + i * (end - start) / (count - 1))) for i in range(count))


@dataclass(frozen=True)
class ConditionedSpec:
    """What a conditioned drafter is.

    backbone: the draft layers (``num_layers`` of them) at the verifier's width and vocabulary;
    head_dim: per-head width (None: hidden / heads); target_layers: the verifier layers tapped
    (layer i is the output of decoder layer i); block_size: the query block's length, so a draft
    is at most ``block_size - 1`` tokens; mask_token_id: the vocabulary's mask id, or None for a
    learned mask embedding; qk_norm: per-head RMSNorm of queries and keys (Qwen3); max_tail: the
    longest unverified tail (beyond the last token) it was trained on (0: none, as DFlash's
    published drafters; a longer tail still enters the block as it is); source: ``vskip`` or
    ``dflash`` (a published checkpoint)."""

    backbone: BackboneConfig
    target_layers: tuple[int, ...]
    block_size: int = 16
    mask_token_id: int | None = None
    qk_norm: bool = True
    head_dim: int | None = None
    max_tail: int = 64
    source: str = "vskip"
    meta: dict = field(default_factory=dict)

    def __post_init__(self):
        object.__setattr__(self, "target_layers", tuple(int(i) for i in self.target_layers))
        if not self.target_layers or len(set(self.target_layers)) != len(self.target_layers) or min(self.target_layers) < 0:
            raise ValueError(f"target layers must be distinct indices >= 0, got {list(self.target_layers)}")
        if self.block_size < 2:
            raise ValueError(f"block_size must be >= 2 (the last token and at least one mask), got {self.block_size}")

    @property
    def hd(self) -> int:
        return int(self.head_dim or self.backbone.hidden_size // self.backbone.num_heads)

    @property
    def max_gamma(self) -> int:
        return self.block_size - 1

    def to_json(self) -> dict:
        return {"format": SPEC_FORMAT, "backbone": self.backbone.to_json(), "target_layers": list(self.target_layers),
                "block_size": self.block_size, "mask_token_id": self.mask_token_id, "qk_norm": self.qk_norm,
                "head_dim": self.head_dim, "max_tail": self.max_tail, "source": self.source, "meta": self.meta}

    @classmethod
    def from_json(cls, d: dict) -> "ConditionedSpec":
        if d.get("format") != SPEC_FORMAT:
            raise ValueError(f"not a conditioned drafter spec (format {d.get('format')!r})")
        return cls(backbone=BackboneConfig.from_json(d["backbone"]), target_layers=tuple(d["target_layers"]),
                   block_size=int(d["block_size"]), mask_token_id=d.get("mask_token_id"),
                   qk_norm=bool(d.get("qk_norm", True)), head_dim=d.get("head_dim"),
                   max_tail=int(d.get("max_tail", 64)), source=d.get("source", "vskip"), meta=d.get("meta", {}))


class ContextAttention(nn.Module):
    """Queries from the block; keys and values from the fused context and the block, through the
    same projections (and per-head norms); RoPE at each position's absolute place."""

    def __init__(self, c: BackboneConfig, hd: int, qk_norm: bool):
        super().__init__()
        self.h, self.kvh, self.hd = c.num_heads, c.num_kv_heads, hd
        self.q_proj = nn.Linear(c.hidden_size, c.num_heads * hd, bias=c.attention_bias)
        self.k_proj = nn.Linear(c.hidden_size, c.num_kv_heads * hd, bias=c.attention_bias)
        self.v_proj = nn.Linear(c.hidden_size, c.num_kv_heads * hd, bias=c.attention_bias)
        self.o_proj = nn.Linear(c.num_heads * hd, c.hidden_size, bias=False)
        self.q_norm = RMSNorm(hd, c.rms_norm_eps) if qk_norm else None
        self.k_norm = RMSNorm(hd, c.rms_norm_eps) if qk_norm else None

    def kv(self, x, cos, sin):
        """Keys (normed, rotated) and values [B, kvh, T, hd] of inputs ``x`` [B, T, d]."""
        B, T, _ = x.shape
        k = self.k_proj(x).view(B, T, self.kvh, self.hd)
        if self.k_norm is not None:
            k = self.k_norm(k)
        k = k.transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.kvh, self.hd).transpose(1, 2)
        return k * cos + rotate_half(k) * sin, v

    def forward(self, x, cos, sin, ctx, mask):
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.h, self.hd)
        if self.q_norm is not None:
            q = self.q_norm(q)
        q = q.transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k, v = self.kv(x, cos, sin)
        if ctx is not None:
            k, v = torch.cat([ctx[0], k], dim=2), torch.cat([ctx[1], v], dim=2)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=self.kvh != self.h)  # heads shared in place
        return self.o_proj(out.transpose(1, 2).reshape(B, T, self.h * self.hd))


class ConditionedLayer(nn.Module):
    def __init__(self, c: BackboneConfig, hd: int, qk_norm: bool):
        super().__init__()
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.self_attn = ContextAttention(c, hd, qk_norm)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.mlp = MLP(c)

    def forward(self, x, cos, sin, ctx, mask):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, ctx, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class ConditionedLM(nn.Module):
    """Fusion, draft layers, final norm; the verifier's embedding (and head) are buffers that
    :meth:`attach` sets and that are never saved. ``head_ids`` (saved) restricts the head."""

    def __init__(self, spec: ConditionedSpec, head_ids: torch.Tensor | None = None):
        super().__init__()
        c, k = spec.backbone, len(spec.target_layers)
        self.spec = spec
        self.fc = nn.Linear(k * c.hidden_size, c.hidden_size, bias=False)
        self.hidden_norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.layers = nn.ModuleList([ConditionedLayer(c, spec.hd, spec.qk_norm) for _ in range(c.num_layers)])
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.mask_embedding = nn.Parameter(torch.zeros(c.hidden_size)) if spec.mask_token_id is None else None
        self.register_buffer("head_ids", None if head_ids is None else head_ids.long(), persistent=True)
        self.register_buffer("embed_weight", None, persistent=False)
        self.register_buffer("head_weight_full", None, persistent=False)

    def attach(self, embedding: torch.Tensor, head: torch.Tensor | None = None) -> "ConditionedLM":
        """Share the verifier's input embedding [V, d] and output head [V, d] (tied: the same)."""
        V, d = self.spec.backbone.vocab_size, self.spec.backbone.hidden_size
        if embedding.shape[1] != d or (head is not None and head.shape[1] != d):
            raise ValueError(f"the verifier's width {embedding.shape[1]} does not match the drafter's {d}")
        if embedding.shape[0] < V:
            raise ValueError(f"the verifier's vocabulary ({embedding.shape[0]}) is smaller than the drafter's ({V})")
        self.embed_weight = embedding.detach()
        self.head_weight_full = (embedding if head is None else head).detach()
        return self

    @property
    def mask_id(self) -> int:
        return LEARNED_MASK if self.spec.mask_token_id is None else int(self.spec.mask_token_id)

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        e = F.embedding(ids.clamp(min=0), self.embed_weight).to(self.fc.weight.dtype)
        if self.mask_embedding is not None:
            e = torch.where((ids == LEARNED_MASK)[..., None], self.mask_embedding.to(e.dtype), e)
        return e

    def head_weight(self) -> torch.Tensor:
        w = self.head_weight_full
        return w if self.head_ids is None else w[self.head_ids]

    def head_token_ids(self) -> torch.Tensor:
        if self.head_ids is not None:
            return self.head_ids
        return torch.arange(self.head_weight_full.shape[0], device=self.fc.weight.device)

    def _rope(self, positions):
        return rope_tables(positions, self.spec.hd, self.spec.backbone.rope_theta, self.fc.weight.dtype)

    def context(self, features: torch.Tensor, positions: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per draft layer, the keys and values [B, kvh, C, hd] of the context whose tapped
        verifier features are ``features`` [B, C, k*d] at ``positions`` [C] or [B, C]."""
        ctx = self.hidden_norm(self.fc(features.to(self.fc.weight.dtype)))
        cos, sin = self._rope(positions)
        return [layer.self_attn.kv(ctx, cos, sin) for layer in self.layers]

    def forward(self, ids, positions, ctx=None, mask=None) -> torch.Tensor:
        """Final hidden states [B, T, d] of query ``ids`` [B, T] at ``positions``, attending to
        the context keys/values ``ctx`` (:meth:`context`) and to each other; ``mask`` [B, 1, T,
        C + T] (True: may attend) or None (all attend all)."""
        x = self.embed(ids)
        cos, sin = self._rope(positions)
        for i, layer in enumerate(self.layers):
            x = layer(x, cos, sin, None if ctx is None else ctx[i], mask)
        return self.norm(x)


def _block_features(logp: torch.Tensor, gamma: int) -> torch.Tensor:
    """The :data:`DRAFT_FEATURES` rows of a one-step block (every token revealed at step 0)."""
    from .drafter import reveal_features

    top = logp.topk(5, dim=-1)
    p1 = top.values[:, 0].exp()
    ent = -(logp.exp() * logp.nan_to_num(neginf=0.0)).sum(-1)
    rank = torch.arange(gamma, device=logp.device) / max(gamma - 1, 1)
    return reveal_features(0, rank, 1.0, p1, top.values[:, 0], ent, top.values[:, 1].exp(), top.values, p1, -ent)


class ConditionedDrafter:
    """The drafter protocol over a :class:`ConditionedLM` fed by a :class:`HiddenTap`: one
    forward per block, the context's keys/values kept across rounds and cropped with the
    committed sequence. ``allowed``: bool [head size], False for outputs never proposed."""

    #: one forward drafts the whole block
    steps = 1
    #: its context is the verifier's hidden states (the loop has the verifier prefill each prompt)
    reads_verifier = True

    def __init__(self, model: ConditionedLM, tap: HiddenTap, allowed: torch.Tensor | None = None):
        if tuple(tap.layers) != model.spec.target_layers:
            raise ValueError(f"the verifier taps layers {list(tap.layers)}, the drafter reads {list(model.spec.target_layers)}")
        self.model = model.eval()
        self.spec = model.spec
        self.tap = tap
        self.device = model.fc.weight.device
        with torch.no_grad():
            self._W = model.head_weight().detach()
            self._ids = model.head_token_ids().to(self.device)
        self._neg = None
        if allowed is not None:
            self._neg = torch.where(allowed.to(self.device), 0.0, float("-inf"))
        self.copy = None
        self.reset()

    def reset(self, slot: int | None = None) -> None:
        """Forget a slot's cached context (a new prompt follows there), or every slot's (None)."""
        if slot is None:
            self._ctx: dict[int, list] = {}  # slot -> the context's keys/values per layer
            self._ctx_ids: dict[int, list[int]] = {}
        else:
            self._ctx.pop(slot, None)
            self._ctx_ids.pop(slot, None)

    def prefill(self, ids, slot: int = 0) -> None:
        """Nothing: this drafter's context is the verifier's states, which the loop has the verifier
        compute over the whole prompt when the sequence joins."""

    def propose_many(self, requests, features: bool = False, sampling: Sampling | None = None) -> list[DraftBlock]:
        """One block per (slot, seq, gamma), each slot from its own tapped states and context."""
        return [self.propose(seq, g, features, sampling, slot) for slot, seq, g in requests]

    def with_steps(self, steps: int) -> "ConditionedDrafter":
        if steps != 1:
            raise ValueError(f"the conditioned drafter drafts a block in one forward; it has no {steps}-step mode")
        return self

    def match_length(self, seq: Sequence[int]) -> int:
        """No copy hint: a block length never grows on a match."""
        return 0

    def warmup(self, seq, gamma) -> None:
        self.propose(seq, gamma, features=True)
        self.reset()

    @property
    def max_gamma(self) -> int:
        return self.spec.max_gamma

    def tail(self, seq: Sequence[int], slot: int = 0) -> int:
        """Committed tokens the next block's tail holds beyond the last one (no verifier features)."""
        return len(seq) - 1 - min(self.tap.covered(seq, slot), len(seq) - 1)

    def _sync(self, seq: list[int], slot: int) -> int:
        """Bring a slot's cached context up to the tapped prefix of ``seq``; returns its length m."""
        m = min(self.tap.covered(seq, slot), len(seq) - 1)
        ctx, ids = self._ctx.get(slot), self._ctx_ids.get(slot, [])
        n = common_prefix(ids, seq[:m])
        if ctx is not None and n < len(ids):
            ctx = [(k[:, :, :n], v[:, :, :n]) for k, v in ctx] if n > 0 else None
            ids = ids[:n]
        if m > n:
            feats = self.tap.features_of(slot)[n:m].to(self.device)[None]
            new = self.model.context(feats, torch.arange(n, m, device=self.device))
            ctx = new if ctx is None else [
                (torch.cat([k0, k1], 2), torch.cat([v0, v1], 2)) for (k0, v0), (k1, v1) in zip(ctx, new)]
            ids = ids + list(seq[n:m])
        self._ctx[slot], self._ctx_ids[slot] = ctx, ids
        return m

    @torch.inference_mode()
    def propose(self, seq: Sequence[int], gamma: int, features: bool = False, sampling: Sampling | None = None,
                slot: int = 0) -> DraftBlock:
        seq = [int(t) for t in seq]
        assert len(seq) >= 1 and gamma >= 1, (len(seq), gamma)
        if gamma > self.spec.max_gamma:
            raise ValueError(f"gamma {gamma} exceeds what this drafter drafts per block ({self.spec.max_gamma}: "
                             f"block size {self.spec.block_size})")
        m = self._sync(seq, slot)
        nm = self.spec.block_size - 1
        q = torch.tensor([seq[m:] + [self.model.mask_id] * nm], device=self.device)
        pos = torch.arange(m, len(seq) + nm, device=self.device)
        h = self.model(q, pos, self._ctx[slot])[0, -nm:][:gamma]
        logits = (h @ self._W.T).float()
        if self._neg is not None:
            logits = logits + self._neg
        logp = torch.log_softmax(logits, dim=-1)
        top = logp.max(dim=-1)
        q = None
        if sampling is not None:  # one forward drafts the block: each position's q depends on the context alone
            q = warped_probs(to_vocabulary(logp, self._ids, int(self._ids.max()) + 1), sampling).cpu().numpy()
        return DraftBlock(
            tokens=self._ids[top.indices].cpu().numpy(),
            confidence=top.values.exp().cpu().numpy(),
            features=_block_features(logp, gamma).cpu().numpy() if features else None,
            hidden=h if features else None,
            q=q,
        )
