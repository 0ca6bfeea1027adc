"""The drafter's network on torch: the hidden states of block queries, and each slot's context cache.

A :class:`~vskip.engine.models.drafter.DiffusionDrafter` reveals a block; a *body* computes the
hidden states it reads. This one runs the :class:`~vskip.engine.models.diffusion_lm.DiffusionLM`'s
torch forward (any device, any dtype: the float reference, and training's); the native runtime's
body is :class:`~vskip.engine.models.native.drafter.NativeBody`. Both answer the same four calls:
``begin`` (where a slot's block starts and the context its cache lacks), ``prefill``, ``hidden``
(every row of one reveal step in one forward) and ``reset``.

Two attention layouts:

- ``block``: the context is encoded causally once and its keys/values are kept across rounds, so
  each step recomputes only ``[last committed token ; gamma masks]``, attending bidirectionally
  within the block; the context the cache lacks rides in the first step's forward, attending
  causally, and joins the cache;
- ``full``: every step re-encodes ``[context ; masks]`` with full bidirectional attention, exactly
  as Dream / DiffuCoder generate; nothing is cached.

Several rows go in one forward: their caches stacked, padded to the longest, their queries packed
end to end where their lengths differ (the projections and MLPs run over the real positions only,
attention in the padded layout), under one mask that gives every row exactly the attention of its
own forward.
"""

from __future__ import annotations

from typing import Sequence

import torch

from .protocols import common_prefix
from .ragged import padding_groups


