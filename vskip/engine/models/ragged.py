"""A KV cache whose rows hold sequences of different lengths: what a batched verification needs.

Each row (a *slot*, one sequence of the batch) has its own length. A forward writes each row's
new keys and values at that row's own positions, so a row that rejected part of its block simply
lowers its length: the rejected positions stay in the buffer, masked, and the row's next tokens
overwrite them. Nothing is cropped by copying. The attention mask of a forward is per row: a
query at position p of a row attends to that row's positions 0..p, whatever the other rows hold.

It speaks the part of transformers' cache interface a decoder layer uses (``update``,
``get_seq_length``) and is handed to the model with a prepared 4-D mask and per-row positions,
which transformers' causal LMs take as they are. The buffers of each layer are allocated on the
device of that layer's keys, and grow by doubling (the only copy, and a rare one).
"""

from __future__ import annotations

import torch

# the growth rule, the one of every RaggedCache (the memory plan counts what it holds with ragged_capacity)

#: the positions a layer's buffers start with
FIRST_CAPACITY = 256


def grown(have: int, span: int) -> int:
    """The positions a layer's buffers hold once a forward reading ``span`` columns finds ``have``
    (0: none yet): doubled, or as many as the forward reads, whichever is more."""
    return have if have >= span else max(span, 2 * have, FIRST_CAPACITY)


def ragged_capacity(first: int, needed: int) -> int:
    """The positions the buffers hold after a first forward of ``first`` columns, once decoding
    (a few columns more per forward) has reached ``needed``: what :func:`plan_memory` counts per row."""
    cap = grown(0, first)
    while cap < needed:
        cap = grown(cap, cap + 1)
    return cap



class RaggedCache:
    """Keys and values [slots, kv heads, capacity, head dim] per layer, with the write positions
    of the forward in progress (:meth:`begin`)."""

    def __init__(self, slots: int):
        self.slots = slots
        self.k: dict[int, torch.Tensor] = {}
        self.v: dict[int, torch.Tensor] = {}
        self.rows: torch.Tensor | None = None  # the slots of the forward in progress [B]
        self.whole = False  # they are every slot, in order
        self.pos: torch.Tensor | None = None  # their write positions [B, T]
        self.flat: tuple[torch.Tensor, torch.Tensor] | None = None  # a packed forward's (row, position) per input
        self.span = 0  # columns the forward's attention reads

    def begin(self, rows: torch.Tensor, pos: torch.Tensor, flat: tuple | None = None) -> torch.Tensor:
        """Start a forward of slots ``rows`` [B] whose inputs sit at positions ``pos`` [B, T];
        returns the boolean mask [B, 1, T, span] (True: may attend) of causal attention within
        each row's own sequence. ``flat``: the inputs come packed, [1, N] (row index into ``rows``
        [N], position [N]) for each (:func:`vskip.engine.models.attention.packed`); ``pos`` is
        then the padded layout attention runs in."""
        self.rows, self.pos, self.flat = rows, pos, flat
        self.span = int(pos.max()) + 1
        # every slot in order: each layer reads its buffers as views, no copy
        self.whole = len(rows) == self.slots and bool((rows == torch.arange(self.slots, device=rows.device)).all())
        cols = torch.arange(self.span, device=pos.device)
        return (cols[None, None, :] <= pos[:, :, None])[:, None]

    def _ensure(self, layer: int, like: torch.Tensor) -> None:
        have = self.k.get(layer)
        if have is not None and have.shape[2] >= self.span:
            return
        cap = grown(0 if have is None else have.shape[2], self.span)
        shape = (self.slots, like.shape[1], cap, like.shape[3])
        k, v = like.new_zeros(shape), like.new_zeros(shape)
        if have is not None:
            k[:, :, : have.shape[2]] = have
            v[:, :, : have.shape[2]] = self.v[layer]
        self.k[layer], self.v[layer] = k, v

    def update(self, key: torch.Tensor, value: torch.Tensor, layer_idx: int, *args, **kwargs):
        """Write the forward's keys/values [B, kvh, T, hd] at their rows and positions, in place;
        return the keys/values of those rows over the attended columns [B, kvh, span, hd] (a view
        when the forward holds every slot in order, else a copy of those columns alone)."""
        self._ensure(layer_idx, key)
        k, v = self.k[layer_idx], self.v[layer_idx]
        rows = self.rows.to(key.device)
        if self.flat is not None:  # [1, kvh, N, hd]: each input at its own row and position
            row, pos = (t.to(key.device) for t in self.flat)
            k[rows[row], :, pos] = key[0].transpose(0, 1)
            v[rows[row], :, pos] = value[0].transpose(0, 1)
        else:
            B, _, T, _ = key.shape
            pos = self.pos.to(key.device)
            where = (rows[:, None].expand(B, T), slice(None), pos)
            k[where] = key.permute(0, 2, 1, 3)
            v[where] = value.permute(0, 2, 1, 3)
        if self.whole:
            return k[:, :, : self.span], v[:, :, : self.span]
        return k[:, :, : self.span].index_select(0, rows), v[:, :, : self.span].index_select(0, rows)

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.span


def padding_groups(news: list[int], floor: int = 16, ratio: int = 4) -> list[list[int]]:
    """Rows (their counts of new positions ``news``) grouped into forwards: a row with more than
    ``floor`` new positions and ``ratio`` times the median goes alone; the others share one."""
    median = sorted(news)[(len(news) - 1) // 2]
    long = [i for i, n in enumerate(news) if n > max(floor, ratio * median)]
    rest = [i for i in range(len(news)) if i not in long]
    return ([rest] if rest else []) + [[i] for i in long]
