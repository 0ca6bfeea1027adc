"""The promised agreement of the prefix scheduler (beyond the paper): for each run of ``--policy
prefix --alpha A``, the disagreement it realised on its prompts, with the verifier calls and the
speed it bought against Strict SDD.

A prompt's realised disagreement is the share of its committed tokens that the verifier would not
have committed at that point: the drafted tokens each skip commits beyond the shadow verifier's
accepted length ``L`` (§3.2), over the prompt's generated tokens. Conformal risk control promises
that its mean over new prompts stays at or below ``alpha`` (:mod:`vskip.engine.policy.prefix`); the
interval is a percentile bootstrap over prompts. Like StrictToken (Eq. 1) it is measured against the
verifier in the run's own context, which after an earlier wrong skip is not Strict SDD's.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ..engine.metrics import disagreement_counts, disagreement_shares
from ..study.prefix.calibrate import promise_fields
from .paired import Row, eq7_sums, paired_ratio, ratio_ci, sample_sums, unit_costs

#: the fields of every entry of ``scheduler.json``
FIELDS = ("task", "gamma", "config", "predictor", "alpha", "realised_disagreement", "realised_disagreement_ci95",
          "realised_disagreement_upper95", "within_alpha", "verdict", "token_weighted_disagreement", "relative_calls", "relative_calls_ci95",
          "tokens_per_s_ratio", "tokens_per_s_ratio_ci95", "eq7_tokens_per_s_ratio", "eq7_tokens_per_s_ratio_ci95",
          "timed_tokens_per_s_ratio", "timed_tokens_per_s_ratio_ci95",
          "timed_prompts", "n_prompts", "skips", "wrong_skip_share", "mean_skip")
#: what a run without a repeated timing has in their place
_UNTIMED = {"timed_tokens_per_s_ratio": None, "timed_tokens_per_s_ratio_ci95": None, "timed_prompts": None}


def _timed(run_cfgs, timings) -> dict:
    from .timing import timed_fields

    return {**_UNTIMED, **(timed_fields(run_cfgs, timings) if timings else {})}


def skip_stats(runs_ids) -> dict:
    """Over the skipped rounds of (run, ids) pairs: how many, the share that commits a token beyond
    the shadow verifier's ``L``, and the mean skip length ``K``."""
    ks, wrong = [], 0
    for run, ids in runs_ids:
        keep = set(ids)
        for r in run.rounds:
            if r.task_id in keep and r.verified is False and (r.K or 0) > 0:
                ks.append(r.K)
                wrong += r.L is not None and r.L < r.K
    return {"skips": len(ks), "wrong_skip_share": wrong / len(ks) if ks else None,
            "mean_skip": float(np.mean(ks)) if ks else None}


def _realised(counts: tuple[np.ndarray, np.ndarray], alpha: float, n_boot: int, seed: int) -> dict:
    """The promised quantity (per-prompt shares averaged over prompts) against ``alpha``, and the
    token-weighted share beside it (not promised) from per-prompt (wrong, generated) ``counts``."""
    wrong, n = counts
    f = promise_fields(disagreement_shares(wrong, n), alpha, n_boot, seed)
    return {"realised_disagreement": f["mean"], "realised_disagreement_ci95": f["ci95"],
            "realised_disagreement_upper95": f["upper95"], "within_alpha": bool(f["mean"] <= alpha),
            "verdict": f["verdict"], "token_weighted_disagreement": float(wrong.sum() / n.sum()) if n.sum() else None}


def scheduler_entries(rows: Sequence[Row], n_boot: int = 10_000, seed: int = 0) -> list[dict]:
    """One entry per prefix run with a calibrated ``alpha`` and a Strict SDD reference, with the
    run's repeated timing where the report was given one (``Row.timed``)."""
    out = []
    for row in rows:
        alpha = ((row.run.run_cfg.get("policy") or {}).get("alpha"))
        if row.policy != "prefix" or alpha is None or row.ref is None or row.ref is row.run:
            continue
        ids = sorted(set(row.run.ids) & set(row.ref.ids))
        d = disagreement_counts(row.run, ids) if ids else None
        if d is None:
            continue
        iv = row.intervals or {}
        out.append({
            "task": row.run.task, "gamma": row.run.gamma, "config": row.name,
            "predictor": row.run.run_cfg.get("predictor"), "alpha": alpha,
            **_realised(d, alpha, n_boot, seed), "relative_calls": row.rel_calls,
            "relative_calls_ci95": iv.get("rel_calls"), "tokens_per_s_ratio": row.speedup,
            "tokens_per_s_ratio_ci95": (ratio_ci(row.run, row.ref, ids, "generated_tokens", "decode_seconds",
                                                n_boot, seed) or (None, None))[1],
            "eq7_tokens_per_s_ratio": row.eq7_speedup, "eq7_tokens_per_s_ratio_ci95": row.eq7_ci,
            **_UNTIMED, **row.timed, "n_prompts": len(ids), **skip_stats([(row.run, ids)]),
        })
    return sorted(out, key=lambda e: (str(e["task"]), e["gamma"] or 0, e["alpha"]))


