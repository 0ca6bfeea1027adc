"""The drafter adapter over the Dream-style masked-diffusion LM (:mod:`vskip.engine.models.diffusion_lm`).

A block of ``gamma`` mask tokens follows the committed sequence; over ``steps`` denoising steps the
most confident masked positions are revealed (Dream's schedule: ``int(n_masked * (1 - s/t))`` over
``linspace(1, 1e-3, steps + 1)``, all remaining at the last step). Logits are shifted by one: the
token at block position j is predicted from the hidden state at position j - 1, the first from the
last committed token. The raw confidence of a token is its probability at the step that reveals it
(A.7).

The network's forward is a *body*'s (:mod:`vskip.engine.models.drafter_body`: torch, block or full
attention; :class:`~vskip.engine.models.native.drafter.NativeBody`: the native runtime), which also
keeps each slot's context cache; this class is the reveal alone, the same over either.
"""

from __future__ import annotations

from typing import Sequence

import torch

from ..policy import Sampling  # the settings' data type only
from .copy import CopyPrior, copy_hint, suffix_match
from .diffusion_lm import HINT_MAX_LEN, REVEAL_ORDERS, DiffusionLM, hint_code, reveal_counts
from .drafter_body import TorchBody
from .protocols import DRAFT_FEATURES, DraftBlock
from .sampling import to_vocabulary, warped_probs

OUTSIDE, BANNED = -1, -2


