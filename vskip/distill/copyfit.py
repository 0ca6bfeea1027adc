"""Fitting the drafter's copy prior (:mod:`vskip.models.copy`) on distillation data.

For sampled block starts in the verifier's own answers, the drafter sees the answer so far, and
every block position gives one sample: the match length behind the hint, the position, the
network's probability of the true next token at the first reveal step, and whether the hint was
that token. Each (length, position) bucket gets the maximum-likelihood mixture weight; a bucket
with too few samples takes its length row's pooled weight. Answers the drafter was trained on
would make the network look surer than it is, so fit on shards it did not see.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
from tqdm import tqdm

from ..models.copy import COPY_FILE, LENGTH_EDGES, OFFSET_EDGES, CopyPrior, _bucket, copy_hint, fit_lambda, mixture_nll
from ..models.drafter import DiffusionDrafter
from .generate import read_shard, shard_rows


def load_answers(data_dir: Path, shards: Sequence[str]) -> list[tuple[np.ndarray, int]]:
    """(prompt + answer ids, prompt length) of every row with at least two answer tokens."""
    rows = []
    for name in shards:
        path = Path(data_dir) / name
        if not path.exists():
            raise FileNotFoundError(f"shard {path} does not exist")
        for r in shard_rows(read_shard(path)):
            if len(r["completion"]) >= 2:
                rows.append((np.concatenate([r["prompt"], r["completion"]]).astype(np.int64), len(r["prompt"])))
    if not rows:
        raise ValueError(f"no answers in {data_dir} shards {list(shards)}")
    return rows


def block_starts(rows, per_row: int, seed: int) -> list[tuple[int, int]]:
    """(row, block start) pairs: up to ``per_row`` distinct starts inside each answer, ascending
    within a row so that the drafter's context cache grows instead of being rebuilt."""
    rng = np.random.default_rng(seed)
    out = []
    for i, (row, P) in enumerate(rows):
        n = len(row) - P - 1
        for b in sorted(rng.choice(np.arange(P + 1, len(row)), size=min(per_row, n), replace=False)):
            out.append((i, int(b)))
    return out


def collect(drafter: DiffusionDrafter, rows, starts, gamma: int, max_len: int = 32, progress: bool = True) -> dict:
    """Per block position: match length, position, p_D(true token), hint == true token, and
    whether the network's own top token was right."""
    cols = {k: [] for k in ("length", "offset", "p_target", "is_hint", "net_right")}
    for i, b in tqdm(starts, desc="copy prior: samples", unit="block", disable=not progress, file=sys.stderr):
        row = rows[i][0]
        g = min(gamma, len(row) - b)
        hint, length = copy_hint(row[:b], g, max_len)
        if length == 0:
            continue
        probs = drafter.first_step(row[:b].tolist(), g)
        target = torch.as_tensor(row[b : b + g], device=probs.device)
        col = drafter.head_column(target)
        p_t = torch.where(col >= 0, probs.gather(1, col.clamp(min=0)[:, None])[:, 0], 0.0)
        right = (col >= 0) & (probs.argmax(-1) == col)
        cols["length"].append(np.full(g, length))
        cols["offset"].append(np.arange(g))
        cols["p_target"].append(p_t.cpu().numpy())
        cols["is_hint"].append(hint == row[b : b + g])
        cols["net_right"].append(right.cpu().numpy())
    return {k: (np.concatenate(v) if v else np.zeros(0)) for k, v in cols.items()}


def fit_table(samples: dict, length_edges=LENGTH_EDGES, offset_edges=OFFSET_EDGES, min_count: int = 50):
    """The lam table and the sample count per bucket."""
    lb = _bucket(samples["length"], length_edges)
    ob = _bucket(samples["offset"], offset_edges)
    lam = np.zeros((len(length_edges), len(offset_edges)))
    count = np.zeros_like(lam, dtype=np.int64)
    for i in range(len(length_edges)):
        in_row = lb == i
        pooled = fit_lambda(samples["p_target"][in_row], samples["is_hint"][in_row])
        for j in range(len(offset_edges)):
            sel = in_row & (ob == j)
            count[i, j] = int(sel.sum())
            lam[i, j] = fit_lambda(samples["p_target"][sel], samples["is_hint"][sel]) if count[i, j] >= min_count else pooled
    return lam, count


