"""The block-attention drafter's network on the native runtime.

The :class:`~vskip.engine.models.drafter.DiffusionDrafter` reveals the block (schedule, copy prior,
restricted head, features); this body computes the hidden states it reads, as
:class:`~vskip.engine.models.drafter_body.TorchBody` does on torch, through the same native forward
and slot cache the verifier uses. A slot's context is cached causally (the cache records the
tokens it holds; rollback is its ``keep``); a block query ``[last committed token ; gamma masks]``
sees the whole context and the whole query, and the context the cache lacks rides in the first
reveal step's forward, attending causally. Every row of a reveal step shares one forward.
"""

from __future__ import annotations

from typing import Sequence

import torch

from .model import Transformer, from_backbone


class NativeBody:
    """A drafter network's layers as native blocks, fed the network's own embeddings."""

    attention = "block"
    device = "cpu"

    def __init__(self, lm, net: Transformer):
        if lm.spec.attention != "block":
            raise ValueError("the native runtime drafts with block attention; a full-attention drafter "
                             "(Dream, DiffuCoder) runs on transformers")
        self.lm, self.net = lm, net
        self.cache = net.new_cache(1)

    @classmethod
    def of(cls, lm, max_positions: int, threads: int | None = None) -> "NativeBody":
        """The body of a :class:`~vskip.engine.models.diffusion_lm.DiffusionLM` (its layers as Q8_0 blocks)."""
        return cls(lm, from_backbone(lm.backbone, max_positions, threads))

    def fresh(self) -> "NativeBody":
        return NativeBody(self.lm, self.net)

    def reset(self, slot: int | None = None) -> None:
        for s in range(self.cache.slots) if slot is None else ([slot] if slot < self.cache.slots else []):
            self.cache.keep(s, 0)

    def _open(self, slot: int) -> None:
        if slot >= self.cache.slots:
            self.cache.resize(slot + 1)

    def begin(self, slot: int, seq: Sequence[int]) -> tuple[int, list[int]]:
        self._open(slot)
        ctx = [int(t) for t in seq[:-1]]
        return len(seq) - 1, ctx[self.cache.reuse(slot, ctx):]

    def groups(self, rows) -> list[list[int]]:
        return [list(range(len(rows)))]  # the kernels compute every row alike: one forward for all

    def _embed(self, ids: torch.Tensor, code: torch.Tensor | None = None) -> torch.Tensor:
        with torch.inference_mode():
            return self.lm.embed(ids, code)[0].float()

    def prefill(self, slot: int, ids: Sequence[int]) -> None:
        """Encode context ``ids`` causally into ``slot``'s cache (what it already holds of them is kept)."""
        self._open(slot)
        ctx = [int(t) for t in ids]
        n = self.cache.reuse(slot, ctx)
        missing = ctx[n:]
        if missing:
            C = len(missing)  # context positions read no hint
            self.net.forward(self.cache, [slot] * C, [-1] * C, list(range(n, n + C)), out_rows=[C - 1], logits=False,
                             embeds=self._embed(torch.tensor([missing], dtype=torch.long)))
            self.cache.wrote(slot, n, missing)

    def hidden(self, rows, slots: Sequence[int], first: bool) -> list[torch.Tensor]:
        embeds, slot_of, pos, seen, outs, spans, joins = [], [], [], [], [], [], []
        n = 0
        for r, slot in zip(rows, slots):
            missing = list(r.missing) if first else []
            C, T = len(missing), r.x.shape[1]
            ids = torch.cat([torch.tensor([missing], dtype=torch.long), r.x], dim=1) if C else r.x
            code = r.code
            if code is not None and C:
                code = torch.cat([torch.full((1, C), -1, dtype=code.dtype), code], dim=1)
            embeds.append(self._embed(ids, code))
            start = r.start - C
            slot_of += [slot] * (C + T)
            pos += range(start, r.start + T)
            seen += list(range(start + 1, r.start + 1)) + [r.start + T] * T
            outs += range(n + C, n + C + T)
            spans.append(T)
            n += C + T
            if C:
                joins.append((slot, start, missing))
        h, _ = self.net.forward(self.cache, slot_of, [-1] * n, pos, seen=seen, out_rows=outs, hidden=True,
                                logits=False, embeds=torch.cat(embeds))
        for slot, start, missing in joins:
            self.cache.wrote(slot, start, missing)
        return list(torch.split(h, spans))
