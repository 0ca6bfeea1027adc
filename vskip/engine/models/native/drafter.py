"""The block-attention diffusion drafter on the native runtime.

The reveal schedule, the copy prior, the restricted head and the features are the
:class:`~vskip.engine.models.drafter.DiffusionDrafter`'s own; only the network's forward moves to
the kernels. A slot's context is cached causally in a native slot cache (its length is the
context it holds; rollback is lowering it); a block query ``[last committed token ; gamma masks]``
sees the whole context and the whole query, and the context the cache lacks rides in the first
reveal step's forward, attending causally. Every row of a batch's step shares one forward.
"""

from __future__ import annotations

from typing import Sequence

import torch

from ..drafter import DiffusionDrafter
from ..protocols import DraftBlock, common_prefix
from .model import Transformer, from_backbone


class NativeDrafter(DiffusionDrafter):
    def __init__(self, drafter: DiffusionDrafter, net: Transformer):
        if drafter.spec.attention != "block":
            raise ValueError("the native runtime drafts with block attention; a full-attention drafter "
                             "(Dream, DiffuCoder) runs on transformers")
        self.__dict__.update(drafter.__dict__)
        self.net = net
        self.reset()

    @classmethod
    def of(cls, drafter: DiffusionDrafter, max_positions: int, threads: int | None = None) -> "NativeDrafter":
        return cls(drafter, from_backbone(drafter.model.backbone, max_positions, threads))

    # -- slots: the ids each holds, and one native cache for all --------------------------------
    def reset(self, slot: int | None = None) -> None:
        if not hasattr(self, "net"):  # the base class's constructor, before this one's
            return super().reset(slot)
        if slot is None:
            self._held: dict[int, list[int]] = {}
            self._kv = self.net.new_cache(1)
        else:
            self._held.pop(slot, None)
        self._slot, self._cached_ids = 0, []

    def _enter(self, slot: int) -> None:
        self._slot, self._cached_ids = slot, self._held.get(slot, [])
        if slot >= len(self._kv.k):
            self._kv.resize(slot + 1)

    def _leave(self, slot: int) -> None:
        self._held[slot] = self._cached_ids

    def _block_input(self, seq: Sequence[int], gamma: int):
        seq = [int(t) for t in seq]
        ctx = seq[:-1]
        self._cached_ids = self._cached_ids[: common_prefix(self._cached_ids, ctx)]
        x = torch.full((1, 1 + gamma), self.model.mask_id, dtype=torch.long)
        x[0, 0] = seq[-1]
        return x, 1, len(seq) - 1, ctx[len(self._cached_ids):]

    @torch.inference_mode()
    def prefill(self, ids, slot: int = 0) -> None:
        """Encode context ``ids`` causally into ``slot``'s cache (what the cache already holds of them is kept)."""
        self._enter(slot)
        ctx = [int(t) for t in ids]
        n = common_prefix(self._cached_ids, ctx)
        missing = ctx[n:]
        if missing:
            C = len(missing)  # context positions read no hint
            self.net.forward(self._kv, [slot] * C, [-1] * C, list(range(n, n + C)), out_rows=[C - 1], logits=False,
                             embeds=self.model.embed(torch.tensor([missing], dtype=torch.long))[0].float())
        self._cached_ids = ctx
        self._leave(slot)

    # -- the network --------------------------------------------------------------------------
    def _rows(self, rows, slots, first: bool) -> list[torch.Tensor]:
        """Hidden states [P + gamma, d] of each row's query, all rows in one forward; at the first
        step the context a row's slot lacks rides along and joins its cache."""
        embeds, slot_of, pos, seen, outs, spans = [], [], [], [], [], []
        n = 0
        for r, slot in zip(rows, slots):
            missing = list(r.missing) if first else []
            C, T = len(missing), r.x.shape[1]
            ids = torch.cat([torch.tensor([missing], dtype=torch.long), r.x], dim=1) if C else r.x
            code = r.code
            if code is not None and C:
                code = torch.cat([torch.full((1, C), -1, dtype=code.dtype), code], dim=1)
            with torch.inference_mode():
                embeds.append(self.model.embed(ids, code)[0].float())
            start = r.start - C
            slot_of += [slot] * (C + T)
            pos += range(start, r.start + T)
            seen += list(range(start + 1, r.start + 1)) + [r.start + T] * T
            outs += range(n + C, n + C + T)
            spans.append(T)
            n += C + T
            if C:
                self._held[slot] = self._held.get(slot, []) + missing
        h, _ = self.net.forward(self._kv, slot_of, [-1] * n, pos, seen=seen, out_rows=outs, hidden=True,
                                logits=False, embeds=torch.cat(embeds))
        h = h.to(self._W.dtype)
        return list(torch.split(h, spans))

    def _draft(self, requests: Sequence[tuple[int, Sequence[int], int]], features: bool, sampling) -> list[DraftBlock]:
        rows, slots = [], []
        for slot, seq, g in requests:
            self._enter(slot)
            rows.append(self.start_block(seq, g, features, sampling))
            self._leave(slot)
            slots.append(slot)
        for s in range(self.steps):
            for row in rows:
                self.step_input(row, s)
            for row, h in zip(rows, self._rows(rows, slots, first=s == 0)):
                self.step_output(row, s, h)
        return [row.finish() for row in rows]

    @torch.inference_mode()
    def propose(self, seq, gamma, features=False, sampling=None, slot: int = 0) -> DraftBlock:
        return self._draft([(slot, seq, gamma)], features, sampling)[0]

    @torch.inference_mode()
    def propose_many(self, requests, features=False, sampling=None) -> list[DraftBlock]:
        return self._draft(requests, features, sampling)