def lam_of(samples: dict, prior: CopyPrior) -> np.ndarray:
    """The prior's weight at every sample."""
    lam = np.asarray(prior.lam)
    return lam[_bucket(samples["length"], prior.length_edges), _bucket(samples["offset"], prior.offset_edges)]


def summarize(samples: dict, prior: CopyPrior) -> dict:
    """Held-out figures of a fitted prior: NLL and top-1 accuracy of the network alone and of the
    mixture (at the first reveal step, positions with a hint)."""
    lam = lam_of(samples, prior)
    p, h = samples["p_target"], samples["is_hint"].astype(bool)
    return {
        "samples": int(p.size),
        "nll_network": mixture_nll(p, h, 0.0),
        "nll_mixture": mixture_nll(p, h, lam),
        "hint_right": float(h.mean()) if p.size else 0.0,
        "network_right": float(samples["net_right"].mean()) if p.size else 0.0,
    }


def strict_lengths(drafter: DiffusionDrafter, rows, starts, gamma: int, progress: bool = True) -> np.ndarray:
    """Offline Strict SDD accepted length of the drafter's full proposal (all reveal steps, with
    whatever copy prior it holds) at each start: the stored answers are the verifier's own greedy
    tokens, so L is the longest prefix of the draft equal to them."""
    Ls = []
    for i, b in tqdm(starts, desc="copy prior: strict L", unit="block", disable=not progress, file=sys.stderr):
        row = rows[i][0]
        g = min(gamma, len(row) - b)
        ok = drafter.propose(row[:b].tolist(), g).tokens == row[b : b + g]
        Ls.append(g if ok.all() else int(np.argmin(ok)))
    return np.asarray(Ls)


def fit_copy_prior(drafter: DiffusionDrafter, data_dir: Path, fit_shards: Sequence[str], eval_shards: Sequence[str] = (),
                   gamma: int = 32, per_row: int = 6, seed: int = 0, min_count: int = 50, progress: bool = True,
                   strict_gammas: Sequence[int] = (8, 16, 32)) -> CopyPrior:
    """Fit the prior on ``fit_shards``; on ``eval_shards`` report the held-out NLL and the offline
    Strict SDD accepted length with and without it at each of ``strict_gammas``."""
    t0 = time.time()
    saved, drafter.copy = drafter.copy, None
    try:
        rows = load_answers(data_dir, fit_shards)
        samples = collect(drafter, rows, block_starts(rows, per_row, seed), gamma, progress=progress)
        lam, count = fit_table(samples, min_count=min_count)
        from .train import data_fingerprint

        meta = {"fit_shards": data_fingerprint(data_dir, list(fit_shards)), "fit_rows": len(rows), "gamma": gamma, "per_row": per_row,
                "seed": seed, "min_count": min_count, "counts": count.tolist()}
        prior = CopyPrior(lam.tolist(), meta=meta)
        meta["fit"] = summarize(samples, prior)
        if eval_shards:
            ho = load_answers(data_dir, eval_shards)
            ho_samples = collect(drafter, ho, block_starts(ho, per_row, seed + 1), gamma, progress=progress)
            meta["eval_shards"] = data_fingerprint(data_dir, list(eval_shards))
            meta["eval_rows"] = len(ho)
            meta["heldout"] = summarize(ho_samples, prior)
            starts = block_starts(ho, 2, seed + 2)
            strict = {}
            for g in strict_gammas:
                drafter.copy = None
                net = strict_lengths(drafter, ho, starts, g, progress)
                drafter.copy = prior
                mix = strict_lengths(drafter, ho, starts, g, progress)
                strict[str(g)] = {"blocks": int(net.size), "mean_L_network": float(net.mean()),
                                  "mean_L_mixture": float(mix.mean())}
            drafter.copy = None
            meta["heldout"]["strict"] = strict
        meta["seconds"] = round(time.time() - t0, 1)
    finally:
        drafter.copy = saved
    return CopyPrior(lam.tolist(), meta=meta)


def write_copy_prior(prior: CopyPrior, path: Path) -> Path:
    path = Path(path)
    if path.is_dir():
        path = path / COPY_FILE
    path.write_text(json.dumps(prior.to_json(), indent=1))
    return path
