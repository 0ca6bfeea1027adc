"""Offline diagnostics of the confidence signals (§5.2, §5.3, A.1, A.2), from logged traces only.

- **Per-position BCE** (Figure 3) of each learned predictor on its held-out folds, against the
  position-only baseline: the positive rate at each position among the training folds of the
  same rotation (add-one smoothed, so an unseen outcome costs a finite loss).
- **Per-position AUROC** (Figure 6) of raw confidence and marginal survival for ``1{L >= j}``
  over all blocks, and of conditional survival on the at-risk set ``L >= j - 1``, reported only
  where a position has at least ten positives and ten negatives.
- **Permutation diagnostic** (Table 1): at each position, score–label pairs are permuted across
  blocks (raw and marginal: all blocks; conditional: blocks with ``L >= j - 1``), which keeps every
  positionwise metric and breaks the dependence within a block; the feasible prefix length (Eq. 3
  before ``k_min`` and staleness) is recomputed at the paper's fixed gates.
- **The prefix model** (beyond the paper, :mod:`vskip.study.prefix.model`), when one is trained beside the
  predictors: its held-out ``P(L >= k)`` is scored like marginal survival (labels ``1{L >= j}``;
  its feasible prefix at gates (0.90, 0.90) is the longest ``k`` with ``P(L >= k) >= 0.90``).
- **Proposition 1** (A.1): the two score processes of the proof, simulated with the traces'
  distribution of ``L``: identical positionwise joint distributions, prefix frequencies
  ``Pr(L >= K) rho`` and ``Pr(L >= K) rho^K``.

Everything except scoring the traces with a learned predictor is numpy.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Sequence

import numpy as np

from ..engine.metrics import auroc
from ..engine.policy import DEFAULT_GATES, feasible_prefix
from ..files import own_dir, save_figure, write_atomic
from ..files import write_csv as _write_csv
from .proposition1 import Prop1Result, proposition1
from .ranking import feasible_prefix_rows, ranking_diagnostics, reliability_md, top_md
from .traces import KINDS, TraceSet, survival_labels

#: Conditional AUROC is reported only with this many positives and negatives at a position (A.2).
MIN_CLASS = 10
_EPS = 1e-7


# ----------------------------------------------------------------------------- metrics


def bce(p: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Elementwise binary cross entropy (nats), probabilities clipped to [1e-7, 1 - 1e-7]."""
    p = np.clip(np.asarray(p, np.float64), _EPS, 1 - _EPS)
    y = np.asarray(y, np.float64)
    return -(y * np.log(p) + (1 - y) * np.log1p(-p))


@dataclass(frozen=True)
class PositionAUROC:
    auroc: np.ndarray  # float [gamma], NaN where not reported
    positives: np.ndarray  # int [gamma]
    negatives: np.ndarray  # int [gamma]


def positionwise_auroc(S: np.ndarray, Y: np.ndarray, mask: np.ndarray, min_class: int = 1) -> PositionAUROC:
    """AUROC at each position over the rows in ``mask``; NaN with fewer than ``min_class``
    examples of either class."""
    g = S.shape[1]
    a = np.full(g, np.nan)
    pos = np.zeros(g, np.int64)
    neg = np.zeros(g, np.int64)
    for j in range(g):
        m = mask[:, j]
        y = Y[m, j] > 0.5
        pos[j], neg[j] = int(y.sum()), int((~y).sum())
        if pos[j] >= max(min_class, 1) and neg[j] >= max(min_class, 1):
            a[j] = auroc(S[m, j], y)
    return PositionAUROC(a, pos, neg)


# ----------------------------------------------------------------------------- BCE (Figure 3)


def position_rates(Y: np.ndarray, mask: np.ndarray, smoothing: float = 1.0) -> np.ndarray:
    """Positive rate at each position over the rows in ``mask``: [gamma]. ``smoothing`` 1 adds
    one positive and one negative (ours: an outcome unseen in training costs a finite loss);
    0 is the empirical rate, as the paper's baseline (its BCE then relies on the clipping of
    :func:`bce`)."""
    n = mask.sum(0)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(n + 2 * smoothing > 0, ((Y * mask).sum(0) + smoothing) / (n + 2.0 * smoothing), 0.5)


