"""The verifier's output head, computed so that its argmax is exact and does not depend on how
many positions a call scores.

On a CPU the float32 head (``[T, d] @ [d, V]``) is the costliest product of a small verifier,
and its kernel, cost and rounding change with ``T`` (the positions a call scores).
:class:`ExactHead` splits it in two:

1. a screening product in bfloat16 (half the bytes; native matrix units where the CPU has them)
   with a rigorous bound on its error per logit keeps every token that could be the argmax;
2. those few candidates, and the drafted token, are scored in float64 from the float32 hidden
   state and weights: the products of float32 numbers are exact in float64, and the sums err by
   about 1e-13, far below any float32 rounding.

The argmax is that of the exact product of the float32 hidden state and weights, whatever the
shape of the call: a verification and a greedy step agree wherever their hidden states do.
``draft_gap`` (Eq. 9) is exact as well; ``draft_rank`` (top-k, A.6) is exact below
:data:`RANK_EXACT` and a lower bound at or above it.

The bound. With unit roundoff ``u = 2**-8`` of bfloat16 and ``g = d * 2**-24`` for a float32
accumulation over ``d`` terms, a screened logit ``z~`` and the exact ``z`` of a token with weight
row ``w`` satisfy ``|z~ - z| <= (2u + u^2 + 2g) sum_i |h_i w_i| + 2u |z~|`` (rounding of both
factors, of the accumulation and of the bfloat16 result). With ``sum_i |h_i w_i| <= ||h|| ||w||``
and ``|z~| <= (1 + 3u) ||h|| ||w||`` this is at most ``c ||h|| ||w||``; :data:`SLACK` widens
``c`` further. A token whose upper bound ``z~ + c ||h|| ||w||`` falls below some token's lower
bound cannot be the argmax.
"""

from __future__ import annotations

import torch

from ..policy.acceptance import MAX_TOP_K

#: bfloat16 unit roundoff
U_BF16 = 2.0**-8
#: widens the bound beyond the analysis (the norms are computed in float32, too)
SLACK = 1.25
#: ranks of drafted tokens are exact below this; at or above it they are a lower bound
RANK_EXACT = MAX_TOP_K

#: model types whose logits are exactly ``lm_head(final hidden state)`` (no bias, scaling or
#: soft-capping), so the head may be computed outside the model
PLAIN_HEAD_TYPES = frozenset({"llama", "mistral", "qwen2", "qwen3"})


def plain_head(model) -> torch.nn.Linear | None:
    """The model's output projection when its logits are a plain linear map of the base model's
    last hidden state (and the model is float32), else None: the model's own forward is used."""
    cfg = model.config
    if getattr(cfg, "model_type", None) not in PLAIN_HEAD_TYPES or not hasattr(model, "model"):
        return None
    for key in ("final_logit_softcapping", "logit_scale", "logits_scaling"):
        if getattr(cfg, key, None) not in (None, 1, 1.0):
            return None
    head = model.get_output_embeddings()
    if not isinstance(head, torch.nn.Linear) or head.bias is not None or head.weight.dtype != torch.float32:
        return None
    return head


