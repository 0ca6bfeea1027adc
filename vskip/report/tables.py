"""Frontiers and the tables of the report (runs, gates, periodic, matched quality, Eq. 8, k_min, Table 4)."""

from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from ..engine.policy import DEFAULT_GATES, SIGNALS, break_even_length
from ..files import write_atomic
from .paired import Row, eq7_ratio, metrics_of, ratio_ci
from .runs import FRONTIER_METHODS, LABELS

# --------------------------------------------------------------------------- frontiers


def pareto_front(xs: Sequence[float], ys: Sequence[float], x_max: bool = True, y_max: bool = True) -> list[bool]:
    """Which points no other point dominates (as good in both coordinates, better in one).
    ``x_max``/``y_max``: whether larger is better on that axis."""
    sx, sy = (1 if x_max else -1), (1 if y_max else -1)
    pts = [(sx * x, sy * y) for x, y in zip(xs, ys)]
    out = []
    for i, (x, y) in enumerate(pts):
        dominated = any(a >= x and b >= y and (a > x or b > y) for j, (a, b) in enumerate(pts) if j != i)
        out.append(not dominated)
    return out


def frontier_method(row: Row) -> str | None:
    """The frontier a run belongs to: its policy, with the prefix scheduler split by what it reads
    (``prefix-model``: its trained survival model; ``prefix``: the confidences' product)."""
    if row.policy == "prefix" and row.p("survival") == "model":
        return "prefix-model"
    return row.policy


def in_main_grid(row: Row, k_min: int) -> bool:
    """Frontier members: lenience, top-k, periodic, the prefix scheduler (it has no ``k_min``), and
    signal runs at the main ``k_min`` with both gates on (the ``k_min`` diagnostic and the gate
    ablation are reported apart)."""
    m = row.policy
    if m in ("lenience", "topk", "periodic", "prefix"):
        return True
    if m in SIGNALS:
        eb, ec = row.p("eta_b"), row.p("eta_c")
        return row.p("k_min") in (k_min, None) and (eb is None or eb > 0) and (ec is None or ec > 0)
    return False


# --------------------------------------------------------------------------- tables


def _fmt(v) -> str:
    if v is None:
        return "–"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        if math.isnan(v):
            return "–"
        return f"{v:.4f}" if abs(v) < 10 else f"{v:.2f}"
    return str(v)


@dataclass
class Table:
    name: str
    columns: list[str]
    rows: list[list]

    def markdown(self) -> str:
        head = "| " + " | ".join(self.columns) + " |"
        sep = "|" + "|".join("---" for _ in self.columns) + "|"
        body = ["| " + " | ".join(_fmt(v).replace("|", "\\|") for v in r) + " |" for r in self.rows]
        return "\n".join([head, sep, *body])

    def write(self, out: Path) -> None:
        write_atomic(out / f"{self.name}.md", self.markdown() + "\n")
        buf = io.StringIO(newline="")
        w = csv.writer(buf)
        w.writerow(self.columns)
        for r in self.rows:
            w.writerow(["" if v is None else v for v in r])
        write_atomic(out / f"{self.name}.csv", buf.getvalue())


def _params_str(row: Row) -> str:
    return ", ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.run.params.items()
                     if v is not None)


def _ci(row: Row):
    if row.delta is None:
        return None
    return f"{row.delta:+.4f} [{row.ci[0]:+.4f}, {row.ci[1]:+.4f}]"


def runs_table(name: str, rows: list[Row]) -> Table:
    cols = ["config", "method", "parameters", "prompts", "pass@1", "Δpass@1 vs strict [95% CI]", "tokens/s",
            "speedup", "rel. calls", "rel. blocks", "StrictToken", "FullPrefix", "disagreement", "skipped rounds",
            "mean skip", "wrong-skip share"]
    from .scheduler import skip_stats

    out = []
    for r in rows:
        sk = skip_stats([(r.run, r.run.ids)]) if r.run.rounds else {}
        out.append([r.name, LABELS.get(r.policy, r.policy), _params_str(r), r.m.n, r.m.pass_at_1, _ci(r),
                    r.m.tokens_per_s, r.speedup, r.rel_calls, r.rel_blocks, r.m.strict_token, r.m.full_prefix,
                    r.disagreement, r.m.skipped_rounds, sk.get("mean_skip"), sk.get("wrong_skip_share")])
    return Table(name, cols, out)


def _interval(point, ci) -> str | None:
    if point is None or ci is None:
        return None
    return f"{point:.4f} [{ci[0]:.4f}, {ci[1]:.4f}]"


