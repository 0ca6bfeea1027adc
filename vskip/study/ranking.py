"""Where a scheduler acts: the top of a score's ranking, near the gates.

Positionwise BCE and AUROC (``vskip diagnose``'s Figures 3 and 6) average over every block, while a
scheduler skips only the few blocks at the top of its score's ranking. Two diagnostics read that
top, beyond the paper: raw confidence's reliability near its gates (per bin of confidence, the share
of drafted tokens that agree; per bin of a block's smallest confidence over its first k positions,
the share of blocks with ``L >= k``; the most frequent values, which show a drafter whose
confidences sit on a few levels), and, at the blocks each raw-confidence gate would skip, the share
with ``L >= k`` among each learned signal's equally many best blocks.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np

from ..engine.policy.signals import local_scores, prefix_scores
from ..files import write_csv as _write_csv
from ..stats import resample_indices


def feasible_prefix_rows(signal: str, Q: np.ndarray, eta_b: float, eta_c: float) -> np.ndarray:
    """Row-wise :func:`vskip.engine.policy.feasible_prefix` for Q [B, gamma]: int [B]."""
    Q = np.asarray(Q, np.float64)
    ok = (local_scores(Q) >= eta_b) & (prefix_scores(signal, Q) >= eta_c)
    last = Q.shape[1] - np.argmax(ok[:, ::-1], axis=1)
    return np.where(ok.any(axis=1), last, 0)


def _md_table(headers: Sequence[str], rows: Sequence[Sequence]) -> str:
    from tabulate import tabulate

    return tabulate(rows, headers=list(headers), tablefmt="pipe", floatfmt=".4f", missingval="–")


#: the bins of raw confidence's reliability table: fine near 1, where a gate decides
RELIABILITY_EDGES = (0.0, 0.5, 0.8, 0.9, 0.95, 0.96, 0.97, 0.98, 0.99, 0.999, 1.0)


def raw_reliability(C: np.ndarray, L: np.ndarray, k: int = 3, edges: Sequence[float] = RELIABILITY_EDGES,
                    levels: int = 5, floor: float = 0.9) -> dict:
    """How raw confidence relates to agreement, where its gates act: per bin of confidence, the
    share of drafted positions and the share that agree with the verifier (``j < L``); per bin of
    the smallest confidence over the first ``k`` positions, the share of blocks and the share whose
    ``L >= k`` (what a skip of ``k`` tokens at a gate below the bin's floor commits); and the most
    frequent values at or above ``floor`` (to 4 digits), which show a drafter whose confidences sit
    on a few levels (a copy prior's) rather than spread out."""
    B, g = C.shape
    agree = np.arange(g)[None, :] < L[:, None]
    head = C[:, :min(k, g)].min(axis=1)
    rows = []
    for lo, hi in zip(edges[:-1], edges[1:]):
        m = (C >= lo) & ((C < hi) if hi < 1.0 else (C <= hi))
        b = (head >= lo) & ((head < hi) if hi < 1.0 else (head <= hi))
        rows.append({"lo": float(lo), "hi": float(hi), "positions": int(m.sum()), "share": float(m.mean()),
                     "agree": float(agree[m].mean()) if m.any() else None, "blocks": int(b.sum()),
                     "block_share": float(b.mean()), "L_ge_k": float((L[b] >= k).mean()) if b.any() else None})
    hi_vals = np.round(C[C >= floor].astype(np.float64), 4)
    top = []
    if hi_vals.size:
        vals, counts = np.unique(hi_vals, return_counts=True)
        rounded = np.round(C.astype(np.float64), 4)
        for i in np.argsort(-counts, kind="stable")[:levels]:
            m = rounded == vals[i]
            top.append({"value": float(vals[i]), "positions": int(counts[i]), "share": float(counts[i] / C.size),
                        "agree": float(agree[m].mean())})
    return {"k": int(k), "bins": rows, "levels": top, "floor": float(floor)}


#: raw confidence's gates whose skips the top-of-the-ranking table reads (the grid `full`'s raw points)
TOP_GATES = ((0.60, 0.50), (0.70, 0.70), (0.80, 0.85), (0.90, 0.93), (0.95, 0.97))


def survival_at(kind: str, S: np.ndarray, k: int) -> np.ndarray:
    """A learned signal's estimate of ``P(L >= k)`` per block: marginal survival's running minimum
    (its gate ``B_k``), conditional survival's product up to ``k``, the prefix model's own ``P(L >= k)``."""
    if kind == "conditional":
        return prefix_scores("conditional", S)[:, k - 1]
    if kind == "marginal":
        return local_scores(S)[:, k - 1]
    return np.asarray(S, np.float64)[:, k - 1]


def top_precision(scores: dict, L: np.ndarray, prompt: np.ndarray, k: int = 3, gates=TOP_GATES,
                  n_boot: int = 2000, seed: int = 0) -> list[dict]:
    """Where a scheduler acts, at the top of a ranking: for each of raw confidence's gate settings,
    the ``n`` blocks whose feasible prefix (Eq. 3) reaches ``k`` and the share of them with ``L >= k``;
    for every learned signal, the same share among its own ``n`` blocks of highest estimated
    ``P(L >= k)``; and the learned share minus raw's with a 95% bootstrap interval over prompts (the
    selections fixed, the prompts resampled). Positionwise AUROC averages over the whole ranking;
    this reads only its top, the blocks a skip would take."""
    L = np.asarray(L)
    P = int(prompt.max()) + 1 if len(prompt) else 0
    ok = L >= k
    idx = next(resample_indices(P, n_boot, seed)) if P else None

    def per_prompt(sel):
        return (np.bincount(prompt[sel], minlength=P).astype(np.float64),
                np.bincount(prompt[sel & ok], minlength=P).astype(np.float64))

    rows = []
    for eb, ec in gates:
        K = feasible_prefix_rows("raw", scores["raw"], eb, ec)
        sel = K >= k
        n = int(sel.sum())
        row = {"eta_b": eb, "eta_c": ec, "k": k, "blocks": n, "mean_K": float(K[sel].mean()) if n else None,
               "raw": float(ok[sel].mean()) if n else None, "learned": {}}
        rn, rh = per_prompt(sel)
        for kind, S in scores.items():
            if kind == "raw" or not n:
                continue
            top = np.zeros(len(L), bool)
            top[np.argsort(-survival_at(kind, S, k), kind="stable")[:n]] = True
            kn, kh = per_prompt(top)
            with np.errstate(invalid="ignore", divide="ignore"):
                diff = kh[idx].sum(1) / kn[idx].sum(1) - rh[idx].sum(1) / rn[idx].sum(1)
            diff = diff[np.isfinite(diff)]
            row["learned"][kind] = {"share": float(ok[top].mean()),
                                    "minus_raw": float(ok[top].mean() - ok[sel].mean()),
                                    "minus_raw_ci95": [float(np.percentile(diff, 2.5)), float(np.percentile(diff, 97.5))]
                                    if diff.size else None}
        rows.append(row)
    return rows


def reliability_md(r: dict) -> list[str]:
    k = r["k"]
    return ["## Raw confidence near its gates", "",
            "Per bin of raw confidence: the drafted positions it holds and the share that agree with the verifier "
            f"(`j < L`); per bin of the smallest confidence over a block's first {k} positions: the blocks it holds "
            f"and the share with `L >= {k}`, which a skip of {k} tokens at a gate below the bin would commit. "
            "Rows: `raw_confidence.csv`.", "",
            _md_table(["confidence", "positions", "share", "agree", f"blocks (first {k})", "block share",
                       f"L >= {k}"],
                      [[f"[{b['lo']:g}, {b['hi']:g}{']' if b['hi'] >= 1 else ')'}", b["positions"], b["share"],
                        b["agree"], b["blocks"], b["block_share"], b["L_ge_k"]] for b in r["bins"]]),
            "", f"The most frequent values at or above {r['floor']:g} (to 4 digits):", "",
            _md_table(["value", "positions", "share of all positions", "agree"],
                      [[v["value"], v["positions"], v["share"], v["agree"]] for v in r["levels"]]), ""]


def top_md(top: list[dict]) -> list[str]:
    if not top:
        return []
    kinds = list(top[0]["learned"])
    k = top[0]["k"]
    fmt = lambda v: "–" if v is None else (f"{v['share']:.4f} ({v['minus_raw']:+.4f} [{v['minus_raw_ci95'][0]:+.4f}, "  # noqa: E731
                                           f"{v['minus_raw_ci95'][1]:+.4f}])" if v["minus_raw_ci95"] else f"{v['share']:.4f}")
    return ["## The top of the ranking, where a scheduler skips (beyond the paper)", "",
            f"For each raw-confidence gate: the blocks whose feasible prefix (Eq. 3) reaches {k}, their mean feasible "
            f"prefix, and the share with `L >= {k}`; for each learned signal, that share among its own equally many "
            f"blocks of highest estimated `P(L >= {k})` (marginal: running minimum; conditional: product), and its "
            "difference from raw's with a 95% bootstrap interval over prompts. Positionwise AUROC averages over the "
            "whole ranking; a scheduler only uses its top. Rows: `top_precision.csv`.", "",
            _md_table(["raw gates", "blocks", "mean K (raw)", f"raw: L >= {k}"] + [f"{x}: L >= {k} (− raw)" for x in kinds],
                      [[f"({r['eta_b']:.2f}, {r['eta_c']:.2f})", r["blocks"],
                        r["mean_K"], r["raw"]]
                       + [fmt(r["learned"].get(x)) for x in kinds] for r in top]), ""]


def ranking_diagnostics(out: Path, ts, scores: dict, seed: int = 0) -> tuple[dict, list[dict]]:
    """Both diagnostics on a trace set's blocks: ``raw_confidence.csv`` and ``top_precision.csv``
    under ``out``; returns (reliability, top rows) for ``diagnose.json``."""
    reliability = raw_reliability(ts.confidence, ts.L)
    cols = ("lo", "hi", "positions", "share", "agree", "blocks", "block_share", "L_ge_k")
    _write_csv(out / "raw_confidence.csv", list(cols), [[r[c] for c in cols] for r in reliability["bins"]])
    top = top_precision(scores, ts.L, ts.prompt, seed=seed) if len(scores) > 1 and ts.gamma >= 3 else []
    _write_csv(out / "top_precision.csv", ["eta_b", "eta_c", "k", "blocks", "mean_K", "signal", "share_L_ge_k",
                                            "minus_raw", "ci95_lo", "ci95_hi"],
               [[r["eta_b"], r["eta_c"], r["k"], r["blocks"], r["mean_K"], "raw", r["raw"], None, None, None]
                for r in top] +
               [[r["eta_b"], r["eta_c"], r["k"], r["blocks"], r["mean_K"], kind, v["share"], v["minus_raw"],
                 *(v["minus_raw_ci95"] or (None, None))] for r in top for kind, v in r["learned"].items()])
    return reliability, top
