"""The verifier's draws under sampling (:mod:`vskip.engine.policy.sampling`), in torch on the model's
device: the warped distribution of each scored position and its inverse-CDF draw."""

from __future__ import annotations

import numpy as np
import torch

from ..policy.sampling import Draw, Sampling, inverse_cdf, speculative_draws


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


def draw_tokens(logits: torch.Tensor, draw: Draw) -> np.ndarray:
    """The token of each row of ``logits`` [n, V] drawn with ``draw.u`` [n]: the first token id
    whose cumulative probability (in id order) exceeds u. Under the speculative rule
    (``draw.q`` given), the tokens of :func:`vskip.engine.policy.sampling.speculative_draws`."""
    p = warped_probs(logits, draw.sampling)
    if draw.speculative:
        return speculative_draws(p.cpu().numpy(), draw)
    cdf = p.cumsum(-1)
    u = torch.as_tensor(np.asarray(draw.u, dtype=np.float64), device=p.device)[:, None]
    idx = torch.searchsorted(cdf, u * cdf[:, -1:], right=True)[:, 0]
    last = (p > 0).long().cumsum(-1).argmax(-1)  # the last id with mass: rounding at the top end
    return torch.minimum(idx, last).cpu().numpy().astype(np.int64)


def sample_draft(logp: torch.Tensor, draw: Draw) -> tuple[np.ndarray, np.ndarray]:
    """A drafter's sampled block: from its log-probabilities ``logp`` [g, V] over the verifier's
    vocabulary (-inf for ids it never proposes), the tokens drawn with ``draw.u`` [g] and the
    warped distributions q [g, V] (float64 numpy) they were drawn from. The drafter's confidence
    stays its largest probability at each position, a function of the context alone, so that
    trimming a block by it keeps the speculative rule exact."""
    q = warped_probs(logp, draw.sampling).cpu().numpy()
    return np.array([inverse_cdf(row, u) for row, u in zip(q, draw.u)], dtype=np.int64), q
