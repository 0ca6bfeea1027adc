"""The verifier on the native runtime: the :class:`~vskip.engine.models.protocols.Verifier`
protocol over a :class:`~vskip.engine.models.native.model.Transformer` and its slot cache.

Every call of a batch is one forward: each call computes what its slot's cache lacks (the tokens
after the longest prefix the cache shares with the call's sequence, and never past the last
committed token, whose logits are needed) and scores its block. The slot cache keeps what each slot
holds; rollback is its ``keep``, and a shadow call keeps what it found. The kernels compute every row the same way
whatever else the forward holds, so a verification and a one-token step agree to the bit
(:mod:`vskip.engine.models.native.model`): Strict SDD on this runtime equals this runtime's own
greedy decoding by construction, and tests/test_native.py checks it.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from ...policy import Sampling, Verdict  # data types only
from ..protocols import Call, common_prefix
from ..sampling import warped_probs
from .model import Transformer

#: what config.json and summary.json call this runtime
NAME = "native"


class NativeVerifier:
    device = "cpu"
    #: the transformers model (None: this verifier has none; ``vskip compare``'s ``hf`` needs it)
    model = None

    def __init__(self, net: Transformer, eos_ids: Sequence[int], special_ids: Sequence[int] = (),
                 use_cache: bool = True, max_length: int | None = None):
        self.net = net
        self.use_cache = use_cache
        self.eos_ids = frozenset(int(i) for i in eos_ids)
        self.special_ids = frozenset(int(i) for i in special_ids) - self.eos_ids
        self.vocab_size = net.vocab
        self.max_length = int(min(max_length or net.shape.max_positions, net.shape.max_positions))
        self.slots = 0
        self.cache = None
        #: the :class:`~vskip.engine.models.tap.HiddenTap` s handed every position's tapped states
        self.taps: list = []
        self.open_slots(1)

    @property
    def vocabulary(self) -> int:
        return self.vocab_size

    def open_slots(self, n: int) -> None:
        if n < 1:
            raise ValueError(f"a verifier holds at least one sequence, not {n}")
        if self.cache is None:
            self.cache = self.net.new_cache(n)
        else:
            self.cache.resize(n)
        self.slots = n
        for tap in self.taps:
            tap.open_slots(n)
        self.reset()

    def reset(self, slot: int | None = None) -> None:
        for i in range(self.slots) if slot is None else (slot,):
            self.cache.keep(i, 0)
        for tap in self.taps:
            tap.reset(slot)

    def set_tap(self, tap) -> None:
        """Hand the hidden states of the layers ``tap.layers`` (layer i: transformers'
        ``hidden_states[i + 1]``, the output of decoder layer i, final-normed for the last) of
        every position a real call runs over to ``tap`` (a conditioned drafter's), beside any tap
        set before; a shadow call leaves every tap as it was."""
        n = self.net.shape.n_layers
        bad = [i for i in tap.layers if not 0 <= i < n]
        if bad:
            raise ValueError(f"the drafter reads verifier layers {bad}, but the verifier has {n} layers")
        self.taps.append(tap)
        tap.open_slots(self.slots)

    def set_cache(self, on: bool) -> None:
        self.use_cache = bool(on)
        self.reset()

    def warmup(self, seq, gamma) -> None:
        self.score(list(seq), [0] * gamma)
        self.reset()

    def prefill(self, ids, slot: int = 0) -> None:
        ids = [int(t) for t in ids]
        if ids:
            self._forward([(slot, ids, 1)], logits=False)

    def _forward(self, rows: list[tuple[int, list[int], int]], logits: bool = True
                 ) -> list[tuple[torch.Tensor, np.ndarray]]:
        """Logits [keep, V] of the last ``keep`` positions of each row (slot, ids, keep) and their
        argmax [keep] as the runtime found it (-1: a logit not finite), all rows in one forward."""
        slots, tokens, positions, outs, spans, computed = [], [], [], [], [], []
        for slot, ids, keep in rows:
            if len(ids) > self.max_length:
                raise ValueError(f"a sequence of {len(ids)} tokens is longer than the verifier's {self.max_length}")
            start = min(self.cache.reuse(slot, ids), len(ids) - keep) if self.use_cache else 0
            first = len(tokens)
            tokens += ids[start:]
            positions += range(start, len(ids))
            slots += [slot] * (len(ids) - start)
            spans.append((len(outs), keep))
            outs += range(first + len(ids) - start - keep, first + len(ids) - start)
            self.cache.wrote(slot, start, ids[start:])  # what it held from ``start`` on is replaced
            computed.append((slot, ids, start, first))
        layers = sorted({i for tap in self.taps for i in tap.layers})
        tapped = torch.empty((len(tokens), len(layers), self.net.shape.dim)) if layers else None
        top = np.empty(len(outs), dtype=np.int32) if logits else None
        _, z = self.net.forward(self.cache, slots, tokens, positions, out_rows=outs, logits=logits, taps=layers,
                                tap_out=tapped, argmax_out=top)
        for slot, ids, start, first in computed:  # each tap gets its layers of the positions each row computed
            rows_of = tapped[first: first + len(ids) - start] if layers else None
            for tap in self.taps:
                cols = [layers.index(i) for i in tap.layers]
                tap.put(start, ids, rows_of[:, cols].reshape(len(ids) - start, -1), slot)
        return [(z[a: a + k], top[a: a + k]) for a, k in spans] if logits else []

    def _run(self, calls: Sequence[Call]) -> list[tuple[torch.Tensor, np.ndarray]]:
        rows, restore = [], []
        for c in calls:
            ids = list(map(int, c.seq)) + list(map(int, c.block))
            rows.append((c.slot, ids, len(c.block) + 1))
            restore.append((common_prefix(self.cache.held(c.slot), ids),
                            [tap.covered(ids, c.slot) for tap in self.taps]) if c.shadow else None)
        outs = self._forward(rows)
        for c, kept in zip(calls, restore):
            if kept is not None:
                self.cache.keep(c.slot, kept[0])
                for tap, n in zip(self.taps, kept[1]):  # the skipped tokens stay without features
                    tap.keep(n, c.slot)
        return outs

    def score_many(self, calls: Sequence[Call]) -> list[Verdict]:
        return [verdict(z, c.block, top) for (z, top), c in zip(self._run(calls), calls)]

    def distributions_many(self, calls: Sequence[Call], sampling: Sampling) -> list[np.ndarray]:
        return [warped_probs(z, sampling).numpy() for z, _ in self._run(calls)]

    def score(self, seq: Sequence[int], block: Sequence[int], shadow: bool = False) -> Verdict:
        return self.score_many([Call(seq, block, shadow)])[0]

    def distributions(self, seq, block, sampling: Sampling, shadow: bool = False) -> np.ndarray:
        return self.distributions_many([Call(seq, block, shadow)], sampling)[0]


def verdict(z: torch.Tensor, block: Sequence[int], top: np.ndarray | None = None) -> Verdict:
    """Argmax [g + 1], drafted-token gaps and ranks [g] from logits ``z`` [g + 1, V] (float32,
    exact as computed: the argmax is the lowest id at the maximum). ``top``: the argmax the
    runtime found beside the logits (-1 where one is not finite: numpy decides those rows)."""
    g = len(block)
    zn = z.numpy()  # numpy's argmax (the first at the maximum, as torch's) is many times faster on a CPU
    if top is None or (top < 0).any():
        argmax = zn.argmax(-1).astype(np.int64)
    else:
        argmax = top.astype(np.int64)
    if not g:
        return Verdict(argmax, np.zeros(0), np.zeros(0, dtype=np.int64))
    zb = zn[:-1]

    def drafted() -> np.ndarray:  # each drafted token's logit
        return zb[np.arange(g), np.asarray([int(t) for t in block], dtype=np.int64)]

    def gap() -> np.ndarray:  # read only by lenient acceptance; the maximum read where the argmax found it
        return (drafted() - zb[np.arange(g), argmax[:-1]]).astype(np.float64)

    return Verdict(argmax, draft_gap=gap, draft_rank=lambda: (zb > drafted()[:, None]).sum(-1).astype(np.int64))