def intervals_table(name: str, rows: list[Row]) -> Table | None:
    """Every comparison with its uncertainty: paired bootstrap intervals of the ratios and the
    agreement, the share of outputs equal to ``ar`` (exact), and a bound on |Δpass@1|."""
    rs = [r for r in rows if r.intervals]
    if not rs:
        return None
    cols = ["config", "prompts", "rel. calls [95% CI]", "rel. blocks [95% CI]", "speedup, Eq. 7 [95% CI]",
            "StrictToken [95% CI]", "FullPrefix [95% CI]", "= ar", "= strict", "Δpass@1 [95% CI]", "discordant",
            "|Δpass@1| ≤ (95%)"]
    out = []
    for r in rs:
        iv = r.intervals
        eq = f"{r.equal_ar[0]}/{r.equal_ar[1]}" if r.equal_ar else None
        eq_s = f"{r.equal_strict[0]}/{r.equal_strict[1]}" if r.equal_strict else None
        disc = f"{iv['discordant']}/{iv['pass_scored']}" if "discordant" in iv else None
        out.append([r.name, iv["prompts"], _interval(r.rel_calls, iv.get("rel_calls")),
                    _interval(r.rel_blocks, iv.get("rel_blocks")), _interval(r.eq7_speedup, r.eq7_ci),
                    _interval(r.m.strict_token, iv.get("strict_token")),
                    _interval(r.m.full_prefix, iv.get("full_prefix")), eq, eq_s, _ci(r), disc,
                    iv.get("delta_pass_bound")])
    return Table(name, cols, out)


def timed_table(name: str, rows: list[Row]) -> Table | None:
    """Speed three ways for every run whose configuration a repeated timing holds
    (``vskip report --timing``): the run's single timing against Strict SDD's, Eq. 7 at Strict
    SDD's costs, and the repeated timing (interleaved with Strict SDD, on the prompts it timed),
    with each repeat's ratio: the spread the single timing does not show."""
    rs = [r for r in rows if r.timed]
    if not rs:
        return None
    out = []
    for r in rs:
        by = r.timed.get("timed_by_repeat")
        out.append([r.name, r.speedup, _interval(r.eq7_speedup, r.eq7_ci), _interval(r.timed_ratio, r.timed_ci),
                    ", ".join(f"{x:.4f}" for x in by) if by else None, r.timed.get("timed_prompts"), r.rel_calls,
                    r.rel_blocks])
    return Table(name, ["config", "speedup, single timing", "speedup, Eq. 7 [95% CI]", "speedup, timed [95% CI]",
                        "timed, by repeat", "prompts timed", "rel. calls", "rel. blocks"], out)


def gate_table(name: str, rows: list[Row]) -> Table | None:
    """Table 2: signal runs with both gates on next to the variants that drop one gate (threshold
    0), for the paper's fixed settings or wherever both variants were run."""
    variant = {"raw": "Geometric only", "conditional": "Product only", "marginal": "Prefix only"}
    out = []
    for full in rows:
        if full.policy not in SIGNALS or not (full.p("eta_b") and full.p("eta_c")):
            continue
        same = [r for r in rows if r.policy == full.policy and r.p("k_min") == full.p("k_min")
                and r.p("s_max") == full.p("s_max")]
        local = [r for r in same if r.p("eta_b") == full.p("eta_b") and r.p("eta_c") == 0]
        other = [r for r in same if r.p("eta_b") == 0 and r.p("eta_c") == full.p("eta_c")]
        at_default = (full.p("eta_b"), full.p("eta_c")) == DEFAULT_GATES[full.policy]
        if not (local and other) and not (at_default and (local or other)):
            continue  # a local-only run is the variant of one full setting, not of every eta_c
        variants = [("Full", full)] + [("Local only", x) for x in local] + [(variant[full.policy], x) for x in other]
        for label, r in variants:
            out.append([LABELS[full.policy], label, r.name, r.m.pass_at_1, r.m.tokens_per_s, r.rel_calls, r.rel_blocks])
    if not out:
        return None
    return Table(name, ["signal", "policy", "config", "pass@1", "tokens/s", "rel. calls", "rel. blocks"], out)


