"""The Dream-style masked-diffusion drafter and its adapter.

A block of ``gamma`` mask tokens follows the committed sequence; over ``steps`` denoising steps the
most confident masked positions are revealed (Dream's schedule: ``int(n_masked * (1 - s/t))`` over
``linspace(1, 1e-3, steps + 1)``, all remaining at the last step). Logits are shifted by one: the
token at block position j is predicted from the hidden state at position j - 1, the first from the
last committed token. The raw confidence of a token is its probability at the step that reveals it
(A.7).

Two attention layouts:

- ``block``: the context is encoded causally once and its keys/values are kept across rounds, so
  each step recomputes only ``[last committed token ; gamma masks]``, attending bidirectionally
  within the block (the embedded drafter is trained this way; drafting cost does not grow with the
  context);
- ``full``: every step re-encodes ``[context ; masks]`` with full bidirectional attention, exactly
  as Dream / DiffuCoder generate.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import torch
from torch import nn

from ..policy import Draw
from .backbone import Backbone, BackboneConfig
from .copy import LENGTH_EDGES, CopyPrior, bucket_index, copy_hint, suffix_match
from .protocols import DRAFT_FEATURES, DraftBlock, common_prefix
from .sampling import sample_draft

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

    def forward(self, ids, positions, past=None, mask=None, hint=None):
        """Hidden states (LM-head input) [B, T, d] and per-layer keys/values."""
        return self.backbone(self.embed(ids, hint), positions, past, mask)


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


OUTSIDE, BANNED = -1, -2


class DiffusionDrafter:
    """Implements the drafter protocol over a :class:`DiffusionLM`.

    ``allowed``: bool [head size], False for head outputs the verifier's vocabulary lacks (these
    are never proposed). ``copy``: a :class:`~vskip.engine.models.copy.CopyPrior` mixed into every reveal
    step (None: the network alone); ``banned``: ids its hints never propose."""

    def __init__(self, model: DiffusionLM, steps: int = 2, allowed: torch.Tensor | None = None, reveal: str | None = None,
                 copy: CopyPrior | None = None, banned: Sequence[int] = ()):
        if steps < 1:
            raise ValueError(f"steps must be >= 1, got {steps}")
        self.model = model.eval()
        self.spec = model.spec
        self.steps = steps
        self.reveal = reveal or model.spec.reveal
        if self.reveal not in REVEAL_ORDERS:
            raise ValueError(f"unknown reveal order {self.reveal!r}; expected {REVEAL_ORDERS}")
        dev = model.backbone.norm.weight.device
        with torch.no_grad():
            self._W = model.head_weight().detach()
            self._ids = model.head_token_ids().to(dev)
        n = self._W.shape[0]
        self._neg = None
        if allowed is not None:
            assert allowed.shape == (n,), (allowed.shape, n)
            self._neg = torch.where(allowed.to(dev), 0.0, float("-inf"))
        self.device = dev
        self.copy = copy
        # for the copy prior's hints: the head column of each vocabulary id, OUTSIDE for ids the
        # head lacks (the mixture gives them an extra column), BANNED for ids never proposed
        # (those the head masks out, and ``banned``, e.g. the verifier's special tokens)
        size = max(int(model.spec.backbone.vocab_size), int(self._ids.max()) + 1, max(banned, default=-1) + 1)
        self._col = torch.full((size,), OUTSIDE, dtype=torch.long, device=dev)
        self._col[self._ids] = torch.arange(n, device=dev)
        if allowed is not None:
            self._col[self._ids[~allowed.to(dev)]] = BANNED
        if banned:
            self._col[torch.tensor(sorted(banned), device=dev)] = BANNED
        self.reset()

    def set_copy_prior(self, prior: CopyPrior | None) -> None:
        """Draft with this copy prior (None: the network alone)."""
        self.copy = prior

    def with_steps(self, steps: int) -> "DiffusionDrafter":
        """A drafter that shares this one's model and copy prior and reveals a block in ``steps``
        steps (this one unchanged)."""
        import copy

        if steps < 1:
            raise ValueError(f"steps must be >= 1, got {steps}")
        other = copy.copy(self)
        other.steps = steps
        other.reset()
        return other

    def reset(self) -> None:
        self._cache = None
        self._cached_ids: list[int] = []

    def match_length(self, seq: Sequence[int]) -> int:
        """The copy hint's match length after ``seq`` (0 when neither a copy prior nor the
        network reads hints)."""
        if self.copy is not None:
            return suffix_match(seq, self.copy.max_len)[0]
        if self.model.hint_proj is not None:
            return suffix_match(seq, HINT_MAX_LEN)[0]
        return 0

    def warmup(self, seq, gamma) -> None:
        self.propose(seq, gamma, features=True)
        self.reset()

    # -- context ---------------------------------------------------------------------------
    def _hidden(self, x: torch.Tensor, start: int, hint: torch.Tensor | None = None) -> torch.Tensor:
        """Final hidden states of query ``x`` [1, T] placed at positions start..start+T-1."""
        pos = torch.arange(start, start + x.shape[1], device=self.device)
        h, _ = self.model(x, pos, self._cache, None, hint)
        return h[0]

    def _hint_input(self, seq: Sequence[int], x: torch.Tensor, P: int, gamma: int):
        """(hint tokens [gamma], hint input [1, P + gamma]) for a network that reads hints, else
        (None, None)."""
        if self.model.hint_proj is None:
            return None, None
        h, length = copy_hint(seq, gamma, HINT_MAX_LEN)
        tokens = torch.from_numpy(h).to(self.device)
        code = torch.full_like(x, -1)
        code[0, P:] = hint_code(tokens, length, self.spec.backbone.vocab_size)
        return tokens, code

    def _block_input(self, seq: Sequence[int], gamma: int) -> tuple[torch.Tensor, int, int, list[int]]:
        """The block query ``[prefix ; gamma masks]`` [1, P + gamma], P, its first position, and
        the context tokens the cache still lacks. Block attention caches ``seq[:-1]`` causally and
        queries from the last token; the missing context is encoded by the first reveal step
        together with the block (:meth:`_first_hidden`). Full attention recomputes everything."""
        seq = list(seq)
        if self.spec.attention == "block":
            ctx = seq[:-1]
            n = common_prefix(self._cached_ids, ctx)
            if self._cache is not None and n < len(self._cached_ids):
                self._cache = [(k[:, :, :n], v[:, :, :n]) for k, v in self._cache] if n > 0 else None
                self._cached_ids = self._cached_ids[:n]
            prefix, start, missing = seq[-1:], len(seq) - 1, ctx[n:]
        else:
            self._cache = None
            prefix, start, missing = seq, 0, []
        P = len(prefix)
        x = torch.full((1, P + gamma), self.model.mask_id, dtype=torch.long, device=self.device)
        x[0, :P] = torch.tensor(prefix, device=self.device)
        return x, P, start, missing

    def _first_hidden(self, x: torch.Tensor, start: int, missing: list[int], hint: torch.Tensor | None = None) -> torch.Tensor:
        """Hidden states of the block query ``x`` [1, T] at the first reveal step. The context
        tokens ``missing`` (positions start - len(missing) .. start - 1) ride in the same forward,
        attending causally, and their keys/values join the cache."""
        if not missing:
            return self._hidden(x, start, hint)
        C, T = len(missing), x.shape[1]
        n = start - C
        q = torch.cat([torch.tensor([missing], device=self.device), x], dim=1)
        mask = torch.ones(C + T, n + C + T, dtype=torch.bool, device=self.device)
        mask[:C, n:] = torch.ones(C, C + T, dtype=torch.bool, device=self.device).tril()
        pos = torch.arange(n, start + T, device=self.device)
        if hint is not None:
            hint = torch.cat([torch.full((1, C), -1, dtype=hint.dtype, device=self.device), hint], dim=1)
        h, present = self.model(q, pos, self._cache, mask, hint)
        self._cache = [(k[:, :, :start], v[:, :, :start]) for k, v in present]
        self._cached_ids = self._cached_ids + list(missing)
        return h[0, C:]

    # -- copy prior --------------------------------------------------------------------------
    def _mix(self, logits, hint, lam, tokens, masked) -> torch.Tensor:
        """Log-probabilities of the copy mixture over the head plus one extra column, which holds
        the hint's mass when the hint is outside the head. A hint is dropped from the first
        position where a revealed token disagrees with it."""
        wrong = (~masked) & (tokens != hint)
        col = self.head_column(hint)
        lam = lam * (torch.cumsum(wrong.long(), 0) - wrong.long() == 0) * (col != BANNED)
        p = torch.softmax(logits, dim=-1) * (1 - lam)[:, None]
        inside = col >= 0
        rows = torch.arange(p.shape[0], device=p.device)
        p[rows[inside], col[inside]] += lam[inside]
        extra = torch.where(inside, torch.zeros_like(lam), lam)
        return torch.cat([p, extra[:, None]], dim=-1).log()

    def _token(self, cols, idx, hint) -> torch.Tensor:
        """Token ids of chosen head columns; the extra column of :meth:`_mix` is the hint."""
        n = self._ids.shape[0]
        if hint is None:
            return self._ids[cols]
        return torch.where(cols == n, hint[idx], self._ids[cols.clamp(max=n - 1)])

    @torch.inference_mode()
    def first_step(self, seq: Sequence[int], gamma: int) -> torch.Tensor:
        """The network's distribution over its head [gamma, head size] for a fully masked block
        after ``seq`` (the first reveal step, no copy prior): what the copy prior is fitted on."""
        x, P, start, missing = self._block_input(seq, gamma)
        _, code = self._hint_input(seq, x, P, gamma)
        logits = (self._first_hidden(x, start, missing, code)[P - 1 : P - 1 + gamma] @ self._W.T).float()
        if self._neg is not None:
            logits = logits + self._neg
        return torch.softmax(logits, dim=-1)

    def head_column(self, ids: torch.Tensor) -> torch.Tensor:
        """Head column of each id (negative: outside the head or never proposed)."""
        ids = torch.as_tensor(ids, device=self.device)
        ok = (ids >= 0) & (ids < self._col.shape[0])
        return torch.where(ok, self._col[ids.clamp(0, self._col.shape[0] - 1)], BANNED)

    # -- proposal --------------------------------------------------------------------------
    @torch.inference_mode()
    def propose(self, seq: Sequence[int], gamma: int, features: bool = False, draw: Draw | None = None) -> DraftBlock:
        assert len(seq) >= 1 and gamma >= 1, (len(seq), gamma)
        if draw is not None and self.steps != 1:
            raise ValueError(f"a sampled draft (--speculative-sampling) needs a drafter that drafts its block in one "
                             f"forward (--steps 1), not in {self.steps} reveal steps")
        x, P, start, missing = self._block_input(seq, gamma)
        q_block = None

        masked = torch.ones(gamma, dtype=torch.bool, device=self.device)
        tokens = torch.zeros(gamma, dtype=torch.long, device=self.device)
        conf = torch.zeros(gamma, dtype=torch.float32, device=self.device)
        feats = torch.zeros(gamma, len(DRAFT_FEATURES), dtype=torch.float32, device=self.device) if features else None
        hidden = torch.zeros(gamma, self._W.shape[1], dtype=self._W.dtype, device=self.device) if features else None
        order = 0
        p1_0 = ne_0 = None
        hint = lam = None
        if self.copy is not None:
            h, w = self.copy.hint(seq, gamma)
            if w.any():
                hint = torch.from_numpy(h).to(self.device)
                lam = torch.from_numpy(w).to(device=self.device, dtype=torch.float32)
        hint_in, code = self._hint_input(seq, x, P, gamma)
        full_code = None if code is None else code.clone()
        for s, n in enumerate(reveal_counts(gamma, self.steps)):
            if s > 0 and code is not None:  # hints hold up to the first revealed token that breaks them
                wrong = (~masked) & (tokens != hint_in)
                keep = torch.cumsum(wrong.long(), 0) - wrong.long() == 0
                code[0, P:] = torch.where(keep, full_code[0, P:], -1)
            h = self._first_hidden(x, start, missing, code) if s == 0 else self._hidden(x, start, code)
            h = h[P - 1 : P - 1 + gamma]  # shifted: hidden j-1 predicts j
            logits = (h @ self._W.T).float()
            if self._neg is not None:
                logits = logits + self._neg
            if hint is None:
                logp = torch.log_softmax(logits, dim=-1)
            else:
                logp = self._mix(logits, hint, lam, tokens, masked)
            # the token and its score come from the same top-2 whether or not features are asked
            # for: torch breaks a three-way tie differently for another k, and a bfloat16 head ties
            top = logp.topk(2, dim=-1)
            top5 = logp.topk(5, dim=-1) if features else None
            p_top = top.values.exp()
            p1 = p_top[:, 0]
            need_entropy = features or self.reveal == "entropy"
            ent = -(logp.exp() * logp.nan_to_num(neginf=0.0)).sum(-1) if need_entropy else None
            if self.reveal == "maskgit_plus":
                score = p1
            elif self.reveal == "topk_margin":
                score = p1 - p_top[:, 1]
            else:
                score = -ent
            if features and s == 0:
                p1_0, ne_0 = p1.clone(), -ent
            if n == 0:
                continue
            idx = score.masked_fill(~masked, float("-inf")).topk(n).indices
            chosen = self._token(top.indices[idx, 0], idx, hint)
            if draw is not None:  # the only step: every position, sampled instead of its argmax
                sampled, q_block = self._sample(logp, hint, draw)
                chosen = sampled[idx]
            tokens[idx] = chosen
            conf[idx] = p1[idx]
            masked[idx] = False
            x[0, P + idx] = chosen
            if features:
                rank = (order + torch.arange(n, device=self.device)) / max(gamma - 1, 1)
                feats[idx] = reveal_features(s, rank, n / gamma, p1[idx], top.values[idx, 0], ent[idx],
                                              p_top[idx, 1], top5.values[idx], p1_0[idx], ne_0[idx])
                hidden[idx] = h[idx]
            order += n
        assert not bool(masked.any()), "every position is revealed by the last step"
        return DraftBlock(
            tokens=tokens.cpu().numpy(),
            confidence=conf.cpu().numpy(),
            features=None if feats is None else feats.cpu().numpy(),
            hidden=hidden,
            q=q_block,
        )

    def _sample(self, logp: torch.Tensor, hint: torch.Tensor | None, draw: Draw) -> tuple[torch.Tensor, np.ndarray]:
        """Tokens sampled from the block's distributions (the copy mixture's extra column given to
        its hint's id) and those distributions over the vocabulary, warped (:func:`sample_draft`)."""
        n = self._ids.shape[0]
        full = torch.full((logp.shape[0], self._col.shape[0]), float("-inf"), dtype=torch.float64, device=logp.device)
        full[:, self._ids] = logp[:, :n].double()
        if hint is not None:
            rows = torch.nonzero(hint >= 0)[:, 0]
            full[rows, hint[rows]] = torch.logaddexp(full[rows, hint[rows]], logp[rows, n].double())
        tokens, q = sample_draft(full, draw)
        return torch.from_numpy(tokens).to(self.device), q


def reveal_features(step: int, rank: torch.Tensor, share: float, p1, logp1, ent, p2, logp_top5, p1_0, ne_0):
    """The :data:`DRAFT_FEATURES` row of the positions one reveal step unmasks, in that order."""
    f = torch.empty(len(rank), len(DRAFT_FEATURES), dtype=torch.float32, device=rank.device)
    f[:, 0] = step
    f[:, 1] = rank
    f[:, 2] = share
    f[:, 3] = float(step > 0)
    f[:, 4] = p1
    f[:, 5] = logp1
    f[:, 6] = ent
    f[:, 7] = -ent
    f[:, 8] = p1 - p2
    f[:, 9] = logp_top5.exp().sum(-1)
    f[:, 10] = p1_0
    f[:, 11] = ne_0
    f[:, 12] = p1 - p1_0
    f[:, 13] = -ent - ne_0
    return f