@dataclass(frozen=True)
class BCEResult:
    kind: str
    model: np.ndarray  # [gamma] mean held-out BCE of the predictor
    baseline: np.ndarray  # [gamma] mean held-out BCE of the position-only baseline (add-one smoothed)
    n: np.ndarray  # [gamma] held-out examples
    model_mean: float  # pooled over every held-out example
    baseline_mean: float
    empirical: np.ndarray | None = None  # [gamma] the same with the empirical rate (the paper's)
    empirical_mean: float | None = None


def positionwise_bce(ts: TraceSet, kind: str, P: np.ndarray, rotations) -> BCEResult:
    """Held-out BCE of scores ``P`` [B, gamma] against the position-only baseline fitted, per
    rotation, on that rotation's training folds."""
    Y, M = survival_labels(kind, ts.L, ts.gamma)
    base = np.full(P.shape, np.nan)
    emp = np.full(P.shape, np.nan)
    for rot in rotations:
        test = ts.blocks_of(rot.test)
        train = ts.blocks_of(rot.train)
        if not test.any():
            continue
        if not train.any():
            raise ValueError(f"rotation {rot.index}: none of its training prompts is in the traces")
        base[test] = position_rates(Y[train], M[train])[None, :]
        emp[test] = position_rates(Y[train], M[train], smoothing=0.0)[None, :]
    M = M & ~np.isnan(base)
    losses = [bce(P, Y), bce(np.nan_to_num(base, nan=0.5), Y), bce(np.nan_to_num(emp, nan=0.5), Y)]
    n = M.sum(0)
    tot = max(int(M.sum()), 1)
    with np.errstate(invalid="ignore", divide="ignore"):
        per = [np.where(n > 0, (x * M).sum(0) / n, np.nan) for x in losses]
    pooled = [float((x * M).sum() / tot) for x in losses]
    return BCEResult(kind, per[0], per[1], n, pooled[0], pooled[1], per[2], pooled[2])


# ----------------------------------------------------------------------------- permutation (Table 1)


def permutation_pool(signal: str, L: np.ndarray, gamma: int) -> np.ndarray:
    """Boolean [B, gamma]: the blocks whose pairs are permuted at each position (raw and marginal:
    all; conditional: the at-risk blocks ``L >= j - 1``)."""
    if signal == "conditional":
        return survival_labels("conditional", L, gamma)[1]
    return np.ones((len(L), gamma), bool)


def permute_pairs(S: np.ndarray, Y: np.ndarray, pool: np.ndarray, rng: np.random.Generator):
    """At each position, permute the (score, label) pairs of the rows in ``pool`` across blocks;
    returns the permuted copies (rows outside the pool keep theirs)."""
    S2, Y2 = S.copy(), Y.copy()
    for j in range(S.shape[1]):
        idx = np.flatnonzero(pool[:, j])
        src = rng.permutation(idx)
        S2[idx, j] = S[src, j]
        Y2[idx, j] = Y[src, j]
    return S2, Y2


@dataclass(frozen=True)
class PermutationResult:
    signal: str
    eta_b: float
    eta_c: float
    n_blocks: int
    original: float
    permuted_mean: float
    permuted_std: float
    repetitions: int


def permutation_diagnostic(signal: str, S: np.ndarray, L: np.ndarray, eta_b: float, eta_c: float,
                           repetitions: int = 100, seed: int = 0) -> PermutationResult:
    """Mean feasible prefix length of the logged blocks before and after permuting score–label
    pairs within each position (§5.3)."""
    S = np.asarray(S, np.float64)
    gamma = S.shape[1]
    Y = survival_labels("marginal", L, gamma)[0]
    orig = feasible_prefix_rows(signal, S, eta_b, eta_c)
    # The vectorised form must agree with the policy's own feasible prefix.
    ref = np.array([feasible_prefix(signal, row, eta_b, eta_c) for row in S], dtype=np.int64)
    assert np.array_equal(orig, ref), "row-wise feasible prefix disagrees with vskip.engine.policy.feasible_prefix"
    pool = permutation_pool(signal, L, gamma)
    rng = np.random.default_rng(seed)
    means = np.array([feasible_prefix_rows(signal, permute_pairs(S, Y, pool, rng)[0], eta_b, eta_c).mean()
                      for _ in range(repetitions)]) if len(S) else np.zeros(0)
    return PermutationResult(signal, eta_b, eta_c, len(S), float(orig.mean()) if len(S) else float("nan"),
                             float(means.mean()) if means.size else float("nan"),
                             float(means.std()) if means.size else float("nan"), repetitions)