def periodic_table(name: str, rows: list[Row], k_min: int) -> Table | None:
    """Table 3, with the run of the raw-confidence sweep (if any) that dominates each periodic
    setting in both pass@1 and relative calls."""
    per = sorted((r for r in rows if r.policy == "periodic"), key=lambda r: r.p("period") or 0)
    if not per:
        return None
    raws = [r for r in rows if r.policy == "raw" and in_main_grid(r, k_min) and r.pass_common is not None
            and r.rel_calls is not None]
    out = []
    for r in per:
        dom = None
        if r.pass_common is not None and r.rel_calls is not None:
            cands = [q for q in raws if q.pass_common >= r.pass_common and q.rel_calls <= r.rel_calls
                     and (q.pass_common > r.pass_common or q.rel_calls < r.rel_calls)]
            dom = min(cands, key=lambda q: q.rel_calls).name if cands else "no"
        out.append([r.p("period"), r.name, r.m.pass_at_1, r.m.tokens_per_s, r.rel_calls, r.m.strict_token, dom])
    return Table(name, ["P", "config", "pass@1", "tokens/s", "rel. calls", "agreement", "dominated by raw"], out)


def matched_table(name: str, rows: list[Row], k_min: int) -> Table | None:
    """§5.2: per method, observed points whose pass@1 equals (or is at least) Strict SDD's on the
    same prompts: the one with the fewest calls and the fastest one."""
    out = []
    for m in FRONTIER_METHODS:
        pts = [r for r in rows if frontier_method(r) == m and in_main_grid(r, k_min) and r.pass_common is not None
               and r.ref_pass_common is not None and r.rel_calls is not None]
        if not pts:
            continue
        for crit, ok in (("=", lambda r: abs(r.pass_common - r.ref_pass_common) < 1e-9),
                         ("≥", lambda r: r.pass_common >= r.ref_pass_common - 1e-9)):
            hits = [r for r in pts if ok(r)]
            if not hits:
                out.append([LABELS[m], crit, "none observed"] + [None] * 8)
                continue
            fewest = min(hits, key=lambda r: (r.rel_calls, -(r.m.tokens_per_s or 0)))
            fastest = max(hits, key=lambda r: ((r.speedup or 0), -r.rel_calls))
            for pick, r in (("fewest calls", fewest), ("fastest", fastest)):
                if pick == "fastest" and r is fewest:
                    continue
                out.append([LABELS[m], crit, pick, r.name, r.pass_common, r.rel_calls, 1 - r.rel_calls,
                            r.tps_common, r.ref_tps_common, r.m.strict_token, r.m.full_prefix])
    if not out:
        return None
    return Table(name, ["method", "pass@1 vs strict", "pick", "config", "pass@1", "rel. calls", "call reduction",
                        "tokens/s", "strict tokens/s", "StrictToken", "FullPrefix"], out)


def _side(r: Row, other: Row, num: str, den: str, n_boot: int, seed: int, less: str, more: str, same: str):
    """``r`` against ``other`` on the prompts both hold: the ratio with its paired interval, and
    ``less``/``more`` where the interval lies below/above 1, ``same`` where it holds 1."""
    ids = sorted(set(r.run.ids) & set(other.run.ids))
    got = ratio_ci(r.run, other.run, ids, num, den, n_boot, seed) if r.run.samples and other.run.samples else None
    if got is None:
        return None, same
    return _worded(*got, less, more, same)


def _worded(point, ci, less: str, more: str, same: str):
    """The ratio with its interval, and ``less``/``more`` where the interval lies below/above 1,
    ``same`` where it holds 1 (or there is none)."""
    if ci is None:
        return _fmt(point), same
    return _interval(point, ci), less if ci[1] < 1 else more if ci[0] > 1 else same


#: the agreement axes a policy is set against a baseline on: how a row reads it, and whether a
#: baseline point must be at least (StrictToken, Eq. 1) or at most (disagreement per generated
#: token, what the prefix scheduler's alpha bounds) the policy's own
AXES = {"strict_token": ("StrictToken", lambda r: r.m.strict_token, +1),
        "disagreement": ("disagreement", lambda r: r.disagreement, -1)}