class DiffusionDrafter:
    """Implements the drafter protocol over a :class:`DiffusionLM`.

    ``allowed``: bool [head size], False for head outputs the verifier's vocabulary lacks (these
    are never proposed). ``copy``: a :class:`~vskip.engine.models.copy.CopyPrior` mixed into every reveal
    step (None: the network alone); ``banned``: ids its hints never propose; ``body``: what computes
    the network's hidden states (default: its torch forward, :class:`TorchBody`)."""

    def __init__(self, model: DiffusionLM, steps: int = 2, allowed: torch.Tensor | None = None, reveal: str | None = None,
                 copy: CopyPrior | None = None, banned: Sequence[int] = (), body=None):
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
        self.body = body if body is not None else TorchBody(model)

    #: no limit of its own on the block length
    max_gamma = None
    #: drafts from its own context cache, not the verifier's hidden states
    reads_verifier = False

    @property
    def pack(self) -> bool:
        """Rows of different query lengths drafting together go packed, without padding (False:
        padded, to compare; the torch body's choice)."""
        return getattr(self.body, "pack", True)

    @pack.setter
    def pack(self, on: bool) -> None:
        self.body.pack = bool(on)

    def set_copy_prior(self, prior: CopyPrior | None) -> None:
        """Draft with this copy prior (None: the network alone)."""
        self.copy = prior

    def with_steps(self, steps: int) -> "DiffusionDrafter":
        """A drafter that shares this one's model and copy prior, reveals a block in ``steps``
        steps and keeps caches of its own (this one unchanged)."""
        import copy

        if steps < 1:
            raise ValueError(f"steps must be >= 1, got {steps}")
        other = copy.copy(self)
        other.steps = steps
        other.body = self.body.fresh()
        return other

    def reset(self, slot: int | None = None) -> None:
        """Forget a slot's cached context (a new prompt follows there), or every slot's (None)."""
        self.body.reset(slot)

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
    @torch.inference_mode()
    def prefill(self, ids: Sequence[int], slot: int = 0) -> None:
        """Encode context ``ids`` causally into ``slot``'s cache (block attention; a full-attention
        drafter recomputes its context at every block and caches none)."""
        self.body.prefill(slot, ids)

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
        x, P, start, missing = self.block_query(seq, gamma)
        _, code = self._hint_input(seq, x, P, gamma)
        row = _Row(x, P, start, missing, None, None, None, code, None, None, gamma, False, None, None)
        h = self.body.hidden([row], [0], first=True)[0].to(self._W.dtype)
        logits = (h[P - 1 : P - 1 + gamma] @ self._W.T).float()
        if self._neg is not None:
            logits = logits + self._neg
        return torch.softmax(logits, dim=-1)

    def block_query(self, seq: Sequence[int], gamma: int, slot: int = 0) -> tuple[torch.Tensor, int, int, list[int]]:
        """The block query ``[prefix ; gamma masks]`` [1, P + gamma] after ``seq``, P, its first
        position and the context ``slot``'s cache lacks (the body cuts the cache to what serves:
        block attention queries from the last token, full attention from the first)."""
        assert len(seq) >= 1 and gamma >= 1, (len(seq), gamma)
        start, missing = self.body.begin(slot, seq)
        prefix = [int(t) for t in seq[start:]]
        P = len(prefix)
        x = torch.full((1, P + gamma), self.model.mask_id, dtype=torch.long, device=self.device)
        x[0, :P] = torch.tensor(prefix, device=self.device)
        return x, P, start, missing

    def head_column(self, ids: torch.Tensor) -> torch.Tensor:
        """Head column of each id (negative: outside the head or never proposed)."""
        ids = torch.as_tensor(ids, device=self.device)
        ok = (ids >= 0) & (ids < self._col.shape[0])
        return torch.where(ok, self._col[ids.clamp(0, self._col.shape[0] - 1)], BANNED)

    # -- proposal --------------------------------------------------------------------------
    @torch.inference_mode()
    def propose(self, seq: Sequence[int], gamma: int, features: bool = False, sampling: Sampling | None = None,
                slot: int = 0) -> DraftBlock:
        """Reveal a block of ``gamma`` masks after ``seq`` (the sequence held in ``slot``)."""
        return self.propose_many([(slot, seq, gamma)], features, sampling)[0]

    @torch.inference_mode()
    def propose_many(self, requests: Sequence[tuple[int, Sequence[int], int]], features: bool = False,
                     sampling: Sampling | None = None) -> list[DraftBlock]:
        """Draft a block for each (slot, seq, gamma) of ``requests``, in ``steps`` reveal steps:
        each step scores the masked positions and reveals the most confident ones, every row of a
        group (:meth:`TorchBody.groups`) in one forward of the body."""
        rows = [self.start_block(seq, g, features, sampling, slot) for slot, seq, g in requests]
        slots = [slot for slot, _, _ in requests]
        for group in self.body.groups(rows):
            these, their = [rows[i] for i in group], [slots[i] for i in group]
            for s in range(self.steps):
                for row in these:
                    self.step_input(row, s)
                for row, h in zip(these, self.body.hidden(these, their, first=s == 0)):
                    self.step_output(row, s, h)
        return [row.finish() for row in rows]

    # the steps of one block
    def start_block(self, seq: Sequence[int], gamma: int, features: bool, sampling: Sampling | None,
                    slot: int = 0) -> "_Row":
        """A block about to be revealed after ``seq`` in ``slot``: its query, the context the
        slot's cache lacks, its hints and its empty reveal state."""
        if sampling is not None and self.steps != 1:
            raise ValueError(f"a sampled draft (--speculative-sampling) needs a drafter that drafts its block in one "
                             f"forward (--steps 1), not in {self.steps} reveal steps")
        x, P, start, missing = self.block_query(seq, gamma, slot)
        hint, lam = self._copy_prior_hint(seq, gamma)
        hint_in, code = self._hint_input(seq, x, P, gamma)
        b = _Reveal.empty(gamma, self._W.shape[1], self._W.dtype, self.device, features)
        return _Row(x, P, start, missing, hint, lam, hint_in, code, None if code is None else code.clone(), b,
                    gamma, features, sampling, reveal_counts(gamma, self.steps))

    def step_input(self, row: "_Row", s: int) -> None:
        """Before step ``s``: hints hold up to the first revealed token that breaks them."""
        if s > 0 and row.code is not None:
            b = row.reveal
            wrong = (~b.masked) & (b.tokens != row.hint_in)
            keep = torch.cumsum(wrong.long(), 0) - wrong.long() == 0
            row.code[0, row.P:] = torch.where(keep, row.full_code[0, row.P:], -1)

    def step_output(self, row: "_Row", s: int, h: torch.Tensor) -> None:
        """After step ``s``, from the hidden states ``h`` of the row's query [P + gamma, d]: score
        every position and reveal the most confident masked ones."""
        P, gamma, b = row.P, row.gamma, row.reveal
        h = h[P - 1 : P - 1 + gamma].to(self._W.dtype)  # shifted: hidden j-1 predicts j
        logp = self._log_probs(h, row.hint, row.lam, b)
        sc = self._step_scores(logp, row.features)
        if row.features and s == 0:
            b.p1_0, b.ne_0 = sc.p1.clone(), -sc.ent
        n = row.counts[s]
        if n == 0:
            return
        idx = sc.score.masked_fill(~b.masked, float("-inf")).topk(n).indices
        chosen = self._token(sc.top.indices[idx, 0], idx, row.hint)
        if row.sampling is not None:  # the only step: the loop draws every position from q
            row.q = self._distributions(logp, row.hint, row.sampling)
        self._reveal(b, row.x, P, idx, chosen, s, n, sc, h, gamma)

    def _copy_prior_hint(self, seq: Sequence[int], gamma: int):
        """(hint tokens [gamma], mixture weights [gamma]) of the copy prior, or (None, None)."""
        if self.copy is None:
            return None, None
        h, w = self.copy.hint(seq, gamma)
        if not w.any():
            return None, None
        return torch.from_numpy(h).to(self.device), torch.from_numpy(w).to(device=self.device, dtype=torch.float32)

    def _log_probs(self, h: torch.Tensor, hint, lam, b: "_Reveal") -> torch.Tensor:
        """Log-probabilities over the head (and the copy mixture's extra column) of each position."""
        logits = (h @ self._W.T).float()
        if self._neg is not None:
            logits = logits + self._neg
        if hint is None:
            return torch.log_softmax(logits, dim=-1)
        return self._mix(logits, hint, lam, b.tokens, b.masked)

    def _step_scores(self, logp: torch.Tensor, features: bool) -> "_Scores":
        """The token, its probability and the reveal score of every position at one step."""
        # the token and its score come from the same top-2 whether or not features are asked
        # for: torch breaks a three-way tie differently for another k, and a bfloat16 head ties
        top = logp.topk(2, dim=-1)
        p_top = top.values.exp()
        p1 = p_top[:, 0]
        ent = -(logp.exp() * logp.nan_to_num(neginf=0.0)).sum(-1) if features or self.reveal == "entropy" else None
        if self.reveal == "maskgit_plus":
            score = p1
        elif self.reveal == "topk_margin":
            score = p1 - p_top[:, 1]
        else:
            score = -ent
        return _Scores(top, logp.topk(5, dim=-1) if features else None, p_top, p1, ent, score)

    def _reveal(self, b: "_Reveal", x, P: int, idx, chosen, step: int, n: int, sc: "_Scores", h, gamma: int) -> None:
        """Unmask positions ``idx`` with tokens ``chosen``, recording their confidence and features."""
        b.tokens[idx] = chosen
        b.conf[idx] = sc.p1[idx]
        b.masked[idx] = False
        x[0, P + idx] = chosen
        if b.feats is not None:
            rank = (b.order + torch.arange(n, device=self.device)) / max(gamma - 1, 1)
            b.feats[idx] = reveal_features(step, rank, n / gamma, sc.p1[idx], sc.top.values[idx, 0], sc.ent[idx],
                                           sc.p_top[idx, 1], sc.top5.values[idx], b.p1_0[idx], b.ne_0[idx])
            b.hidden[idx] = h[idx]
        b.order += n

    def _distributions(self, logp: torch.Tensor, hint: torch.Tensor | None, sampling: Sampling):
        """The block's distributions over the vocabulary (the copy mixture's extra column given to
        its hint's id), warped by ``sampling`` [gamma, V] (float64 numpy)."""
        n = self._ids.shape[0]
        full = to_vocabulary(logp, self._ids, self._col.shape[0])
        if hint is not None:
            rows = torch.nonzero(hint >= 0)[:, 0]
            full[rows, hint[rows]] = torch.logaddexp(full[rows, hint[rows]], logp[rows, n].double())
        return warped_probs(full, sampling).cpu().numpy()