# ----------------------------------------------------------------------------- the report


@dataclass(frozen=True)
class DiagnoseConfig:
    """``repetitions`` of the permutation (100 in §5.3); fixed gates per signal (§5.3: raw
    (0.90, 0.93), marginal eta_m = 0.90, conditional (0.90, 0.90)); Proposition 1 parameters."""

    repetitions: int = 100
    seed: int = 0
    gates: dict = field(default_factory=lambda: dict(DEFAULT_GATES))
    rho: float = 0.7
    q_lo: float = 0.5
    q_hi: float = 0.95
    tau: float = 0.9
    prop1_samples: int = 200_000
    alphas: tuple = (0.01, 0.02, 0.05)  # the promised risks the prefix model's thresholds are replayed at

    def __post_init__(self):
        if self.repetitions < 1:
            raise ValueError(f"--repetitions must be >= 1, got {self.repetitions}")


def _md_table(headers: Sequence[str], rows: Sequence[Sequence]) -> str:
    fmt = lambda v: (f"{v:.4f}" if isinstance(v, float) and math.isfinite(v) else "–" if isinstance(v, float) else str(v))  # noqa: E731
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(fmt(v) for v in r) + " |" for r in rows]
    return "\n".join(lines)


def _lams(lams: Sequence) -> str:
    """Per-rotation thresholds as one cell: ``;``-separated, ``never`` where a rotation skips nothing."""
    return ";".join("never" if lam is None else f"{lam:g}" for lam in lams)