def versus_table(name: str, rows: list[Row], k_min: int, policy: str = "prefix", baseline: str = "raw",
                 n_boot: int = 10_000, seed: int = 0, axis: str = "strict_token") -> Table | None:
    """Each ``policy`` point against ``baseline``'s observed points that agree at least as well
    on ``axis`` (:data:`AXES`; both in the main grid): the one with the fewest relative calls and
    the one with the highest speedup, and the point's calls per token and tokens/s over theirs on
    the prompts both ran, with paired bootstrap intervals. A difference whose interval holds 1 is
    unresolved (observed points only; no interpolation between them)."""
    label, value, sign = AXES[axis]
    base = [r for r in rows if r.policy == baseline and in_main_grid(r, k_min) and value(r) is not None
            and r.rel_calls is not None]
    pts = [r for r in rows if r.policy == policy and in_main_grid(r, k_min) and value(r) is not None
           and r.rel_calls is not None]
    if not base or not pts:
        return None
    out = []
    for r in sorted(pts, key=lambda r: -sign * value(r)):
        peers = [b for b in base if sign * (value(b) - value(r)) >= -1e-12]
        if not peers:
            out.append([r.name, value(r), r.rel_calls, r.speedup] + [None] * 8
                       + [f"no {baseline} point agrees as much"])
            continue
        calls = min(peers, key=lambda b: b.rel_calls)
        fast = max(peers, key=lambda b: b.speedup or 0)
        c_ratio, c_word = _side(r, calls, "verifier_calls", "generated_tokens", n_boot, seed,
                                "fewer calls", "more calls", "calls unresolved")
        s_ratio, s_word = _side(r, fast, "generated_tokens", "decode_seconds", n_boot, seed,
                                "slower", "faster", "speed unresolved")
        words = f"{c_word}, {s_word}"
        e_fast, e_ratio = max(peers, key=lambda b: b.eq7_speedup or 0), None
        if r.ref is not None and e_fast.eq7_speedup is not None and r.eq7_speedup is not None:
            got = eq7_ratio(r.run, e_fast.run, sorted(set(r.run.ids) & set(e_fast.run.ids)), r.ref, n_boot, seed)
            if got is not None:
                e_ratio, e_word = _worded(*got, "slower", "faster", "unresolved")
                words += f"; Eq. 7: {e_word}"
        out.append([r.name, value(r), r.rel_calls, r.speedup, calls.name, calls.rel_calls, c_ratio,
                    fast.name, fast.speedup, s_ratio, e_fast.name if e_ratio else None, e_ratio, words])
    at = f"{'≥' if sign > 0 else '≤'} {label}"
    return Table(name, ["config", label, "rel. calls", "speedup", f"{baseline}: fewest calls at {at}",
                        "its rel. calls", "calls per token / its [95% CI]", f"{baseline}: fastest at {at}",
                        "its speedup", "tokens/s / its [95% CI]", f"{baseline}: fastest by Eq. 7",
                        "Eq. 7 tokens/s / its [95% CI]", "verdict"], out)


def eq8_table(name: str, rows: list[Row]) -> Table | None:
    out = [[r.name, LABELS.get(r.policy, r.policy), r.p("k_min"), None if r.m.c_D is None else 1e3 * r.m.c_D,
            None if r.m.c_V is None else 1e3 * r.m.c_V, r.A, r.K_star, r.m.tokens_per_s]
           for r in rows if r.policy not in ("ar",)]
    if not out:
        return None
    return Table(name, ["config", "method", "k_min", "c_D (ms/block)", "c_V (ms/call)", "A (strict)", "K*", "tokens/s"],
                 out)


@dataclass
class KminFamily:
    policy: str
    key: tuple  # (eta_b, eta_c, s_max)
    rows: list[Row]
    K_star: float | None  # from the Strict SDD run's own c_D, c_V and A
    predicted: int | None
    best: int | None
    best_eq7: int | None = None  # the k_min with the highest speedup under Eq. 7 at Strict SDD's costs
    #: the k_min with the highest repeated timing against Strict SDD (every k_min timed), and whether
    #: the timed best is resolved: its interval lies above every other k_min's point estimate
    best_timed: int | None = None
    best_timed_resolved: bool | None = None

    @property
    def agrees(self) -> bool | None:
        """Whether Eq. 8's prediction is the best observed k_min."""
        return None if self.predicted is None or self.best is None else self.predicted == self.best

    @property
    def agrees_eq7(self) -> bool | None:
        """Whether Eq. 8's prediction is the best k_min by Eq. 7 (drift-free, from the counts)."""
        return None if self.predicted is None or self.best_eq7 is None else self.predicted == self.best_eq7

    @property
    def agrees_timed(self) -> bool | None:
        """Whether Eq. 8's prediction is the best k_min by the repeated timing."""
        return None if self.predicted is None or self.best_timed is None else self.predicted == self.best_timed

    @property
    def above(self) -> bool | None:
        """The weaker check: whether the best observed k_min lies above K* (k_min 0 counts as 1)."""
        return None if self.K_star is None or self.best is None else max(self.best, 1) > self.K_star


