"""The native runtime's one key/value cache: slots of sequences, each holding the tokens whose keys
it holds, written by position and cut by a ``keep`` (llama.cpp's ``seq_rm``)."""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from ..protocols import common_prefix
from .shape import Shape

#: positions a slot starts with
FIRST_CAPACITY = 256


def grown(have: int, need: int, most: int) -> int:
    """The capacity of a slot holding ``have`` positions once it must hold ``need``: doubled, or
    ``need`` if more, at most ``most``, rounded up to a multiple of 64 (the one growth rule)."""
    if need <= have:
        return have
    new = min(max(need, 2 * have), most)
    return -(-new // 64) * 64


def capacity_for(first: int, need: int, most: int) -> int:
    """The capacity a slot reaches when its first forward writes ``first`` positions and decoding
    (a few positions more per forward) then reaches ``need``: what a memory plan counts per slot."""
    cap = grown(FIRST_CAPACITY, min(first, most), most)
    while cap < min(need, most):
        cap = grown(cap, cap + 1, most)
    return cap


class SlotCache:
    """Keys and values of ``slots`` sequences, and the tokens each slot holds: per slot a key
    tensor [layers, kv, capacity/16, hd, 16] (tiles of 16 keys, each transposed, for the kernels'
    score loop: contiguous, never a power-of-two stride) and a value tensor [layers, kv, capacity,
    hd]. The one cache of every native consumer (verifier, drafter, distillation). A forward
    writes the keys of its rows at their positions; the owner records what a slot then holds with
    :meth:`wrote` and drops a tail with :meth:`keep` (llama.cpp's ``seq_rm``), and :meth:`reuse`
    keeps the longest prefix a new sequence shares. Capacity, a multiple of 64, grows by doubling
    (:meth:`reserve`, the one growth rule)."""

    def __init__(self, shape: Shape, slots: int, capacity: int = FIRST_CAPACITY):
        assert capacity % 64 == 0, capacity
        self.shape = shape
        self.k: list[torch.Tensor] = []
        self.v: list[torch.Tensor] = []
        self.ids: list[list[int]] = []
        self._capacity = capacity
        self.resize(slots)

    @property
    def slots(self) -> int:
        return len(self.k)

    def held(self, slot: int) -> list[int]:
        """The tokens whose keys ``slot`` holds, at positions 0, 1, ..."""
        return self.ids[slot]

    def keep(self, slot: int, n: int) -> None:
        """Forget ``slot``'s positions from ``n`` on (its keys stay until overwritten)."""
        del self.ids[slot][n:]

    def reuse(self, slot: int, ids: Sequence[int]) -> int:
        """Keep the longest prefix ``slot`` shares with ``ids``; returns its length."""
        n = common_prefix(self.ids[slot], ids)
        self.keep(slot, n)
        return n

    def wrote(self, slot: int, start: int, ids: Sequence[int]) -> None:
        """``slot`` now holds ``ids`` from position ``start`` on (what a forward just wrote there)."""
        assert start <= len(self.ids[slot]), (start, len(self.ids[slot]))
        self.ids[slot][start:] = [int(t) for t in ids]

    def resize(self, slots: int) -> None:
        while len(self.k) < slots:
            self.k.append(self._alloc_k(self._capacity))
            self.v.append(self._alloc_v(self._capacity))
            self.ids.append([])
        del self.k[slots:], self.v[slots:], self.ids[slots:]

    def _alloc_k(self, cap):
        s = self.shape
        return torch.zeros((s.n_layers, s.n_kv, cap // 16, s.head_dim, 16), dtype=torch.float32)

    def _alloc_v(self, cap):
        s = self.shape
        return torch.zeros((s.n_layers, s.n_kv, cap, s.head_dim), dtype=torch.float32)

    def capacity(self, slot: int) -> int:
        return int(self.v[slot].shape[2])

    def reserve(self, slots: Sequence[int], need: int) -> None:
        """Make every slot of ``slots`` hold at least ``need`` positions (keeping what it holds)."""
        if need > self.shape.max_positions:
            raise ValueError(f"a sequence of {need} tokens is longer than the model's {self.shape.max_positions}")
        for slot in set(int(s) for s in slots):
            cap = self.capacity(slot)
            if need <= cap:
                continue
            new = grown(cap, need, self.shape.max_positions)
            k, v = self._alloc_k(new), self._alloc_v(new)
            k[:, :, : cap // 16] = self.k[slot]
            v[:, :, :cap] = self.v[slot]
            self.k[slot], self.v[slot] = k, v

    def pointers(self, slots: Sequence[int]):
        kp = np.array([self.k[s].data_ptr() for s in slots], dtype=np.uint64)
        vp = np.array([self.v[s].data_ptr() for s in slots], dtype=np.uint64)
        cap = np.array([self.capacity(s) for s in slots], dtype=np.int32)
        return kp, vp, cap