class ExactHead:
    """Argmax, drafted-token gap and rank of ``h @ W.T`` for float32 ``h`` [T, d] and ``W`` [V, d]."""

    def __init__(self, weight: torch.Tensor, screen: torch.dtype = torch.bfloat16):
        """``screen``: the dtype of the screening product, bfloat16 (cheap where a call scores few
        positions) or float32 (the same bytes as the head itself, but a bound so tight that
        hardly any token needs rescoring: the better choice when many positions are scored)."""
        assert weight.ndim == 2 and weight.dtype == torch.float32, (weight.shape, weight.dtype)
        if screen not in (torch.bfloat16, torch.float32):
            raise ValueError(f"screen dtype must be bfloat16 or float32, not {screen}")
        self.weight = weight.detach()  # [V, d], the model's own tensor
        self.device = self.weight.device
        self.screen = self.weight if screen == torch.float32 else self.weight.to(screen)  # [V, d]
        self.row_norm = self.weight.norm(dim=1)  # [V]
        self.max_norm = float(self.row_norm.max())
        # rounding of the factors and of the result: none when the screen is float32 itself
        u = U_BF16 if screen == torch.bfloat16 else 0.0
        g = self.weight.shape[1] * 2.0**-24
        self.c = SLACK * (2 * u + u**2 + 2 * g + 2 * u * (1 + 3 * u))

    def _exact(self, h: torch.Tensor, rows: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """float64 logits of tokens ``ids`` [n] for hidden rows ``rows`` [n] of ``h``."""
        return (self.weight[ids].double() * h[rows].double()).sum(-1)

    def _candidates(self, z, rad, lower, wide):
        """(rows, ids) of tokens whose upper bound reaches ``lower`` [T]: a coarse pass with the
        widest radius, then each survivor with its own bound. ``rad`` [T] = c ||h||."""
        rows, ids = (z >= (lower - wide)[:, None]).nonzero(as_tuple=True)
        keep = z[rows, ids] + rad[rows] * self.row_norm[ids] >= lower[rows]
        return rows[keep], ids[keep]

    @torch.inference_mode()
    def __call__(self, h: torch.Tensor, draft: torch.Tensor | None = None):
        """``h`` [T, d]; ``draft`` [T - 1] drafted tokens at the first T - 1 rows (or None).

        Returns (argmax [T] int64, gap [T - 1] float64, rank): ``rank()`` computes the ranks
        [T - 1] int64 when called (only top-k acceptance reads them)."""
        h = h.float()
        T = h.shape[0]
        z = torch.nn.functional.linear(h.to(self.screen.dtype), self.screen).float()  # [T, V] screened logits
        rad = self.c * h.norm(dim=1)  # [T]: the bound of token v is rad * ||w_v||
        top, arg = z.max(dim=1)
        lower = top - rad * self.row_norm[arg]  # the argmax's exact logit is at least this
        rows, ids = self._candidates(z, rad, lower, rad * (self.max_norm + self.row_norm[arg]))
        vals = self._exact(h, rows, ids)
        best = torch.full((T,), float("-inf"), dtype=torch.float64, device=h.device)
        best.scatter_reduce_(0, rows, vals, "amax")
        # the lowest id attaining the maximum, as torch.argmax picks it
        at_best = vals == best[rows]
        argmax = torch.full((T,), z.shape[1], dtype=torch.long, device=h.device)
        argmax.scatter_reduce_(0, rows[at_best], ids[at_best], "amin")
        if draft is None or T == 1:
            return argmax, torch.zeros(0, dtype=torch.float64), lambda: torch.zeros(0, dtype=torch.long)
        g = T - 1
        d = draft.to(h.device).long()
        r = torch.arange(g, device=h.device)
        zd = self._exact(h, r, d)  # [g] exact logit of each drafted token
        return argmax, zd - best[:g], lambda: self._rank(h[:g], z[:g], rad[:g], zd)

    def _rank(self, h, z, rad, zd) -> torch.Tensor:
        """Tokens whose exact logit is strictly above ``zd`` per row: those certainly above by
        their own bound are counted; the uncertain ones are scored exactly in rows where fewer
        than RANK_EXACT are certain."""
        b = rad[:, None] * self.row_norm[None]  # [g, V] per-token bounds
        rank = (z - b > zd[:, None]).sum(1)
        need = (rank < RANK_EXACT).nonzero()[:, 0]
        if need.numel():
            zs, bs, zds = z[need], b[need], zd[need][:, None]
            rows, ids = ((zs + bs > zds) & (zs - bs <= zds)).nonzero(as_tuple=True)
            if rows.numel():
                above = self._exact(h[need], rows, ids) > zd[need][rows]
                rank.index_add_(0, need[rows], above.long())
        return rank
