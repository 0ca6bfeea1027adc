"""The verifier's hidden states a conditioned drafter reads: the tapped layers' states of the tokens
the verifier last ran over, one record per slot, grown by doubling."""

from __future__ import annotations

from typing import Sequence

import torch

from .protocols import common_prefix


class _TapRow:
    """One sequence's tapped states: ``ids`` [n] and a buffer of at least n feature rows."""

    def __init__(self):
        self.ids: list[int] = []
        self.buf: torch.Tensor | None = None  # grown by doubling: a verification appends, never copies all


class HiddenTap:
    """The tapped verifier hidden states of the tokens the verifier last ran over, position by
    position, one record per slot (sequence): ``ids`` [n] and ``features`` [n, k*d]. The verifier
    writes each row of its forward to that row's slot; the drafter reads the prefix a slot's record
    shares with the slot's committed sequence."""

    def __init__(self, layers: Sequence[int]):
        self.layers = tuple(int(i) for i in layers)
        self.open_slots(1)

    def open_slots(self, n: int) -> None:
        """Hold ``n`` slots (0 .. n - 1), all empty."""
        self._rows = [_TapRow() for _ in range(n)]

    def reset(self, slot: int | None = None) -> None:
        """Forget a slot's states (a new prompt follows there), or every slot's (None)."""
        for i in range(len(self._rows)) if slot is None else (slot,):
            self._rows[i] = _TapRow()

    def ids_of(self, slot: int = 0) -> list[int]:
        return self._rows[slot].ids

    @property
    def ids(self) -> list[int]:
        return self.ids_of(0)

    def features_of(self, slot: int = 0) -> torch.Tensor | None:
        r = self._rows[slot]
        return None if r.buf is None else r.buf[: len(r.ids)]

    @property
    def features(self) -> torch.Tensor | None:
        return self.features_of(0)

    def __len__(self) -> int:
        return len(self._rows[0].ids)

    def keep(self, n: int, slot: int = 0) -> None:
        """Forget every position of a slot from ``n`` on."""
        r = self._rows[slot]
        r.ids = r.ids[:n]

    def put(self, start: int, ids: Sequence[int], features: torch.Tensor, slot: int = 0) -> None:
        """The features of positions ``start .. len(ids) - 1`` of a slot's sequence ``ids``."""
        assert features.shape[0] == len(ids) - start, (features.shape, len(ids), start)
        self.keep(start, slot)
        r = self._rows[slot]
        need = len(ids)
        if r.buf is None or r.buf.shape[0] < need or r.buf.shape[1:] != features.shape[1:]:
            cap = max(need, 2 * (0 if r.buf is None else r.buf.shape[0]), 256)
            buf = features.new_empty((cap, *features.shape[1:]))
            if r.buf is not None and start and r.buf.shape[1:] == features.shape[1:]:
                buf[:start] = r.buf[:start]
            r.buf = buf
        r.buf[start:need] = features.detach()
        r.ids = r.ids + [int(t) for t in ids[start:]]

    def covered(self, seq: Sequence[int], slot: int = 0) -> int:
        """How many leading positions of a slot's ``seq`` have features."""
        return common_prefix(self._rows[slot].ids, seq)
