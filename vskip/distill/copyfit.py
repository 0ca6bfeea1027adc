"""Fitting the drafter's copy prior (:mod:`vskip.engine.models.copy`) on distillation data.

For sampled block starts in the verifier's own answers, the drafter sees the answer so far, and
every block position gives one sample: the match length behind the hint, the position, the
network's probability of the true next token at the first reveal step, and whether the hint was
that token. Each (length, position) bucket gets the maximum-likelihood mixture weight; a bucket
with too few samples takes its length row's pooled weight. Answers the drafter was trained on
would make the network look surer than it is, so fit on shards it did not see.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
from tqdm import tqdm

from ..engine.models.copy import (COPY_FILE, LENGTH_EDGES, OFFSET_EDGES, CopyPrior, bucket_index, copy_hint, fit_lambda,
                                  mixture_nll)
from ..engine.models.drafter import DiffusionDrafter
from ..files import read_json, write_json
from .offline import simulate_strict, strict_lengths
from .rows import load_rows, split
from .shards import read_shard, shard_rows


def load_answers(data_dir: Path, shards: Sequence[str]) -> list[tuple[np.ndarray, int]]:
    """(prompt + answer ids, prompt length) of every row with at least two answer tokens, except
    those of prompts flagged in ``leakage.json`` (:mod:`vskip.distill.leakage`)."""
    from .leakage import flagged_ids

    leaked = flagged_ids(Path(data_dir))
    rows = []
    for name in shards:
        path = Path(data_dir) / name
        if not path.exists():
            raise FileNotFoundError(f"shard {path} does not exist")
        for r in shard_rows(read_shard(path)):
            if len(r["completion"]) >= 2 and r["prompt_id"] not in leaked:
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
    lb = bucket_index(samples["length"], length_edges)
    ob = bucket_index(samples["offset"], offset_edges)
    lam = np.zeros((len(length_edges), len(offset_edges)))
    count = np.zeros_like(lam, dtype=np.int64)
    fit = lambda sel: fit_lambda(samples["p_target"][sel], samples["is_hint"][sel])
    for i in range(len(length_edges)):
        in_row = lb == i
        pooled = fit(in_row)
        for j in range(len(offset_edges)):
            sel = in_row & (ob == j)
            count[i, j] = int(sel.sum())
            lam[i, j] = fit(sel) if count[i, j] >= min_count else pooled
    return lam, count


def lam_of(samples: dict, prior: CopyPrior) -> np.ndarray:
    """The prior's mixture weight at every sample."""
    lam = np.asarray(prior.lam)
    return lam[bucket_index(samples["length"], prior.length_edges), bucket_index(samples["offset"], prior.offset_edges)]


def fit_summary(samples: dict, prior: CopyPrior) -> dict:
    """Held-out figures of a fitted prior: NLL and top-1 accuracy of the network alone and of the
    mixture (at the first reveal step, positions with a hint)."""
    p, h = samples["p_target"], samples["is_hint"].astype(bool)
    return {
        "samples": int(p.size),
        "nll_network": mixture_nll(p, h, 0.0),
        "nll_mixture": mixture_nll(p, h, lam_of(samples, prior)),
        "hint_right": float(h.mean()) if p.size else 0.0,
        "network_right": float(samples["net_right"].mean()) if p.size else 0.0,
    }


def evaluate_prior(drafter: DiffusionDrafter, prior: CopyPrior, rows, seed: int = 1, per_row: int = 6, gamma: int = 32,
                   strict_gammas: Sequence[int] = (8, 16, 32), replay_answers: int = 48, replay_tokens: int = 64,
                   progress: bool = True) -> dict:
    """Held-out figures of ``prior`` on ``rows``: NLL and top-1 of the first reveal step, and with
    and without the prior at each of ``strict_gammas`` the Strict SDD accepted length at random
    block starts and tokens per verifier call when the first ``replay_tokens`` of
    ``replay_answers`` answers are decoded again (:func:`simulate_strict`)."""
    saved = drafter.copy
    try:
        drafter.copy = None
        out = fit_summary(collect(drafter, rows, block_starts(rows, per_row, seed), gamma, progress=progress), prior)
        starts = block_starts(rows, 2, seed + 1)
        sub = [rows[i] for i in np.random.default_rng(seed + 2).permutation(len(rows))[:replay_answers]]
        strict, replay = {}, {}
        for g in strict_gammas:
            res = {}
            for name, p in (("network", None), ("mixture", prior)):
                drafter.copy = p
                res[name] = (strict_lengths(drafter, rows, starts, g, progress),
                             simulate_strict(drafter, sub, g, replay_tokens, progress) if sub else None)
            strict[str(g)] = {"blocks": len(starts), "mean_L_network": float(res["network"][0].mean()),
                              "mean_L_mixture": float(res["mixture"][0].mean())}
            if sub:
                replay[str(g)] = {"network": res["network"][1], "mixture": res["mixture"][1]}
        out["strict"] = strict
        if sub:
            out["replay"] = {"max_new_tokens": replay_tokens, **replay}
    finally:
        drafter.copy = saved
    return out