def kmin_families(rows: list[Row]) -> list[KminFamily]:
    """Signal runs that differ only in ``k_min`` (Figure 5), with the Eq. 8 prediction: the
    smallest ``k_min`` of the grid above ``K* = A c_D / (c_D + c_V)``, against the observed best
    (highest tokens/s). A skip commits at least one token (``K_hat > 0``), so ``k_min`` 0 acts as 1:
    when ``K* < 1`` every skip pays and the prediction is the grid's smallest ``k_min``."""
    groups: dict[tuple, list[Row]] = {}
    for r in rows:
        if r.policy in SIGNALS and r.p("k_min") is not None and (r.p("eta_b") or 0) > 0 and (r.p("eta_c") or 0) > 0:
            groups.setdefault((r.policy, r.p("eta_b"), r.p("eta_c"), r.p("s_max")), []).append(r)
    fams = []
    for (m, *key), rs in groups.items():
        if len({r.p("k_min") for r in rs}) < 2:
            continue
        rs = sorted(rs, key=lambda r: r.p("k_min"))
        ref = next((r.ref for r in rs if r.ref is not None), None)
        K = None
        if ref is not None:
            rm = metrics_of(ref)
            if rm.A is not None and rm.c_D is not None and rm.c_V is not None and rm.c_D + rm.c_V > 0:
                K = break_even_length(rm.A, rm.c_D, rm.c_V)
        grid = [r.p("k_min") for r in rs]
        predicted = min((k for k in grid if max(k, 1) > K), default=None) if K is not None else None
        timed = [r for r in rs if r.m.tokens_per_s is not None]
        best = max(timed, key=lambda r: r.m.tokens_per_s).p("k_min") if timed else None
        modelled = [r for r in rs if r.eq7_speedup is not None]
        best_eq7 = max(modelled, key=lambda r: r.eq7_speedup).p("k_min") if modelled else None
        best_timed = resolved = None
        if all(r.timed_ratio is not None for r in rs):  # a best among some k_min is not the best k_min
            top = max(rs, key=lambda r: r.timed_ratio)
            best_timed = top.p("k_min")
            resolved = top.timed_ci is not None and all(top.timed_ci[0] > r.timed_ratio for r in rs if r is not top)
        fams.append(KminFamily(m, tuple(key), rs, K, predicted, best, best_eq7, best_timed, resolved))
    return fams


def kmin_table(name: str, fams: list[KminFamily]) -> Table | None:
    out = []
    for f in fams:
        for r in f.rows:
            out.append([LABELS[f.policy], f"eta_b={f.key[0]:g}, eta_c={f.key[1]:g}, s_max={f.key[2]}", r.p("k_min"),
                        r.name, r.rel_calls, r.rel_blocks, r.m.tokens_per_s, _interval(r.eq7_speedup, r.eq7_ci),
                        _interval(r.timed_ratio, r.timed_ci), r.m.pass_at_1, f.K_star, f.predicted, f.best, f.agrees,
                        f.above, f.best_eq7, f.agrees_eq7, f.best_timed, f.agrees_timed, f.best_timed_resolved])
    if not out:
        return None
    return Table(name, ["signal", "setting", "k_min", "config", "rel. calls", "rel. blocks", "tokens/s",
                        "speedup, Eq. 7 [95% CI]", "speedup, timed [95% CI]", "pass@1", "K* (strict)",
                        "predicted k_min", "best k_min", "agree", "best above K*", "best k_min (Eq. 7)",
                        "agree (Eq. 7)", "best k_min (timed)", "agree (timed)", "timed best resolved"], out)


def table4(groups: dict, k_min: int) -> tuple[Table | None, list[str]]:
    """Table 4 for every task: Strict SDD and each signal at its fixed setting (the paper's
    thresholds, the main ``k_min``), one row per ``s_max``."""
    out, notes = [], []
    for (task, gamma), rows in groups.items():
        strict = [r for r in rows if r.policy == "strict"]
        if not strict:
            continue
        s = strict[0]
        out.append([task, gamma, "Strict SDD", None, s.m.pass_at_1, s.m.tokens_per_s, 1.0 if s.rel_calls else None,
                    s.m.strict_token, s.name])
        for m in SIGNALS:
            eb, ec = DEFAULT_GATES[m]
            hits = [r for r in rows if r.policy == m and r.p("eta_b") == eb and r.p("eta_c") == ec
                    and r.p("k_min") == k_min]
            if not hits and any(r.policy == m for r in rows):
                notes.append(f"Table 4, {task}: no {m} run at the fixed setting eta_b={eb}, eta_c={ec}, k_min={k_min}")
            for r in sorted(hits, key=lambda r: r.p("s_max") or 0):
                out.append([task, gamma, LABELS[m], r.p("s_max"), r.m.pass_at_1, r.m.tokens_per_s, r.rel_calls,
                            r.m.strict_token, r.name])
    if not out:
        return None, notes
    return Table("table4", ["dataset", "gamma", "method", "S_max", "score", "tokens/s", "rel. calls",
                            "strict agreement", "config"], out), notes
