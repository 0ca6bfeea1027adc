"""The Dream-style masked-diffusion language model the standalone drafter runs: its spec, the
network (backbone, mask embedding, restricted head, copy-hint input) and Dream's reveal schedule.
The adapter that drafts with it is :mod:`vskip.engine.models.drafter`; training
(:mod:`vskip.distill.train`) and loading (:mod:`vskip.engine.models.drafter_io`) use this module alone.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from .backbone import Backbone, BackboneConfig
from .copy import LENGTH_EDGES, bucket_index

REVEAL_ORDERS = ("maskgit_plus", "topk_margin", "entropy")
ATTENTION = ("block", "full")
SPEC_FILE = "drafter.json"
WEIGHTS_FILE = "drafter.safetensors"
#: Input id standing for the learned mask embedding when the vocabulary has no mask token.
LEARNED_MASK = -1
#: longest suffix match the hint input looks for
HINT_MAX_LEN = 32


@dataclass(frozen=True)
class DrafterSpec:
    """What a drafter is: its backbone, mask token, output head and attention layout.

    mask_token_id: the vocabulary's mask id, or None for a learned mask embedding;
    head: ``tied`` (embedding matrix) or ``lm_head``; a ``head_ids`` tensor in the weights restricts
    the output head to those token ids; base: where tensors missing from the drafter's own weights
    come from (``embedded-verifier`` or None); base_layers: which of the base's decoder layers the
    drafter's layers start from, in order (None: the first ``num_layers``).
    """

    backbone: BackboneConfig
    mask_token_id: int | None = None
    head: str = "tied"
    attention: str = "block"
    reveal: str = "maskgit_plus"
    base: str | None = None
    meta: dict = field(default_factory=dict)
    base_layers: tuple[int, ...] | None = None
    #: the copy hint (:func:`~vskip.engine.models.copy.copy_hint`) enters the network: every masked
    #: position with a hint adds a learned projection of the hinted token's embedding and a
    #: learned vector for the match length's bucket to its input
    copy_input: bool = False

    def __post_init__(self):
        if self.base_layers is not None:
            object.__setattr__(self, "base_layers", tuple(int(i) for i in self.base_layers))
            if len(self.base_layers) != self.backbone.num_layers:
                raise ValueError(f"base_layers names {len(self.base_layers)} layers for a {self.backbone.num_layers}-layer drafter")
        if self.head not in ("tied", "lm_head"):
            raise ValueError(f"unknown drafter head {self.head!r}")
        if self.attention not in ATTENTION:
            raise ValueError(f"unknown attention layout {self.attention!r}; expected {ATTENTION}")
        if self.reveal not in REVEAL_ORDERS:
            raise ValueError(f"unknown reveal order {self.reveal!r}; expected {REVEAL_ORDERS}")

    def to_json(self) -> dict:
        return {
            "format": "vskip-drafter/1",
            "backbone": self.backbone.to_json(),
            "mask_token_id": self.mask_token_id,
            "head": self.head,
            "attention": self.attention,
            "reveal": self.reveal,
            "base": self.base,
            "base_layers": list(self.base_layers) if self.base_layers is not None else None,
            "copy_input": self.copy_input,
            "meta": self.meta,
        }

    @classmethod
    def from_json(cls, d: dict) -> "DrafterSpec":
        if d.get("format") != "vskip-drafter/1":
            raise ValueError(f"not a vskip drafter spec (format {d.get('format')!r})")
        return cls(
            backbone=BackboneConfig.from_json(d["backbone"]),
            mask_token_id=d.get("mask_token_id"),
            head=d.get("head", "tied"),
            attention=d.get("attention", "block"),
            reveal=d.get("reveal", "maskgit_plus"),
            base=d.get("base"),
            meta=d.get("meta", {}),
            base_layers=d.get("base_layers"),
            copy_input=bool(d.get("copy_input", False)),
        )


class DiffusionLM(nn.Module):
    """Backbone + mask embedding + (possibly restricted) output head."""

    def __init__(self, spec: DrafterSpec, head_ids: torch.Tensor | None = None):
        super().__init__()
        c = spec.backbone
        self.spec = spec
        self.backbone = Backbone(c)
        self.mask_embedding = nn.Parameter(torch.zeros(c.hidden_size)) if spec.mask_token_id is None else None
        self.lm_head = nn.Linear(c.hidden_size, c.vocab_size, bias=False) if spec.head == "lm_head" else None
        if head_ids is not None:
            head_ids = head_ids.long()
        self.register_buffer("head_ids", head_ids, persistent=True)
        self.hint_proj = self.hint_length = None
        if spec.copy_input:  # zero at the start: an untrained hint input changes nothing
            self.hint_proj = nn.Linear(c.hidden_size, c.hidden_size, bias=False)
            nn.init.zeros_(self.hint_proj.weight)
            self.hint_length = nn.Parameter(torch.zeros(len(LENGTH_EDGES), c.hidden_size))

    @property
    def mask_id(self) -> int:
        return LEARNED_MASK if self.spec.mask_token_id is None else int(self.spec.mask_token_id)

    def embed(self, ids: torch.Tensor, hint: torch.Tensor | None = None) -> torch.Tensor:
        """Input embeddings of ``ids``; ``hint`` (same shape, or None) holds per position the
        hinted token id and its match-length bucket as ``bucket * vocab + id``, or -1 for none
        (see :func:`hint_code`); only masked positions read it."""
        e = self.backbone.embed_tokens(ids.clamp(min=0))
        masked = ids == self.mask_id
        if self.mask_embedding is not None:
            e = torch.where(masked[..., None], self.mask_embedding.to(e.dtype), e)
        if hint is not None and self.hint_proj is not None:
            V = self.spec.backbone.vocab_size
            on = masked & (hint >= 0)
            tok, bucket = hint.clamp(min=0) % V, hint.clamp(min=0) // V
            add = self.hint_proj(self.backbone.embed_tokens(tok).to(self.hint_proj.weight.dtype))
            add = add + self.hint_length[bucket]
            e = e + torch.where(on[..., None], add.to(e.dtype), torch.zeros((), dtype=e.dtype, device=e.device))
        return e

    def head_weight(self) -> torch.Tensor:
        w = self.lm_head.weight if self.lm_head is not None else self.backbone.embed_tokens.weight
        return w if self.head_ids is None else w[self.head_ids]

    def head_token_ids(self) -> torch.Tensor:
        """Token id of each head output."""
        if self.head_ids is not None:
            return self.head_ids
        return torch.arange(self.head_weight().shape[0], device=self.backbone.norm.weight.device)

    def forward(self, ids, positions, past=None, mask=None, hint=None, pack=None):
        """Hidden states (LM-head input) [B, T, d] and per-layer keys/values; ``pack``: the rows
        laid end to end ([1, N], :meth:`~vskip.engine.models.backbone.Backbone.forward`)."""
        return self.backbone(self.embed(ids, hint), positions, past, mask, pack)


def hint_code(hint, length: int, vocab_size: int):
    """The per-position hint input of :meth:`DiffusionLM.embed` for hint tokens ``hint`` (numpy
    or torch, -1 for none) behind a match of ``length`` (0: no hint anywhere)."""
    if length <= 0:
        return hint * 0 - 1
    bucket = int(bucket_index(length, LENGTH_EDGES))
    return (hint >= 0) * (hint + bucket * vocab_size + 1) - 1


def reveal_counts(gamma: int, steps: int, eps: float = 1e-3) -> list[int]:
    """Tokens revealed at each step, computed in float32 as Dream does (gamma 16, 2 steps: 7, 9)."""
    ts = torch.linspace(1.0, eps, steps + 1, dtype=torch.float32)
    left, counts = gamma, []
    for i in range(steps):
        if i < steps - 1:
            n = int(torch.tensor(float(left), dtype=torch.float32) * (1 - ts[i + 1] / ts[i]))
        else:
            n = left
        counts.append(n)
        left -= n
    return counts
