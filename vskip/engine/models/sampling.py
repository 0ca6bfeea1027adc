"""The models' side of sampling (:mod:`vskip.engine.policy.sampling`), in torch on the model's device:
the warped distribution of each scored position. The draws themselves, and every acceptance
rule, belong to the policy; no random number is read here."""

from __future__ import annotations

import torch

from ..policy import Sampling  # the settings' data type only


def warped_probs(logits: torch.Tensor, s: Sampling) -> torch.Tensor:
    """Probabilities [n, V] (float64) after temperature, top-k and top-p, in that order (as
    transformers' warpers apply them); at least the most likely token always stays."""
    z = logits.double() / s.temperature
    V = z.shape[-1]
    if 0 < s.top_k < V:
        kth = z.topk(s.top_k, dim=-1).values[..., -1:]
        z = z.masked_fill(z < kth, float("-inf"))
    p = torch.softmax(z, dim=-1)
    if s.top_p < 1.0:
        sp, order = p.sort(dim=-1, descending=True)
        before = sp.cumsum(-1) - sp  # the mass of the tokens ranked above each one
        drop = torch.zeros_like(p, dtype=torch.bool).scatter(-1, order, before >= s.top_p)
        p = p.masked_fill(drop, 0.0)
        p = p / p.sum(-1, keepdim=True)
    return p


def to_vocabulary(logp: torch.Tensor, ids: torch.Tensor, size: int) -> torch.Tensor:
    """A head's log-probabilities ``logp`` [g, n] (its outputs are the token ids ``ids`` [n]) over
    the whole vocabulary of ``size`` ids [g, size] (float64; -inf for ids the head never proposes)."""
    full = torch.full((logp.shape[0], size), float("-inf"), dtype=torch.float64, device=logp.device)
    full[:, ids] = logp[:, : ids.shape[0]].double()
    return full
