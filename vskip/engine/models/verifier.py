"""The verifier adapter: any transformers causal LM, with a KV cache that follows the committed
sequence, or the paper's no-cache mode that recomputes the full sequence every call (A.8).

The output head: for float32 models whose logits are a plain linear map of the last hidden state,
the head is :class:`~vskip.engine.models.head.ExactHead` (a bfloat16 screen with a rigorous error bound,
then the surviving candidates in float64): cheaper, exact, and the same whatever the number of
positions a call scores. ``exact_head=False`` keeps the model's own head.

Cache discipline: the verifier holds ``slots`` sequences at once (a batch; one by default) in a
:class:`~vskip.engine.models.ragged.RaggedCache`. Before each call a slot's cache is cut to the
longest prefix it shares with the new input (and never past the last committed token, whose
logits are needed) by lowering its length, then the rest — tokens committed by skips included — is
computed in the same forward as the block. The calls of several slots share one forward
(:meth:`HFVerifier.score_many`), each row at its own positions under its own mask. A shadow call
(§3.2) lowers its slot's length back afterwards, so it leaves nothing a later call could profit
from. One slot or many, it is the same code.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from ..policy import Sampling, Verdict  # data types only
from .attention import NAME as GQA_ATTENTION
from .attention import packed
from .head import ExactHead, plain_head
from .protocols import Call, common_prefix
from .ragged import RaggedCache, padding_groups
from .sampling import warped_probs


def _cache_kwarg(model) -> str:
    """transformers renamed ``past_key_values`` to ``cache``; use whichever this version takes."""
    import inspect

    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


#: packed, a row with more new positions than this (and 4 times the median) takes a forward of its own
PACKED_FLOOR = 64


class HFVerifier:
    def __init__(
        self,
        model,
        eos_ids: Sequence[int],
        special_ids: Sequence[int] = (),
        use_cache: bool = True,
        max_length: int | None = None,
        exact_head: bool = True,
    ):
        self.model = model.eval()
        self.use_cache = use_cache
        self.eos_ids = frozenset(int(i) for i in eos_ids)
        self.special_ids = frozenset(int(i) for i in special_ids) - self.eos_ids
        cfg = model.config
        self.vocab_size = int(cfg.vocab_size)
        self.max_length = int(max_length or getattr(cfg, "max_position_embeddings", 1 << 30))
        # inputs go where the embedding is; a model spread over devices (accelerate's device_map)
        # moves activations between them itself, and its outputs come back once per call
        self.device = model.get_input_embeddings().weight.device
        self._cache_arg = _cache_kwarg(model)
        head = plain_head(model) if exact_head else None
        self.head = ExactHead(head.weight) if head is not None else None
        self.taps: list = []
        self._hooked: set[int] = set()
        self._grabbed: dict[int, torch.Tensor] = {}
        self.slots = 0
        self.pack = True  # rows of different lengths packed where the attention allows (False: padded, to compare)
        self.open_slots(1)

    def open_slots(self, n: int) -> None:
        """Hold ``n`` sequences at once (slots 0 .. n - 1), each with its own cache; all empty."""
        if n < 1:
            raise ValueError(f"a verifier holds at least one sequence, not {n}")
        if self.slots != n:  # the same slots keep their buffers: a query reads only positions written anew
            self._cache = RaggedCache(n)
        self.slots = n
        self._cached_ids: list[list[int]] = [[] for _ in range(n)]
        for tap in self.taps:
            tap.open_slots(n)

    def reset(self, slot: int | None = None) -> None:
        """Forget what a slot holds (a new prompt follows there), or every slot's (None)."""
        for i in range(self.slots) if slot is None else (slot,):
            self._cached_ids[i] = []
        for tap in self.taps:
            tap.reset(slot)

    @property
    def packs(self) -> bool:
        """Whether rows of different lengths share a forward packed, without padding (the
        attention is vskip's own: :mod:`vskip.engine.models.attention`)."""
        return self.pack and getattr(self.model.config, "_attn_implementation", None) == GQA_ATTENTION

    def packed_forward(self, news: list[int]) -> bool:
        """Whether one forward over rows computing ``news`` new positions each goes packed (one
        sequence of their positions) rather than padded to the longest row."""
        return self.use_cache and len(news) > 1 and sum(news) < len(news) * max(news) and self.packs

    @property
    def vocabulary(self) -> int:
        return self.vocab_size

    def set_tap(self, tap) -> None:
        """Hand the hidden states of the layers ``tap.layers`` (layer i: transformers'
        ``hidden_states[i + 1]``, the output of decoder layer i, final-normed for the last) of
        every position a real call runs over to ``tap``
        (:class:`~vskip.engine.models.conditioned.HiddenTap`), beside any tap set before; a shadow call
        leaves every tap as it was."""
        layers = self.model.model.layers
        bad = [i for i in tap.layers if not 0 <= i < len(layers)]
        if bad:
            raise ValueError(f"the drafter reads verifier layers {bad}, but the verifier has {len(layers)} layers")

        def grab(i):
            last = i == len(layers) - 1  # transformers' hidden_states[-1] is the final-normed state

            def fn(_module, _inp, out):
                h = out[0] if isinstance(out, tuple) else out
                self._grabbed[i] = self.model.model.norm(h) if last else h
            return fn

        for i in sorted(set(tap.layers) - self._hooked):
            layers[i].register_forward_hook(grab(i))
            self._hooked.add(i)
        self.taps.append(tap)
        tap.open_slots(self.slots)

    @torch.inference_mode()
    def prefill(self, ids, slot: int = 0) -> None:
        """Run over ``ids`` (committed tokens) so that the slot's cache and the tap hold them."""
        ids = [int(t) for t in ids]
        if ids:
            self._forward([(slot, ids, 1)])

    def set_cache(self, on: bool) -> None:
        """Keep a KV cache (on) or recompute the whole sequence every call (off, as the paper)."""
        self.use_cache = bool(on)
        self.reset()

    def warmup(self, seq, gamma) -> None:
        self.score(list(seq), [0] * gamma)
        self.reset()

    def _forward(self, rows: list[tuple[int, list[int], int]]) -> list[torch.Tensor]:
        """The outputs [keep, ...] of the last ``keep`` positions of each row (slot, ids, keep)
        (final hidden states when the exact head is used, logits otherwise). Each row computes what
        its slot's cache lacks (all of it without a cache); the rows share one forward, packed where
        the attention allows; padded, a row with many more new positions than the others (a prompt
        joining the batch) takes a forward of its own rather than have every row padded to its length."""
        starts = [min(common_prefix(self._cached_ids[slot], ids), len(ids) - keep) if self.use_cache else 0
                  for slot, ids, keep in rows]
        news = [len(ids) - n for (_, ids, _), n in zip(rows, starts)]
        outputs: list = [None] * len(rows)
        # packed, a longer row costs its own positions and attention's padding alone: only a row
        # far longer (a prompt joining the batch) is worth a forward of its own
        for group in padding_groups(news, floor=PACKED_FLOOR if self.use_cache and self.packs else 16):
            for i, out in zip(group, self._forward_rows([rows[i] for i in group], [starts[i] for i in group])):
                outputs[i] = out
        return outputs

    def _forward_rows(self, rows: list[tuple[int, list[int], int]], starts: list[int]) -> list[torch.Tensor]:
        """One forward over ``rows``, each computing its ids from ``starts`` on. Rows of different
        lengths go packed (:func:`vskip.engine.models.attention.packed`) where the attention allows:
        no padded position is computed outside attention."""
        base = self.model.model if self.head is not None else self.model
        news = [len(ids) - n for (_, ids, _), n in zip(rows, starts)]
        T = max(news)
        pos = torch.tensor(starts)[:, None] + torch.arange(T)[None]
        slots = torch.tensor([slot for slot, _, _ in rows])
        kw = {} if self.head is not None else {"logits_to_keep": 0}
        if self.packed_forward(news):
            x = torch.tensor([[t for (_, ids, _), n in zip(rows, starts) for t in ids[n:]]])
            row = torch.cat([torch.full((k,), r) for r, k in enumerate(news)])
            col = torch.cat([torch.arange(k) for k in news])
            flat = pos[row, col]
            mask = self._cache.begin(slots.to(self.device), pos.to(self.device), (row, flat))
            kw[self._cache_arg] = self._cache
            with packed(row.to(self.device), col.to(self.device), len(rows), T):
                out = self._output(base(input_ids=x.to(self.device), position_ids=flat[None].to(self.device),
                                        attention_mask=mask, use_cache=True, **kw))
            ends = np.cumsum(news).tolist()
            take = [(0, slice(e - k, e)) for e, k in zip(ends, news)]  # each row's positions in the one sequence
        else:
            x = torch.zeros((len(rows), T), dtype=torch.long)
            for r, ((_, ids, _), n) in enumerate(zip(rows, starts)):
                x[r, : len(ids) - n] = torch.tensor(ids[n:])
            if self.use_cache:
                mask = self._cache.begin(slots.to(self.device), pos.to(self.device))
                kw[self._cache_arg] = self._cache
            else:  # every row from its first token, attending within itself: nothing is kept
                mask = (torch.arange(T)[None, None, :] <= pos[:, :, None])[:, None].to(self.device)
            out = self._output(base(input_ids=x.to(self.device), position_ids=pos.to(self.device), attention_mask=mask,
                                    use_cache=self.use_cache, **kw))
            take = [(r, slice(0, k)) for r, k in enumerate(news)]
        outputs = []
        for (slot, ids, keep), (r, cols) in zip(rows, take):
            self._cached_ids[slot] = list(ids)
            n = cols.stop - cols.start  # the positions this row computed, the last of its ids
            self._hand_over(r, cols, len(ids) - n, ids, slot)
            outputs.append(out[r, cols][n - keep:])
        self._grabbed.clear()
        return outputs

    def _hand_over(self, row: int, cols: slice, start: int, ids: list[int], slot: int) -> None:
        """Give the taps the hidden states of positions ``start ..`` of ``ids``, which row ``row``
        computed for ``slot`` at columns ``cols`` of the forward."""
        for tap in self.taps:
            tap.put(start, ids, torch.cat([self._grabbed[i][row, cols] for i in tap.layers], dim=-1), slot)

    def _output(self, out) -> torch.Tensor:
        return out.last_hidden_state if self.head is not None else out.logits

    def _run(self, calls: Sequence[Call]) -> list[torch.Tensor]:
        """Final hidden states (exact head) or logits of each call's block positions and the one
        after it [len(block) + 1, ...], on the head's device, from one forward; a shadow call
        restores its slot's cache and the taps as it found them."""
        rows, restore = [], []
        for c in calls:
            ids = [int(t) for t in c.seq] + [int(t) for t in c.block]
            rows.append((c.slot, ids, len(c.block) + 1))
            # What the cache could still serve before this call: a shadow call restores exactly that.
            restore.append((common_prefix(self._cached_ids[c.slot], ids),
                            [tap.covered(ids, c.slot) for tap in self.taps]) if c.shadow else None)
        outs = self._forward(rows)
        for c, kept in zip(calls, restore):
            if kept is not None:
                self._cached_ids[c.slot] = self._cached_ids[c.slot][: kept[0]]
                for tap, n in zip(self.taps, kept[1]):  # the skipped tokens stay without features
                    tap.keep(n, c.slot)
        return [o.to(self.head.device) for o in outs] if self.head is not None else outs

    @torch.inference_mode()
    def score_many(self, calls: Sequence[Call]) -> list[Verdict]:
        return [self._verdict(out, c.block) for out, c in zip(self._run(calls), calls)]

    @torch.inference_mode()
    def distributions_many(self, calls: Sequence[Call], sampling: Sampling) -> list[np.ndarray]:
        outs = self._run(calls)
        return [warped_probs(o.float() @ self.head.weight.T if self.head is not None else o.float(), sampling)
                .cpu().numpy() for o in outs]

    def score(self, seq: Sequence[int], block: Sequence[int], shadow: bool = False) -> Verdict:
        return self.score_many([Call(seq, block, shadow)])[0]

    def distributions(self, seq: Sequence[int], block: Sequence[int], sampling: Sampling,
                      shadow: bool = False) -> np.ndarray:
        return self.distributions_many([Call(seq, block, shadow)], sampling)[0]

    def _verdict(self, out: torch.Tensor, block: Sequence[int]) -> Verdict:
        g = len(block)
        b = torch.tensor([int(t) for t in block], dtype=torch.long, device=out.device)
        if self.head is not None:
            argmax, gap, rank_fn = self.head(out, b if g else None)
            rank = lambda: rank_fn().cpu().numpy().astype(np.int64)  # noqa: E731 - computed on demand
        else:
            argmax, gap, r = _plain_verdict(out.float(), b)
            rank = r.cpu().numpy().astype(np.int64)
        return Verdict(
            argmax.cpu().numpy().astype(np.int64),
            draft_gap=gap.cpu().numpy().astype(np.float64),
            draft_rank=rank,
        )


def _plain_verdict(logits: torch.Tensor, block: torch.Tensor):
    """Argmax [g+1], drafted-token gap [g] and rank [g] from full logits [g+1, V]."""
    argmax = logits.argmax(-1)
    if not block.numel():
        return argmax, torch.zeros(0), torch.zeros(0, dtype=torch.long)
    z = logits[:-1]
    zd = z.gather(1, block[:, None])[:, 0]
    return argmax, zd - z.max(-1).values, (z > zd[:, None]).sum(-1)