class _Row:
    """One block in the making: its query ``x`` [1, P + gamma] at ``start``, the context it brings
    along (``missing``), its hints and hint input (``code``), and its reveal state."""

    def __init__(self, x, P, start, missing, hint, lam, hint_in, code, full_code, reveal, gamma, features, sampling,
                 counts):
        self.x, self.P, self.start, self.missing = x, P, start, missing
        self.hint, self.lam, self.hint_in, self.code, self.full_code = hint, lam, hint_in, code, full_code
        self.reveal, self.gamma, self.features, self.sampling, self.counts = reveal, gamma, features, sampling, counts
        self.q = None

    def finish(self) -> DraftBlock:
        assert not bool(self.reveal.masked.any()), "every position is revealed by the last step"
        return self.reveal.block(self.q)


class _Scores:
    """One reveal step's view of every position: top-2 (and top-5), probabilities, entropy, score."""

    def __init__(self, top, top5, p_top, p1, ent, score):
        self.top, self.top5, self.p_top, self.p1, self.ent, self.score = top, top5, p_top, p1, ent, score


class _Reveal:
    """A block being revealed: its tokens, confidences, mask, and (when asked) features and hidden rows."""

    @classmethod
    def empty(cls, gamma: int, width: int, dtype, device, features: bool) -> "_Reveal":
        b = cls()
        b.masked = torch.ones(gamma, dtype=torch.bool, device=device)
        b.tokens = torch.zeros(gamma, dtype=torch.long, device=device)
        b.conf = torch.zeros(gamma, dtype=torch.float32, device=device)
        b.feats = torch.zeros(gamma, len(DRAFT_FEATURES), dtype=torch.float32, device=device) if features else None
        b.hidden = torch.zeros(gamma, width, dtype=dtype, device=device) if features else None
        b.order, b.p1_0, b.ne_0 = 0, None, None
        return b

    def block(self, q) -> DraftBlock:
        return DraftBlock(tokens=self.tokens.cpu().numpy(), confidence=self.conf.cpu().numpy(),
                          features=None if self.feats is None else self.feats.cpu().numpy(), hidden=self.hidden, q=q)


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
