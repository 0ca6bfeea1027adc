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

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Sequence

import torch
from torch import nn

from .copy import LENGTH_EDGES, CopyPrior, _bucket, copy_hint, suffix_match
from .backbone import Backbone, BackboneConfig, read_hf_config, read_safetensors_dir
from .protocols import DRAFT_FEATURES, DraftBlock, common_prefix

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
    #: the copy hint (:func:`~vskip.models.copy.copy_hint`) enters the network: every masked
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
    bucket = int(_bucket(length, LENGTH_EDGES))
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
    are never proposed). ``copy``: a :class:`~vskip.models.copy.CopyPrior` mixed into every reveal
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
    def propose(self, seq: Sequence[int], gamma: int, features: bool = False) -> DraftBlock:
        assert len(seq) >= 1 and gamma >= 1, (len(seq), gamma)
        x, P, start, missing = self._block_input(seq, gamma)

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
            top = logp.topk(5 if features else 2, dim=-1)
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
            tokens[idx] = chosen
            conf[idx] = p1[idx]
            masked[idx] = False
            x[0, P + idx] = chosen
            if features:
                f = feats[idx]
                f[:, 0] = s
                f[:, 1] = (order + torch.arange(n, device=self.device)) / max(gamma - 1, 1)
                f[:, 2] = n / gamma
                f[:, 3] = float(s > 0)
                f[:, 4] = p1[idx]
                f[:, 5] = top.values[idx, 0]
                f[:, 6] = ent[idx]
                f[:, 7] = -ent[idx]
                f[:, 8] = p1[idx] - p_top[idx, 1]
                f[:, 9] = p_top[idx].sum(-1)
                f[:, 10] = p1_0[idx]
                f[:, 11] = ne_0[idx]
                f[:, 12] = p1[idx] - p1_0[idx]
                f[:, 13] = -ent[idx] - ne_0[idx]
                feats[idx] = f
                hidden[idx] = h[idx]
            order += n
        assert not bool(masked.any()), "every position is revealed by the last step"
        return DraftBlock(
            tokens=tokens.cpu().numpy(),
            confidence=conf.cpu().numpy(),
            features=None if feats is None else feats.cpu().numpy(),
            hidden=hidden,
        )


# -- building and loading ------------------------------------------------------------------------


def _strip(prefix: str, sd: dict) -> dict:
    return {k[len(prefix):]: v for k, v in sd.items() if k.startswith(prefix)}


def backbone_state_from_hf(path: Path, num_layers: int, layers: Sequence[int] | None = None,
                           device: str = "cpu") -> dict[str, torch.Tensor]:
    """Embedding, decoder layers and the final norm of a Llama/Qwen2/Dream checkpoint directory,
    renamed to :class:`Backbone` names. The layers are the first ``num_layers``, or ``layers`` (the
    checkpoint's layer ``layers[i]`` becomes layer ``i``)."""
    src = {int(j): i for i, j in enumerate(layers)} if layers is not None else {j: j for j in range(num_layers)}

    def keep(k: str) -> bool:
        if not k.startswith("model."):
            return k == "lm_head.weight"
        parts = k.split(".")
        return parts[1] != "layers" or int(parts[2]) in src

    sd = read_safetensors_dir(path, keep, device=device)
    out = {}
    for k, v in _strip("model.", sd).items():
        parts = k.split(".")
        if parts[0] == "layers":
            parts[1] = str(src[int(parts[1])])
        out[".".join(parts)] = v
    if "lm_head.weight" in sd:
        out["lm_head.weight"] = sd["lm_head.weight"]
    return out


def drafter_from_verifier(verifier_dir: Path, num_layers: int = 6, head_ids: torch.Tensor | None = None,
                          layers: Sequence[int] | None = None, copy_input: bool = False) -> DiffusionLM:
    """A drafter on the verifier's own layout: its embedding, first ``num_layers`` layers (or the
    verifier layers ``layers``, in order), final norm and tied head, a learned mask embedding
    (initialised to the mean token embedding), block attention. Untrained: the starting point of
    self-distillation."""
    cfg = read_hf_config(verifier_dir)
    if layers is not None:
        layers = tuple(int(i) for i in layers)
        total = int(cfg["num_hidden_layers"])
        if not layers or len(set(layers)) != len(layers) or not all(0 <= i < total for i in layers):
            raise ValueError(f"layers must be distinct indices in 0..{total - 1}, got {list(layers)}")
        num_layers = len(layers)
        if layers == tuple(range(num_layers)):
            layers = None
    bb = BackboneConfig.from_hf(cfg, num_layers=num_layers)
    spec = DrafterSpec(backbone=bb, mask_token_id=None, head="tied", attention="block", base="embedded-verifier",
                       base_layers=layers, copy_input=copy_input)
    model = DiffusionLM(spec, head_ids)
    sd = backbone_state_from_hf(verifier_dir, num_layers, layers)
    sd.pop("lm_head.weight", None)
    missing, unexpected = model.backbone.load_state_dict(sd, strict=False)
    assert not unexpected and not missing, (missing, unexpected)
    with torch.no_grad():
        model.mask_embedding.copy_(model.backbone.embed_tokens.weight.mean(0))
    return model