def fit_copy_prior(drafter: DiffusionDrafter, data_dir: Path, fit_shards: Sequence[str], eval_shards: Sequence[str] = (),
                   gamma: int = 32, per_row: int = 6, seed: int = 0, min_count: int = 50, progress: bool = True,
                   **evaluate) -> CopyPrior:
    """Fit the prior on ``fit_shards`` and, given ``eval_shards``, evaluate it there
    (:func:`evaluate_prior`, which takes the remaining keyword arguments)."""
    from .shards import data_fingerprint

    rows = load_answers(data_dir, fit_shards)
    ho = load_answers(data_dir, eval_shards) if eval_shards else []
    prior = fit_copy_prior_rows(drafter, rows, ho, gamma, per_row, seed, min_count, progress, **evaluate)
    prior.meta["fit_shards"] = data_fingerprint(data_dir, list(fit_shards))
    if eval_shards:
        prior.meta["eval_shards"] = data_fingerprint(data_dir, list(eval_shards))
    return prior


def holdout_answers(train_dir: Path) -> tuple[Path, list[tuple[np.ndarray, int]]]:
    """(data directory, held-out answers) of a drafter training run: the rows its ``--holdout``
    kept out of training, as :func:`vskip.distill.rows.split` chose them."""
    cfg = read_json(Path(train_dir) / "config.json", "training config")
    data_dir = Path(cfg["data"])
    _, ho = split(load_rows(data_dir), cfg["train"]["holdout"], cfg["train"]["seed"])
    rows = [(r, p) for r, p in zip(ho.rows, ho.prompt_lens)]
    if len(rows) < 2:
        raise ValueError(f"{train_dir} held out {len(rows)} rows: too few to fit and evaluate a copy prior")
    return data_dir, rows


def rows_sha256(rows) -> str:
    """One hash of answers [(ids, prompt length)], in order: names exactly which rows a prior was
    fitted or evaluated on, so a test can recompute the split and check it."""
    import hashlib

    h = hashlib.sha256()
    for ids, plen in rows:
        h.update(np.asarray(ids, dtype=np.int64).tobytes())
        h.update(int(plen).to_bytes(8, "little"))
    return h.hexdigest()


def fit_copy_prior_rows(drafter: DiffusionDrafter, rows, eval_rows=(), gamma: int = 32, per_row: int = 6,
                        seed: int = 0, min_count: int = 50, progress: bool = True, **evaluate) -> CopyPrior:
    """Fit the prior on answers ``rows`` [(ids, prompt length)] and evaluate it on ``eval_rows``."""
    t0 = time.time()
    saved, drafter.copy = drafter.copy, None
    try:
        samples = collect(drafter, rows, block_starts(rows, per_row, seed), gamma, progress=progress)
    finally:
        drafter.copy = saved
    lam, count = fit_table(samples, min_count=min_count)
    meta = {"fit_rows": len(rows), "gamma": gamma, "per_row": per_row, "seed": seed, "min_count": min_count,
            "counts": count.tolist()}
    prior = CopyPrior(lam.tolist(), meta=meta)
    meta["fit"] = fit_summary(samples, prior)
    if len(eval_rows):
        meta["eval_rows"] = len(eval_rows)
        meta["heldout"] = evaluate_prior(drafter, prior, eval_rows, seed=seed + 1, per_row=per_row, gamma=gamma,
                                         progress=progress, **evaluate)
    meta["seconds"] = round(time.time() - t0, 1)
    return prior


def write_copy_prior(prior: CopyPrior, path: Path) -> Path:
    """Write the prior (to ``path/copy_prior.json`` for a directory). Beside a drafter with a
    ``manifest.json``, the manifest records the prior's file, hash and held-out figures."""
    from ..engine.models.embedded import file_sha256

    path = Path(path)
    if path.is_dir():
        path = path / COPY_FILE
    write_json(path, prior.to_json())
    manifest = path.parent / "manifest.json"
    if path.name == COPY_FILE and manifest.exists():
        m = read_json(manifest, "drafter manifest")
        m["copy_prior"] = {"file": path.name, "sha256": file_sha256(path),
                           "fit_shards": prior.meta.get("fit_shards"), "holdout_of": prior.meta.get("holdout_of"),
                           "heldout": prior.meta.get("heldout")}
        write_json(manifest, m)
    return path
