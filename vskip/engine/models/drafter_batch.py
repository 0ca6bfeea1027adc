"""Several slots' blocks drafted together: each reveal step of the block-attention drafter runs
every row in one forward.

Each row keeps its own context cache (the drafter's slot). A forward stacks the rows' caches,
padded to the longest, and their queries (the context each row still lacks, then its block),
padded to the longest, under one mask that gives every row exactly the attention of its own
forward (:meth:`vskip.engine.models.drafter.DiffusionDrafter._first_hidden`): context tokens attend
causally, block positions to the whole context and the whole block, nothing to padding. Queries
of different lengths go *packed*: the projections and MLPs run over the rows' real positions laid
end to end, and only attention runs in the padded layout (as the verifier's rows do,
:mod:`vskip.engine.models.attention`). The first step's keys and values of the context a row
lacked join that row's cache.
"""

from __future__ import annotations

from typing import Sequence

import torch

from .ragged import padding_groups


def draft_many(drafter, requests: Sequence[tuple[int, Sequence[int], int]], features: bool, sampling) -> list:
    """The blocks of ``requests`` (slot, seq, gamma), in their order. A row whose context the
    slot's cache lacks much more of than the others' (a prompt joining the batch) drafts in
    forwards of its own (:func:`~vskip.engine.models.ragged.padding_groups`)."""
    rows, slots = [], []
    for slot, seq, g in requests:
        drafter._enter(slot)
        rows.append(drafter.start_block(seq, g, features, sampling))  # cuts the slot's cache to what still serves
        drafter._leave(slot)
        slots.append(slot)
    for group in padding_groups([len(r.missing) + r.x.shape[1] for r in rows]):
        these, their = [rows[i] for i in group], [slots[i] for i in group]
        for s in range(drafter.steps):
            for row in these:
                drafter.step_input(row, s)
            for row, h in zip(these, block_hidden_many(drafter, these, their, first=s == 0)):
                drafter.step_output(row, s, h)
    return [row.finish() for row in rows]


def block_hidden_many(drafter, rows, slots, first: bool) -> list[torch.Tensor]:
    """Hidden states of each row's query [P + gamma, d] from one forward; at the first step the
    context a row lacked rides along and joins its slot's cache."""
    dev = drafter.device
    caches = [drafter._slots.get(slot, (None, []))[0] for slot in slots]
    past_len = [0 if c is None else c[0][0].shape[2] for c in caches]
    lead = [len(r.missing) if first else 0 for r in rows]  # context tokens riding along
    length = [c + r.x.shape[1] for c, r in zip(lead, rows)]
    B, T, P = len(rows), max(length), max(past_len)
    ids = torch.full((B, T), drafter.model.mask_id, dtype=torch.long, device=dev)
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
    if drafter.pack and B > 1 and sum(length) < B * T:  # the real positions alone, end to end
        row = torch.cat([torch.full((L,), i, dtype=torch.long) for i, L in enumerate(length)]).to(dev)
        col = torch.cat([torch.arange(L) for L in length]).to(dev)
        flat, present = drafter.model(ids[row, col][None], pos[row, col][None], past, mask,
                                      None if code is None else code[row, col][None], (row, col, B, T))
        h = flat.new_zeros((B, T, flat.shape[-1]))  # back in the padded layout the rows are read from
        h[row, col] = flat[0]
    else:
        h, present = drafter.model(ids, pos, past, mask, code)
    if first:
        for i, (slot, r, c, n) in enumerate(zip(slots, rows, lead, past_len)):
            if c:
                new = [(torch.cat([k[i : i + 1, :, :n], k[i : i + 1, :, P : P + c]], dim=2),
                        torch.cat([v[i : i + 1, :, :n], v[i : i + 1, :, P : P + c]], dim=2)) for k, v in present]
                ids_before = drafter._slots.get(slot, (None, []))[1]
                drafter._slots[slot] = (new, ids_before + list(r.missing))
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