def _pooled_eq7(parts, n_boot: int, seed: int) -> tuple:
    """tokens/s over Strict SDD's under Eq. 7 over the prompts of several tasks, each task's runs
    at its own Strict SDD run's c_D and c_V (:func:`vskip.report.paired.eq7_ratio`)."""
    a, b = [], []
    for r, ids in parts:
        c = unit_costs(r.ref) if r.ref.samples else None
        x = eq7_sums(r.run, ids, *c) if c else None
        y = eq7_sums(r.ref, ids, *c) if c else None
        if x is None or y is None:
            return None, None
        a.append(x)
        b.append(y)
    return paired_ratio(np.concatenate(a, axis=1), np.concatenate(b, axis=1), n_boot, seed)


def pooled_entries(rows: Sequence[Row], n_boot: int = 10_000, seed: int = 0, timings=()) -> list[dict]:
    """One entry per prefix configuration run on several tasks with the same predictor and gamma:
    the same quantities over the prompts of every task together, each against its own task's
    Strict SDD run. Where the model was calibrated on the prompts of those tasks pooled, this is
    the population the promise is about; a single task is a part of it that the promise does not
    cover by itself."""
    groups: dict[tuple, list[Row]] = {}
    for row in rows:
        cfg = row.run.run_cfg
        alpha = (cfg.get("policy") or {}).get("alpha")
        if row.policy != "prefix" or alpha is None or row.ref is None or row.ref is row.run:
            continue
        groups.setdefault((row.run.path.name, row.run.gamma, alpha, str(cfg.get("predictor"))), []).append(row)
    out = []
    for (name, gamma, alpha, _), rs in sorted(groups.items(), key=lambda kv: (kv[0][1] or 0, kv[0][2], kv[0][0], kv[0][3])):
        if len({r.run.task for r in rs}) != len(rs) or len(rs) < 2:
            continue
        parts = [(r, sorted(set(r.run.ids) & set(r.ref.ids))) for r in rs]
        ds = [disagreement_counts(r.run, ids) for r, ids in parts]
        if any(d is None for d in ds) or not all(ids for _, ids in parts):
            continue
        d = (np.concatenate([w for w, _ in ds]), np.concatenate([n for _, n in ds]))
        ratios = {}
        for key, num, den in (("calls", "verifier_calls", "generated_tokens"),
                              ("speed", "generated_tokens", "decode_seconds")):
            a = [sample_sums(r.run, ids, num, den) for r, ids in parts]
            b = [sample_sums(r.ref, ids, num, den) for r, ids in parts]
            ratios[key] = ((None, None) if any(x is None for x in a + b) else
                           paired_ratio(np.concatenate(a, axis=1), np.concatenate(b, axis=1), n_boot, seed))
        ratios["eq7"] = _pooled_eq7(parts, n_boot, seed)
        out.append({
            "task": "+".join(sorted(str(r.run.task) for r in rs)), "gamma": gamma, "config": name,
            "predictor": rs[0].run.run_cfg.get("predictor"), "alpha": alpha,
            **_realised(d, alpha, n_boot, seed), "relative_calls": ratios["calls"][0], "relative_calls_ci95": ratios["calls"][1],
            "tokens_per_s_ratio": ratios["speed"][0], "tokens_per_s_ratio_ci95": ratios["speed"][1],
            "eq7_tokens_per_s_ratio": ratios["eq7"][0], "eq7_tokens_per_s_ratio_ci95": ratios["eq7"][1],
            **_timed([r.run.run_cfg for r in rs], timings), "n_prompts": len(d[0]), **skip_stats([(r.run, ids) for r, ids in parts]),
        })
    return out
