"""A prefix-level survival model: one network over the whole block that predicts ``P(L >= k)`` for
every prefix length ``k`` at once, monotone in ``k`` by construction, trained on the block's
accepted length (beyond the paper; see :mod:`vskip.policy.prefix`).

The paper's learned signals score positions one at a time: marginal survival is trained on
``1{L >= j}``, and conditional survival on ``1{L >= j}`` among the blocks with ``L >= j - 1``. This
model sees the block as a sequence instead:
- each position's inputs (the A.7 features, standardised on the training folds) go through a small
  MLP;
- a GRU reads the positions left to right, so position ``j``'s hazard depends on every position up
  to ``j``;
- the hazards ``h_j = P(L = j - 1 | L >= j - 1)`` give ``S_k = prod_{j <= k} (1 - h_j)``.

It is trained with the likelihood of each block's ``L`` (:func:`vskip.policy.prefix.survival_nll`
in torch). The folds follow the predictors' protocol (:func:`vskip.traces.folds`): a prompt is
scored only by the rotation whose test fold holds it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch
from torch import nn


class PrefixSurvivalNet(nn.Module):
    def __init__(self, n_in: int, hidden: int = 64):
        super().__init__()
        self.inp = nn.Sequential(nn.Linear(n_in, hidden), nn.GELU(), nn.Linear(hidden, hidden), nn.GELU())
        self.gru = nn.GRU(hidden, hidden, batch_first=True)
        self.out = nn.Linear(hidden, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Hazard logits [B, gamma] of standardised inputs ``x`` [B, gamma, n_in]."""
        z, _ = self.gru(self.inp(x))
        return self.out(z).squeeze(-1)


def survival_nll_torch(logits: torch.Tensor, L: torch.Tensor) -> torch.Tensor:
    """Mean negative log-likelihood of accepted lengths ``L`` [B] under hazard logits [B, gamma]:
    the first ``L`` positions survive (``log(1 - h) = logsigmoid(-z)``), position ``L + 1`` fails
    (``log h = logsigmoid(z)``; nothing when ``L == gamma``)."""
    B, g = logits.shape
    j = torch.arange(g, device=logits.device)[None, :]
    alive = (j < L[:, None]).float() * nn.functional.logsigmoid(-logits)
    at = torch.clamp(L, max=g - 1)
    fail = torch.where(L < g, nn.functional.logsigmoid(logits[torch.arange(B), at]), torch.zeros_like(L, dtype=logits.dtype))
    return -(alive.sum(1) + fail).mean()


@dataclass(frozen=True)
class PrefixTrainConfig:
    epochs: int = 30
    hidden: int = 64
    lr: float = 3e-3
    batch_size: int = 256
    seed: int = 0

    def __post_init__(self):
        if self.epochs < 1 or self.hidden < 1 or self.batch_size < 1 or not self.lr > 0:
            raise ValueError("epochs, hidden and batch_size must be >= 1 and lr > 0")


def train_prefix_model(X: np.ndarray, L: np.ndarray, cfg: PrefixTrainConfig = PrefixTrainConfig(),
                       X_val: np.ndarray | None = None, L_val: np.ndarray | None = None):
    """Fit a :class:`PrefixSurvivalNet` on blocks ``X`` [B, gamma, F] with accepted lengths ``L``
    [B]; keep the epoch with the lowest validation likelihood when a validation set is given.
    Returns (model, mean, std) for :func:`survival`."""
    torch.manual_seed(cfg.seed)
    rng = np.random.default_rng(cfg.seed)
    mean = X.reshape(-1, X.shape[-1]).mean(0)
    std = X.reshape(-1, X.shape[-1]).std(0)
    std[std < 1e-6] = 1.0
    model = PrefixSurvivalNet(X.shape[-1], cfg.hidden)
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    xt = torch.from_numpy(((X - mean) / std).astype(np.float32))
    lt = torch.from_numpy(np.asarray(L, np.int64))
    best, best_state = float("inf"), None
    for _ in range(cfg.epochs):
        model.train()
        order = rng.permutation(len(xt))
        for i in range(0, len(order), cfg.batch_size):
            idx = torch.from_numpy(order[i : i + cfg.batch_size])
            loss = survival_nll_torch(model(xt[idx]), lt[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
        if X_val is not None and len(X_val):
            v = float(nll(model, mean, std, X_val, L_val))
            if v < best:
                best, best_state = v, {k: t.clone() for k, t in model.state_dict().items()}
    if best_state is not None:
        model.load_state_dict(best_state)
    return model.eval(), mean, std


@torch.inference_mode()
def survival(model: PrefixSurvivalNet, mean: np.ndarray, std: np.ndarray, X: np.ndarray) -> np.ndarray:
    """``P(L >= k)`` [B, gamma] of blocks ``X``: non-increasing in ``k``."""
    z = model(torch.from_numpy(((X - mean) / std).astype(np.float32)))
    return torch.cumprod(torch.sigmoid(-z), dim=1).double().numpy()


@torch.inference_mode()
def nll(model: PrefixSurvivalNet, mean: np.ndarray, std: np.ndarray, X: np.ndarray, L: np.ndarray) -> float:
    z = model(torch.from_numpy(((X - mean) / std).astype(np.float32)))
    return float(survival_nll_torch(z, torch.from_numpy(np.asarray(L, np.int64))))


def held_out_survival(X: np.ndarray, L: np.ndarray, prompt: np.ndarray, prompt_ids: Sequence[str],
                      rotations, cfg: PrefixTrainConfig = PrefixTrainConfig()) -> np.ndarray:
    """``P(L >= k)`` of every block, each scored by the model of the rotation whose test fold
    holds its prompt (trained on that rotation's training folds, the epoch chosen on its
    validation fold). ``prompt`` [B]: each block's index into ``prompt_ids``."""
    S = np.full(X.shape[:2], np.nan)
    index = {pid: i for i, pid in enumerate(prompt_ids)}
    for rot in rotations:
        part = {name: np.isin(prompt, [index[p] for p in getattr(rot, name) if p in index])
                for name in ("train", "val", "test")}
        if not part["test"].any():
            continue
        model, mean, std = train_prefix_model(X[part["train"]], L[part["train"]], cfg,
                                              X[part["val"]], L[part["val"]])
        S[part["test"]] = survival(model, mean, std, X[part["test"]])
    return S