def save_drafter(model: DiffusionLM, out_dir: Path, base_dir: Path | None = None, dtype=torch.float16, meta=None) -> Path:
    """Write ``drafter.json`` and ``drafter.safetensors``. With ``base_dir``, tensors equal to the
    base checkpoint's are left out (only what differs from the verifier ships)."""
    from safetensors.torch import save_file

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    spec = model.spec if meta is None else replace(model.spec, meta={**model.spec.meta, **meta})
    sd = {k: v.detach().cpu() for k, v in model.state_dict().items() if v is not None}
    if base_dir is not None:
        base = backbone_state_from_hf(base_dir, spec.backbone.num_layers, spec.base_layers)
        for k, v in list(sd.items()):
            name = k[len("backbone."):] if k.startswith("backbone.") else None
            if name in base and base[name].shape == v.shape and torch.equal(base[name].to(v.dtype), v):
                del sd[k]
    sd = {k: (v.to(dtype) if v.is_floating_point() else v).contiguous() for k, v in sd.items()}
    save_file(sd, str(out_dir / WEIGHTS_FILE))
    (out_dir / SPEC_FILE).write_text(json.dumps(spec.to_json(), indent=1))
    return out_dir


def is_dream_checkpoint(path: Path) -> bool:
    p = Path(path) / "config.json"
    if not p.exists():
        return False
    cfg = json.loads(p.read_text())
    arch = " ".join(cfg.get("architectures") or [])
    return cfg.get("model_type", "").lower() == "dream" or "Dream" in arch


def load_drafter_model(path: Path, base_dir: Path | None = None, dtype=torch.float32, device="cpu") -> DiffusionLM:
    """Load a vskip drafter directory (``drafter.json``) or a Dream/DiffuCoder checkpoint directory
    (``config.json`` of model type Dream, safetensors weights) without executing code from it."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"drafter path {path} does not exist")
    if (path / SPEC_FILE).exists():
        spec = DrafterSpec.from_json(json.loads((path / SPEC_FILE).read_text()))
        from safetensors.torch import load_file

        own = load_file(str(path / WEIGHTS_FILE)) if (path / WEIGHTS_FILE).exists() else {}
        model = DiffusionLM(spec, own.get("head_ids"))
        sd = {}
        if spec.base is not None:
            if base_dir is None:
                raise ValueError(f"drafter {path} is stored as a difference to {spec.base!r}; its base is needed")
            base = backbone_state_from_hf(base_dir, spec.backbone.num_layers, spec.base_layers)
            sd |= {"backbone." + k: v for k, v in base.items() if k != "lm_head.weight"}
            if spec.head == "lm_head" and "lm_head.weight" in base:
                sd["lm_head.weight"] = base["lm_head.weight"]
        sd |= own
        missing, unexpected = model.load_state_dict(sd, strict=False)
        missing = [m for m in missing if m != "head_ids"]
        if missing or unexpected:
            raise ValueError(f"drafter {path}: missing tensors {missing[:5]}, unexpected {unexpected[:5]}")
    elif is_dream_checkpoint(path):
        cfg = read_hf_config(path)
        mask_id = cfg.get("mask_token_id")
        if mask_id is None:
            gen = path / "generation_config.json"
            mask_id = json.loads(gen.read_text()).get("mask_token_id") if gen.exists() else None
        if mask_id is None:
            raise ValueError(f"{path}: a Dream checkpoint must name its mask_token_id")
        bb = BackboneConfig.from_hf(cfg)
        tied = bool(cfg.get("tie_word_embeddings", False))
        spec = DrafterSpec(
            backbone=bb, mask_token_id=int(mask_id), head="tied" if tied else "lm_head", attention="full",
            reveal="entropy", meta={"source": "dream"},
        )
        # built on the meta device and filled from safetensors in the dtype and on the device it
        # runs in: a 7B drafter never exists in float32, nor twice in memory
        with torch.device("meta"):
            model = DiffusionLM(spec)
        sd = backbone_state_from_hf(path, bb.num_layers, device=str(device))
        state = {("lm_head.weight" if k == "lm_head.weight" else "backbone." + k): v.to(dtype) for k, v in sd.items()}
        if tied:
            state.pop("lm_head.weight", None)
        missing, unexpected = model.load_state_dict(state, strict=False, assign=True)
        missing = [m for m in missing if m != "head_ids"]
        if missing or unexpected:
            raise ValueError(f"{path}: missing tensors {missing[:5]}, unexpected {unexpected[:5]}")
    else:
        raise ValueError(f"{path} is neither a vskip drafter ({SPEC_FILE}) nor a Dream checkpoint")
    return model.to(device=device, dtype=dtype).eval()