class TorchBody:
    """The torch forward of a :class:`DiffusionLM` and each slot's (cache, ids)."""

    #: rows of different query lengths go packed, without padding (False: padded, to compare)
    pack = True

    def __init__(self, lm):
        self.lm = lm
        self.attention = lm.spec.attention
        self.device = lm.backbone.norm.weight.device
        self.reset()

    def fresh(self) -> "TorchBody":
        """A body over the same network with empty caches."""
        other = TorchBody(self.lm)
        other.pack = self.pack
        return other

    def reset(self, slot: int | None = None) -> None:
        if slot is None:
            self._slots: dict[int, tuple] = {}
        else:
            self._slots.pop(slot, None)

    def begin(self, slot: int, seq: Sequence[int]) -> tuple[int, list[int]]:
        """Where ``slot``'s block query starts (its tokens are ``seq[start:]``, then the masks) and
        the context its cache lacks; the cache is cut to what still serves."""
        if self.attention != "block":
            return 0, []
        cache, ids = self._slots.get(slot, (None, []))
        ctx = [int(t) for t in seq[:-1]]
        n = common_prefix(ids, ctx)
        if cache is not None and n < len(ids):
            cache = [(k[:, :, :n], v[:, :, :n]) for k, v in cache] if n > 0 else None
            self._slots[slot] = (cache, ids[:n])
        return len(seq) - 1, ctx[n:]

    def groups(self, rows) -> list[list[int]]:
        """Rows drafted in one forward each group: a row whose context the cache lacks much more
        of than the others' (a prompt joining the batch) goes alone."""
        return padding_groups([len(r.missing) + r.x.shape[1] for r in rows])

    def prefill(self, slot: int, ids: Sequence[int]) -> None:
        """Encode context ``ids`` causally into ``slot``'s cache (what it already holds of them is kept)."""
        if self.attention != "block":
            return
        ctx = [int(t) for t in ids]
        start, missing = self.begin(slot, ctx + [0])
        if not missing:
            return
        cache, held = self._slots.get(slot, (None, []))
        n, C = start - len(missing), len(missing)
        mask = torch.ones(C, n + C, dtype=torch.bool, device=self.device)
        mask[:, n:] = mask[:, n:].tril()
        pos = torch.arange(n, start, device=self.device)
        _, present = self.lm(torch.tensor([missing], device=self.device), pos, cache, mask)
        self._slots[slot] = (present, held + missing)

    def hidden(self, rows, slots: Sequence[int], first: bool) -> list[torch.Tensor]:
        """Hidden states [P + gamma, d] of each row's query, all rows in one forward; at the first
        step the context a row's slot lacks rides along and joins its cache."""
        if len(rows) == 1:
            r, slot = rows[0], slots[0]
            return [self._one(r, slot, first)]
        return self._many(rows, slots, first)

    def _one(self, r, slot: int, first: bool) -> torch.Tensor:
        cache, held = self._slots.get(slot, (None, []))
        missing = list(r.missing) if first else []
        if not missing:
            pos = torch.arange(r.start, r.start + r.x.shape[1], device=self.device)
            h, _ = self.lm(r.x, pos, cache, None, r.code)
            return h[0]
        C, T = len(missing), r.x.shape[1]
        n = r.start - C
        q = torch.cat([torch.tensor([missing], device=self.device), r.x], dim=1)
        mask = torch.ones(C + T, n + C + T, dtype=torch.bool, device=self.device)
        mask[:C, n:] = torch.ones(C, C + T, dtype=torch.bool, device=self.device).tril()
        pos = torch.arange(n, r.start + T, device=self.device)
        code = r.code
        if code is not None:
            code = torch.cat([torch.full((1, C), -1, dtype=code.dtype, device=self.device), code], dim=1)
        h, present = self.lm(q, pos, cache, mask, code)
        if self.attention == "block":
            self._slots[slot] = ([(k[:, :, : r.start], v[:, :, : r.start]) for k, v in present], held + missing)
        return h[0, C:]

    def _many(self, rows, slots, first: bool) -> list[torch.Tensor]:
        dev = self.device
        caches = [self._slots.get(slot, (None, []))[0] for slot in slots]
        past_len = [0 if c is None else c[0][0].shape[2] for c in caches]
        lead = [len(r.missing) if first else 0 for r in rows]  # context tokens riding along
        length = [c + r.x.shape[1] for c, r in zip(lead, rows)]
        B, T, P = len(rows), max(length), max(past_len)
        ids = torch.full((B, T), self.lm.mask_id, dtype=torch.long, device=dev)
        pos = torch.zeros((B, T), dtype=torch.long, device=dev)
        code = None if rows[0].code is None else torch.full((B, T), -1, dtype=torch.long, device=dev)
        mask = torch.zeros((B, 1, T, P + T), dtype=torch.bool, device=dev)
        for i, (r, c, n, L) in enumerate(zip(rows, lead, past_len, length)):
            if c:
                ids[i, :c] = torch.tensor(r.missing, device=dev)
            ids[i, c:L] = r.x[0]
            pos[i] = torch.arange(n, n + T, device=dev)  # padding sits past the row's end
            if code is not None:
                code[i, c:L] = r.code[0]
            mask[i, 0, :, :n] = True  # the cached context
            mask[i, 0, :L, P : P + L] = True  # the block sees all of the row's query ...
            mask[i, 0, :c, P : P + c] = torch.ones(c, c, dtype=torch.bool, device=dev).tril()  # ... context is causal
            mask[i, 0, :c, P + c : P + L] = False
            mask[i, 0, L:, P] = True  # padding attends somewhere (its output is never read)
        past = _stacked(caches, past_len, P) if P else None
        if self.pack and sum(length) < B * T:  # the real positions alone, end to end
            row = torch.cat([torch.full((L,), i, dtype=torch.long) for i, L in enumerate(length)]).to(dev)
            col = torch.cat([torch.arange(L) for L in length]).to(dev)
            flat, present = self.lm(ids[row, col][None], pos[row, col][None], past, mask,
                                    None if code is None else code[row, col][None], (row, col, B, T))
            h = flat.new_zeros((B, T, flat.shape[-1]))  # back in the padded layout the rows are read from
            h[row, col] = flat[0]
        else:
            h, present = self.lm(ids, pos, past, mask, code)
        if first and self.attention == "block":
            for i, (slot, r, c, n) in enumerate(zip(slots, rows, lead, past_len)):
                if c:
                    new = [(torch.cat([k[i : i + 1, :, :n], k[i : i + 1, :, P : P + c]], dim=2),
                            torch.cat([v[i : i + 1, :, :n], v[i : i + 1, :, P : P + c]], dim=2)) for k, v in present]
                    self._slots[slot] = (new, self._slots.get(slot, (None, []))[1] + list(r.missing))
        return [h[i, c:L] for i, (c, L) in enumerate(zip(lead, length))]


def _stacked(caches, lengths, P: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per layer, the rows' cached keys and values [B, kvh, P, hd], each padded to ``P``."""
    like = next(c for c in caches if c is not None)
    out = []
    for layer, (k0, _) in enumerate(like):
        pad = lambda n: k0.new_zeros((1, k0.shape[1], P - n, k0.shape[3]))  # noqa: E731
        ks = [pad(0) if c is None else torch.cat([c[layer][0], pad(n)], dim=2) for c, n in zip(caches, lengths)]
        vs = [pad(0) if c is None else torch.cat([c[layer][1], pad(n)], dim=2) for c, n in zip(caches, lengths)]
        out.append((torch.cat(ks), torch.cat(vs)))
    return out
