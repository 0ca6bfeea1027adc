"""A policy's points against a baseline's frontier read between its observed points (beyond the paper).

:func:`vskip.report.tables.versus_table` sets each point against the baseline's observed points
that agree at least as well: conservative, and silent wherever no observed point lies close. Here
the baseline's frontier is read by a straight line between neighbouring settings at the policy
point's own agreement: for calls, its Pareto points of agreement and relative calls; for speed,
its Pareto points of agreement and Eq. 7 speedup (a setting beaten on calls may still draft fewer
blocks). Strict SDD is the baseline's limit (a confidence threshold of 1 never skips), so the
frontier runs from the baseline's loosest setting to Strict SDD; outside that range nothing is
read. The interval is a paired percentile bootstrap over prompts that resamples every run at once
and rebuilds the frontier in each replicate, so it covers the noise of the baseline's points as
well as the policy's; the straight line between two settings is an assumption of the reading, not a
measurement, and the table names the two settings each point was read between.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ..engine.metrics import prompt_disagreement
from ..stats import percentile_interval, resample_indices
from .paired import Row, eq7_sums, per_prompt, unit_costs
from .tables import Table, in_main_grid, pareto_front

#: how each agreement axis is read from per-prompt sums, and whether more of it is better
_HIGHER_IS_BETTER = {"strict_token": True, "disagreement": False}


def _prompt_arrays(row: Row, ids: Sequence[str], costs) -> dict | None:
    """Per prompt of ``ids``: tokens, calls, StrictToken's numerator and denominator, disagreement
    and the Eq. 7 seconds at ``costs`` (c_D, c_V)."""
    pp = per_prompt(row.run, ids)
    d = prompt_disagreement(row.run, ids)
    t = eq7_sums(row.run, ids, *costs)
    if pp is None or d is None or t is None:
        return None
    return {"N": pp["N"], "calls": pp["calls"], "st_num": pp["st_num"], "st_den": pp["st_den"], "d": d, "T": t[1]}


def _agreement(a: dict, idx: np.ndarray, axis: str, exact: bool) -> np.ndarray:
    if axis == "disagreement":
        return a["d"][idx].mean(1)
    if exact:  # Strict SDD: 1 by definition
        return np.ones(idx.shape[0])
    den = a["st_den"][idx].sum(1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den > 0, a["st_num"][idx].sum(1) / np.where(den > 0, den, 1), 1.0)


def _read(points: list[tuple[float, float]], x: float, higher: bool, y_max: bool) -> tuple[float, tuple[int, int]]:
    """The frontier of ``points`` [(agreement, value)] (its Pareto points, more agreement better when
    ``higher``, more value better when ``y_max``) read at ``x`` by a straight line between its
    neighbours, and the indices of those two points; NaN outside its range."""
    keep = [i for i, k in enumerate(pareto_front([p[0] for p in points], [p[1] for p in points], higher, y_max)) if k]
    keep.sort(key=lambda i: points[i][0])
    fx = np.array([points[i][0] for i in keep])
    if not keep or x < fx[0] - 1e-12 or x > fx[-1] + 1e-12:
        return float("nan"), (-1, -1)
    hi = min(int(np.searchsorted(fx, x - 1e-12)), len(keep) - 1)
    lo = max(hi - 1, 0) if fx[hi] > x + 1e-12 else hi
    return float(np.interp(x, fx, [points[i][1] for i in keep])), (keep[lo], keep[hi])


def interpolated_table(name: str, rows: list[Row], k_min: int, policy: str = "prefix", baseline: str = "raw",
                       axis: str = "strict_token", n_boot: int = 10_000, seed: int = 0) -> Table | None:
    """Each ``policy`` point (main grid) against ``baseline``'s frontier read at its agreement on
    ``axis``: its relative calls and its Eq. 7 speedup over the frontier's there, with intervals."""
    higher = _HIGHER_IS_BETTER[axis]
    strict = next((r for r in rows if r.policy == "strict" and r.ref is r.run), None)
    if strict is None or not strict.run.samples:
        return None
    costs = unit_costs(strict.run)
    base = [r for r in rows if r.policy == baseline and in_main_grid(r, k_min) and r.run.samples]
    pts = [r for r in rows if r.policy == policy and in_main_grid(r, k_min) and r.run.samples]
    if costs is None or not base or not pts:
        return None
    out = []
    for r in pts:
        ids = sorted(set(r.run.ids) & set(strict.run.ids))
        arrays = {id(x): _prompt_arrays(x, ids, costs) for x in [r, strict]}
        if any(v is None for v in arrays.values()):
            continue
        peers = []  # raw runs holding every prompt of the point, each with its counts
        for b in base:
            a = _prompt_arrays(b, ids, costs) if set(ids) <= set(b.run.ids) else None
            if a is not None:
                arrays[id(b)] = a
                peers.append(b)
        if not peers:
            continue
        idx_all = np.vstack([np.arange(len(ids))[None], next(resample_indices(len(ids), n_boot, seed))])
        s = arrays[id(strict)]
        s_cpt = s["calls"][idx_all].sum(1) / s["N"][idx_all].sum(1)
        s_tps = s["N"][idx_all].sum(1) / s["T"][idx_all].sum(1)

        def figures(x: Row):
            a = arrays[id(x)]
            agree = _agreement(a, idx_all, axis, x.policy == "strict")
            calls = (a["calls"][idx_all].sum(1) / a["N"][idx_all].sum(1)) / s_cpt
            speed = (a["N"][idx_all].sum(1) / a["T"][idx_all].sum(1)) / s_tps
            return agree, calls, speed

        mine = figures(r)
        frontier = [*peers, strict]  # Strict SDD: the baseline's limit
        theirs = [figures(b) for b in frontier]
        calls_ratio, speed_ratio, read_calls, between = [], [], None, None
        for k in range(idx_all.shape[0]):
            c, pair = _read([(t[0][k], t[1][k]) for t in theirs], mine[0][k], higher, False)
            sp, _ = _read([(t[0][k], t[2][k]) for t in theirs], mine[0][k], higher, True)
            if k == 0:
                read_calls = c
                between = " – ".join(dict.fromkeys(frontier[i].name for i in pair)) if pair[0] >= 0 else None
            calls_ratio.append(mine[1][k] / c)
            speed_ratio.append(mine[2][k] / sp)
        calls_ratio, speed_ratio = np.array(calls_ratio), np.array(speed_ratio)
        inside = float(np.mean(np.isfinite(calls_ratio[1:])))
        if not np.isfinite(calls_ratio[0]):
            out.append([r.name, len(ids), mine[0][0], mine[1][0], None, None, None, None, inside,
                        f"outside {baseline}'s observed range"])
            continue
        c_ci, s_ci = percentile_interval(calls_ratio[1:]), percentile_interval(speed_ratio[1:])
        out.append([r.name, len(ids), mine[0][0], mine[1][0], between, read_calls, _fmt_ci(calls_ratio[0], c_ci),
                    _fmt_ci(speed_ratio[0], s_ci), inside, _words(c_ci, s_ci)])
    if not out:
        return None
    label = "StrictToken" if axis == "strict_token" else "disagreement"
    return Table(name, ["config", "prompts", label, "rel. calls", "read between", f"{baseline} frontier's rel. calls there",
                        "calls / frontier's [95% CI]", "Eq. 7 speedup / frontier's [95% CI]",
                        "replicates inside the range", "verdict"], out)


def _fmt_ci(point: float, ci) -> str:
    if ci is None:
        return f"{point:.4f}"
    return f"{point:.4f} [{ci[0]:.4f}, {ci[1]:.4f}]"


def _words(c_ci, s_ci) -> str:
    def word(ci, less, more):
        if ci is None:
            return "unresolved"
        return less if ci[1] < 1 else more if ci[0] > 1 else "unresolved"

    return f"calls: {word(c_ci, 'fewer', 'more')}; Eq. 7 speed: {word(s_ci, 'slower', 'faster')}"