def _plots(out: Path, gamma: int, bces: dict, aurocs: dict, perms: list, p1: Prop1Result) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    files = []
    j = np.arange(1, gamma + 1)
    if bces:
        fig, axes = plt.subplots(1, len(bces), figsize=(5 * len(bces), 3.6), squeeze=False)
        for ax, (kind, r) in zip(axes[0], bces.items()):
            line, = ax.plot(j, r.model, marker=".", label=f"{kind} survival")
            ax.plot(j, r.baseline, ls="--", color=line.get_color(), label="position-only baseline")
            ax.set_xlabel("block position j")
            ax.set_ylabel("held-out BCE")
            ax.set_title(kind)
            ax.legend(fontsize=8)
        fig.tight_layout()
        save_figure(fig, out / "bce.png")
        plt.close(fig)
        files.append("bce.png")
    fig, ax = plt.subplots(figsize=(6, 3.6))
    for sig, r in aurocs.items():
        ax.plot(j, r.auroc, marker=".", label=sig)
    ax.axhline(0.5, color="grey", lw=0.8, ls=":")
    ax.set_xlabel("block position j")
    ax.set_ylabel("AUROC")
    ax.legend(fontsize=8)
    fig.tight_layout()
    save_figure(fig, out / "auroc.png")
    plt.close(fig)
    files.append("auroc.png")
    fig, ax = plt.subplots(figsize=(5, 3.4))
    x = np.arange(len(perms))
    ax.bar(x - 0.2, [p.original for p in perms], 0.4, label="original")
    ax.bar(x + 0.2, [p.permuted_mean for p in perms], 0.4, yerr=[p.permuted_std for p in perms], label="permuted")
    ax.set_xticks(x, [p.signal for p in perms])
    ax.set_ylabel("mean feasible prefix length")
    ax.legend(fontsize=8)
    fig.tight_layout()
    save_figure(fig, out / "permutation.png")
    plt.close(fig)
    files.append("permutation.png")
    fig, ax = plt.subplots(figsize=(6, 3.6))
    ax.plot(p1.K, p1.shared_closed, label="shared Z: Pr(L≥K)ρ")
    ax.plot(p1.K, p1.indep_closed, label="independent Z_j: Pr(L≥K)ρ^K")
    ax.plot(p1.K, p1.shared_sim, "o", ms=3, label="simulated (shared)")
    ax.plot(p1.K, p1.indep_sim, "s", ms=3, label="simulated (independent)")
    if np.any(p1.shared_closed > 0):
        ax.set_yscale("log")
    ax.set_xlabel("prefix length K")
    ax.set_ylabel("Pr(min_{j≤K} q_j ≥ τ)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    save_figure(fig, out / "proposition1.png")
    plt.close(fig)
    files.append("proposition1.png")
    return files


def diagnose(trace_dirs: Sequence[str | Path], out: str | Path, predictors: str | Path | None = None,
             cfg: DiagnoseConfig = DiagnoseConfig(), runtime=None) -> dict:
    """Run every diagnostic on the traces and write figures, tables and ``diagnose.md`` to
    ``out``; returns the summary also written as ``diagnose.json``."""
    from .traces import load_traces

    kinds = _load_predictors(predictors, runtime)
    need_hidden = any(fp.d_model for fp in kinds.values())
    ts = load_traces(trace_dirs, hidden=need_hidden)
    if ts.n_blocks == 0:
        raise ValueError("the traces hold no full-length block with a known L")
    g = ts.gamma
    for kind, fp in kinds.items():
        if fp.gamma != g:
            raise ValueError(f"the {kind} predictor was trained at gamma = {fp.gamma}, the traces have {g}")
    out = own_dir(out)

    scores = {"raw": ts.confidence.astype(np.float64)}
    for kind, fp in kinds.items():
        scores[kind] = fp.score_traces(ts)
    Ymarg = survival_labels("marginal", ts.L, g)[0]

    # Figure 3: per-position BCE against the position-only baseline.
    bces = {kind: replace(positionwise_bce(ts, _labels(kind), scores[kind], fp.rotations), kind=kind)
            for kind, fp in kinds.items()}
    # Figure 6: per-position AUROC.
    aurocs = {}
    for sig, S in scores.items():
        if sig == "conditional":
            Yc, Mc = survival_labels("conditional", ts.L, g)
            aurocs[sig] = positionwise_auroc(S, Yc, Mc, min_class=MIN_CLASS)
        else:
            aurocs[sig] = positionwise_auroc(S, Ymarg, np.ones_like(Ymarg, bool), min_class=MIN_CLASS)
    # Table 1: the permutation diagnostic at fixed gates.
    perms = [replace(permutation_diagnostic(_labels(sig), S, ts.L, *cfg.gates[_labels(sig)],
                                            repetitions=cfg.repetitions, seed=cfg.seed), signal=sig)
             for sig, S in scores.items()]
    # A.1: Proposition 1's construction with the traces' distribution of L.
    p1 = proposition1(ts.L, g, cfg.rho, cfg.q_lo, cfg.q_hi, cfg.tau, cfg.prop1_samples, cfg.seed)

    # Beyond the paper: the prefix model's calibrated thresholds replayed on these blocks.
    promise = []
    if "prefix" in kinds:
        from .prefix.calibrate import replay_promise

        promise = replay_promise(kinds["prefix"], ts, cfg.alphas, seed=cfg.seed)
        _write_promise(out / "promise.csv", promise)

    # Where a scheduler acts: raw confidence near its gates, and the top of each signal's ranking.
    reliability, top = ranking_diagnostics(out, ts, scores, seed=cfg.seed)

    perm_head, perm_rows = _write_tables(out, g, bces, aurocs, perms, p1)
    figures = _plots(out, g, bces, aurocs, perms, p1)

    # ---- summary
    mean_auc = {s: float(np.nanmean(r.auroc)) if np.isfinite(r.auroc).any() else float("nan") for s, r in aurocs.items()}
    summary = {
        "traces": [str(t) for t in trace_dirs], "predictors": None if predictors is None else str(predictors),
        "policies": list(ts.policies), "gamma": g, "prompts": len(ts.prompt_ids), "blocks": ts.n_blocks,
        "dropped_short_blocks": ts.dropped_short, "dropped_unknown_L_blocks": ts.dropped_unknown_L,
        "mean_L": float(ts.L.mean()),
        "bce": {k: {"model": r.model_mean, "position_baseline": r.baseline_mean,
                    "position_baseline_empirical": r.empirical_mean} for k, r in bces.items()},
        "auroc_mean_over_positions": mean_auc,
        "permutation": [asdict(p) for p in perms],
        "proposition1": {"rho": p1.rho, "q_lo": p1.q_lo, "q_hi": p1.q_hi, "tau": p1.tau, "n": p1.n,
                         "max_abs_z_shared": float(np.max(np.abs(p1.z_shared))),
                         "max_abs_z_indep": float(np.max(np.abs(p1.z_indep))),
                         "positionwise_max_diff": p1.positionwise_max_diff,
                         "positionwise_max_z": p1.positionwise_max_z},
        "promise": promise,
        "raw_confidence": reliability,
        "top_precision": top,
        "figures": figures,
    }
    write_atomic(out / "diagnose.json", json.dumps(summary, indent=1))
    write_atomic(out / "diagnose.md", _markdown(summary, ts, bces, aurocs, perm_head, perm_rows, p1, g))
    return summary


def _write_promise(path: Path, promise: list[dict]) -> None:
    _write_csv(path, ["alpha", "replayed_loss", "ci95_lo", "ci95_hi", "verdict", "n_prompts", "blocks",
                      "skipped_blocks", "wrong_skip_share", "mean_skip", "thresholds"],
               [[r["alpha"], r["replayed_loss"], *(r["replayed_loss_ci95"] or (None, None)), r["verdict"],
                 r["n_prompts"], r["blocks"], r["skipped_blocks"], r["wrong_skip_share"], r["mean_skip"],
                 _lams(r["thresholds"])] for r in promise])


def _labels(kind: str) -> str:
    """The survival labels a score is judged by: the prefix model's ``P(L >= k)`` is a marginal
    survival (monotone, so its running minimum is itself)."""
    return "marginal" if kind == "prefix" else kind


def _load_predictors(predictors, runtime) -> dict:
    """The fold predictors (marginal, conditional, prefix) found under ``predictors``; none without it."""
    kinds: dict = {}
    if predictors is None:
        return kinds
    from .predictor import load_predictor
    from .rotations import find_predictor_dir

    for kind in KINDS + ("prefix",):
        try:
            find_predictor_dir(predictors, kind)
        except ValueError:
            continue
        kinds[kind] = load_predictor(predictors, kind, runtime=runtime)
    if not kinds:
        raise ValueError(f"no marginal, conditional or prefix predictor under {predictors}")
    return kinds


def _write_tables(out: Path, g: int, bces: dict, aurocs: dict, perms, p1) -> tuple[list, list]:
    """bce.csv, auroc.csv, permutation.csv and proposition1.csv; returns Table 1's header and rows."""
    _write_csv(out / "bce.csv", ["kind", "position", "n", "bce_model", "bce_position_baseline",
                                 "bce_position_baseline_empirical"],
               [[k, j + 1, int(r.n[j]), float(r.model[j]), float(r.baseline[j]), float(r.empirical[j])]
                for k, r in bces.items() for j in range(g)])
    _write_csv(out / "auroc.csv", ["signal", "position", "positives", "negatives", "auroc"],
               [[s, j + 1, int(r.positives[j]), int(r.negatives[j]), float(r.auroc[j])] for s, r in aurocs.items() for j in range(g)])
    perm_rows = [[p.signal, p.eta_b, p.eta_c, p.n_blocks, p.original, p.permuted_mean, p.permuted_std, p.repetitions]
                 for p in perms]
    perm_head = ["signal", "eta_b", "eta_c", "blocks", "original", "permuted_mean", "permuted_std", "repetitions"]
    _write_csv(out / "permutation.csv", perm_head, perm_rows)
    p1_head = ["K", "Pr(L>=K)", "shared_closed", "shared_sim", "z_shared", "indep_closed", "indep_sim", "z_indep"]
    p1_rows = [[int(p1.K[i]), float(p1.p_L[i]), float(p1.shared_closed[i]), float(p1.shared_sim[i]), float(p1.z_shared[i]),
                float(p1.indep_closed[i]), float(p1.indep_sim[i]), float(p1.z_indep[i])] for i in range(g)]
    _write_csv(out / "proposition1.csv", p1_head, p1_rows)
    return perm_head, perm_rows


def _markdown(s: dict, ts: TraceSet, bces: dict, aurocs: dict, perm_head, perm_rows, p1: Prop1Result, g: int) -> str:
    parts = [
        "# Offline diagnostics",
        "",
        f"Traces: {', '.join(s['traces'])} (policies: {', '.join(str(p) for p in s['policies'])}); "
        f"gamma = {g}; {s['prompts']} prompts, {s['blocks']} full-length blocks with known L "
        f"(dropped: {s['dropped_short_blocks']} shortened, {s['dropped_unknown_L_blocks']} without L); "
        f"mean L = {s['mean_L']:.2f}.",
        f"Predictors: {s['predictors'] or 'none (raw confidence only)'}. Learned scores are held out: each "
        "prompt is scored by the rotation whose test fold holds it.",
        "",
    ]
    if bces:
        parts += ["## Per-position BCE (Figure 3)", "",
                  "Held-out BCE pooled over all labelled positions. The position-only baselines predict the "
                  "positive rate of each position on the rotation's training folds: add-one smoothed (ours), "
                  "and the empirical rate (the paper's; probabilities clipped to [1e-7, 1 - 1e-7]).", "",
                  _md_table(["kind", "predictor BCE", "position-only BCE (smoothed)", "position-only BCE (empirical)"],
                            [[k, r.model_mean, r.baseline_mean, r.empirical_mean] for k, r in bces.items()]),
                  "", "![BCE](bce.png)", "", "Per position: `bce.csv`.", ""]
    parts += ["## Per-position AUROC (Figure 6)", "",
              "Raw confidence, marginal survival and the prefix model's `P(L >= j)` against `1{L >= j}` on all "
              "blocks; conditional survival on "
              f"the at-risk set; for every signal only at positions with at least {MIN_CLASS} positives and "
              f"{MIN_CLASS} negatives (scikit-learn's roc_auc_score).", "",
              _md_table(["position"] + list(aurocs), [[j + 1] + [float(r.auroc[j]) for r in aurocs.values()] for j in range(g)]),
              "", "![AUROC](auroc.png)", "",
              *reliability_md(s["raw_confidence"]),
              *top_md(s["top_precision"]),
              "## Permutation diagnostic (Table 1)", "",
              "Mean feasible prefix length (Eq. 3, before `k_min` and staleness) of the logged blocks, before and "
              "after permuting score–label pairs across blocks at each position. Per-position BCE and AUROC are "
              "unchanged by construction.", "",
              _md_table(perm_head, perm_rows), "", "![permutation](permutation.png)", "",
              "## Proposition 1 (A.1)", "",
              f"Two score processes with rho = {p1.rho}, q_lo = {p1.q_lo}, q_hi = {p1.q_hi}, tau = {p1.tau}, "
              f"{p1.n} simulated blocks, L drawn from the traces. Positionwise joint distributions of "
              f"(1{{q_j >= tau}}, 1{{L >= j}}) differ by at most {p1.positionwise_max_diff:.4f} "
              f"(largest z = {p1.positionwise_max_z:.2f}); the prefix frequencies follow the closed forms "
              f"(largest |z| = {max(np.max(np.abs(p1.z_shared)), np.max(np.abs(p1.z_indep))):.2f}).", "",
              _md_table(["K", "Pr(L>=K)", "shared: closed", "shared: simulated", "independent: closed",
                         "independent: simulated"],
                        [[int(p1.K[i]), float(p1.p_L[i]), float(p1.shared_closed[i]), float(p1.shared_sim[i]),
                          float(p1.indep_closed[i]), float(p1.indep_sim[i])] for i in range(g)]),
              "", "![Proposition 1](proposition1.png)", ""]
    if s["promise"]:
        ci = lambda r: "–" if r["replayed_loss_ci95"] is None else "[{:.4f}, {:.4f}]".format(*r["replayed_loss_ci95"])  # noqa: E731
        parts += ["## The promise replayed (beyond the paper)", "",
                  "Each prompt's blocks replayed at the threshold its own rotation of the prefix model calibrated "
                  "for `alpha`: drafted tokens a skip of every block would commit beyond `L`, over `sum(L + 1)`, "
                  "averaged over prompts, with a 95% bootstrap interval over prompts (`docs/prefix.md`). On Strict "
                  "SDD traces this is what the promise bounds; on traces decoded while the scheduler skipped it "
                  "shows whether the thresholds hold on blocks drafted after skips. The policy online skips a "
                  "subset of these blocks (it waits for `K*`).", "",
                  _md_table(["alpha", "replayed loss", "95% interval", "verdict", "prompts", "blocks",
                             "skipped blocks", "wrong-skip share", "mean skip", "lam per rotation"],
                            [[r["alpha"], r["replayed_loss"], ci(r), r["verdict"], r["n_prompts"], r["blocks"],
                              r["skipped_blocks"], float("nan") if r["wrong_skip_share"] is None else r["wrong_skip_share"],
                              float("nan") if r["mean_skip"] is None else r["mean_skip"],
                              _lams(r["thresholds"]).replace(";", ", ")] for r in s["promise"]]),
                  "", "Rows: `promise.csv`.", ""]
    return "\n".join(parts)
