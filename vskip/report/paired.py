"""One run's aggregates, and its measures paired with the Strict SDD run of its task on the prompts
both finished (relative calls and blocks, speed, agreement, pass@1, with intervals over prompts)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from ..engine.metrics import agreement_sums, prompt_disagreement, summarize
from ..engine.policy import break_even_length
from ..stats import bootstrap_means, percentile_interval, resample_indices
from ..study.rundir import SAMPLES, Run

# --------------------------------------------------------------------------- metrics


@dataclass
class Metrics:
    """One run's aggregates over a set of prompts (None: unknown from what was written)."""

    n: int
    tokens: float | None
    seconds: float | None
    tokens_per_s: float | None
    calls_per_token: float | None
    blocks_per_token: float | None
    pass_at_1: float | None
    passed: dict  # task_id -> bool, scored prompts only
    strict_token: float | None
    full_prefix: float | None
    skipped_rounds: int | None
    c_D: float | None
    c_V: float | None
    A: float | None
    missing: list[str]


def compute_metrics(run: Run, ids: set[str] | None = None) -> Metrics:
    """Aggregates over the run's prompts, or over ``ids`` only (for comparisons on the prompts
    two runs share), by :func:`vskip.engine.metrics.summarize`, the run's own summary: ΣN/ΣT
    throughput, calls and blocks per generated token (§5.1, A.8), agreement (Eqs. 1-2)."""
    if not run.samples and run.summary:
        s = run.summary
        return Metrics(s.get("n_prompts") or 0, s.get("generated_tokens"), s.get("decode_seconds"),
                       s.get("tokens_per_s"), s.get("calls_per_token"), s.get("blocks_per_token"),
                       s.get("pass_at_1"), {}, s.get("strict_token"), s.get("full_prefix"),
                       s.get("skipped_rounds"), s.get("c_D"), s.get("c_V"), s.get("A"), [SAMPLES])
    samples = [s for s in run.samples if ids is None or s.get("task_id") in ids]
    keep = {s.get("task_id") for s in samples}
    rounds = [r for r in run.rounds if r.task_id in keep]
    s = summarize(samples, rounds)
    st, fp = s["strict_token"], s["full_prefix"]
    if run.policy in ("strict", "ar"):
        st, fp = 1.0, 1.0  # by definition, whatever rounds were written
    elif not rounds:
        st, fp = None, None
    passed = {x["task_id"]: bool(x["passed"]) for x in samples if x.get("passed") is not None and "task_id" in x}
    return Metrics(
        n=len(samples), tokens=s["generated_tokens"], seconds=s["decode_seconds"], tokens_per_s=s["tokens_per_s"],
        calls_per_token=s["calls_per_token"], blocks_per_token=s["blocks_per_token"],
        pass_at_1=s["pass_at_1"], passed=passed,
        strict_token=st, full_prefix=fp, skipped_rounds=s["skipped_rounds"], c_D=s["c_D"], c_V=s["c_V"],
        A=s["A"], missing=s.get("missing", []),
    )


def metrics_of(run: Run) -> Metrics:
    """:func:`compute_metrics` over all of the run's prompts, computed once per run."""
    if run._metrics is None:
        run._metrics = compute_metrics(run)
    return run._metrics


@dataclass
class Row:
    """One run in its group: its own metrics, and comparisons with its Strict SDD reference on
    the prompts both ran."""

    run: Run
    m: Metrics
    ref: Run | None = None
    common: int = 0
    rel_calls: float | None = None
    rel_blocks: float | None = None
    speedup: float | None = None
    pass_common: float | None = None
    ref_pass_common: float | None = None
    tps_common: float | None = None
    ref_tps_common: float | None = None
    delta: float | None = None
    ci: tuple[float, float] | None = None
    A: float | None = None
    K_star: float | None = None
    intervals: dict | None = None  # paired bootstrap intervals over prompts (see :func:`intervals`)
    equal_ar: tuple[int, int] | None = None  # (prompts whose output equals ar's, prompts compared)
    equal_strict: tuple[int, int] | None = None  # the same against its Strict SDD reference
    #: tokens/s over the reference's under Eq. 7 at the reference's own c_D and c_V (see :func:`eq7_ratio`),
    #: with its paired interval over prompts
    eq7_speedup: float | None = None
    eq7_ci: tuple[float, float] | None = None
    #: the share of generated tokens committed beyond the shadow verifier's L, averaged over the prompts
    #: both runs hold (the quantity the prefix scheduler's alpha bounds), with its bootstrap interval
    disagreement: float | None = None
    disagreement_ci: tuple[float, float] | None = None
    #: the run's configuration timed again beside Strict SDD (``vskip report --timing``): the fields of
    #: :func:`vskip.report.timing.timed_fields`, empty where no comparison timed it
    timed: dict = field(default_factory=dict)
    #: (prompts it holds, prompts the fullest run of its group holds) when it holds fewer: a partial
    #: run, marked in every table and left out of figures and frontiers unless asked for
    partial: tuple[int, int] | None = None

    @property
    def timed_ratio(self) -> float | None:
        return self.timed.get("timed_tokens_per_s_ratio")

    @property
    def timed_ci(self) -> tuple[float, float] | None:
        ci = self.timed.get("timed_tokens_per_s_ratio_ci95")
        return tuple(ci) if ci else None

    @property
    def name(self) -> str:
        return self.run.label

    @property
    def policy(self) -> str | None:
        return self.run.policy

    def p(self, key):
        return self.run.params.get(key)


def choose_reference(run: Run, strict_runs: list[Run]) -> Run | None:
    """The Strict SDD run of the same task, preferring the same gamma, then the most prompts in
    common with ``run``."""
    if run.policy == "strict":
        return run
    same = [s for s in strict_runs if s.task == run.task]
    if not same:
        return None
    ids = set(run.ids)
    return max(same, key=lambda s: (s.gamma == run.gamma, len(ids & set(s.ids)), len(s.ids)))


def _ratio(a, b):
    return a / b if a is not None and b else None


def compare(run: Run, ref: Run | None, n_boot: int, seed: int) -> Row:
    from ..bench.scoring import paired_bootstrap

    row = Row(run, metrics_of(run))
    if ref is None:
        return row
    row.ref = ref
    if run.samples and ref.samples:
        common = set(run.ids) & set(ref.ids)
        row.common = len(common)
        if not common:
            return row
        a = metrics_of(run) if common == set(run.ids) else compute_metrics(run, common)
        b = metrics_of(ref) if common == set(ref.ids) else compute_metrics(ref, common)
    else:  # a writer without samples: compare whole-run summaries
        a, b = row.m, metrics_of(ref)
        row.common = min(a.n, b.n)
    row.rel_calls = _ratio(a.calls_per_token, b.calls_per_token)
    row.rel_blocks = _ratio(a.blocks_per_token, b.blocks_per_token)
    row.speedup = _ratio(a.tokens_per_s, b.tokens_per_s)
    row.tps_common, row.ref_tps_common = a.tokens_per_s, b.tokens_per_s
    row.pass_common, row.ref_pass_common = a.pass_at_1, b.pass_at_1
    both = sorted(set(a.passed) & set(b.passed))
    if both:
        if run is ref:
            row.delta, row.ci = 0.0, (0.0, 0.0)
        else:
            bs = paired_bootstrap([b.passed[i] for i in both], [a.passed[i] for i in both],
                                  n_resamples=n_boot, seed=seed)
            row.delta, row.ci = bs.diff, (bs.lo, bs.hi)
        if len(both) < row.common:  # pass@1 compared on the prompts both scored
            row.pass_common = sum(a.passed[i] for i in both) / len(both)
            row.ref_pass_common = sum(b.passed[i] for i in both) / len(both)
    if run.samples and ref.samples and n_boot > 0:
        row.intervals = intervals(run, ref, sorted(set(run.ids) & set(ref.ids)), n_boot, seed)
    if run.samples and ref.samples:
        row.disagreement, row.disagreement_ci = _disagreement(run, sorted(set(run.ids) & set(ref.ids)), n_boot, seed)
    if run.samples and ref.samples and run.policy != "ar":
        got = eq7_ratio(run, ref, sorted(set(run.ids) & set(ref.ids)), ref, n_boot, seed)
        if got is not None:
            row.eq7_speedup, row.eq7_ci = got
    row.A = metrics_of(ref).A
    if row.A is not None and row.m.c_D is not None and row.m.c_V is not None and row.m.c_D + row.m.c_V > 0:
        row.K_star = break_even_length(row.A, row.m.c_D, row.m.c_V)
    return row


def _disagreement(run: Run, ids: Sequence[str], n_boot: int, seed: int):
    """(mean, interval) over ``ids`` of each prompt's share of tokens committed beyond the shadow
    verifier's L; (None, None) where a skipped round has no shadow L."""
    d = prompt_disagreement(run, ids) if ids else None
    if d is None:
        return None, None
    if n_boot <= 0:
        return float(d.mean()), None
    return float(d.mean()), percentile_interval(bootstrap_means(d, n_boot, seed))


# --------------------------------------------------------------------------- intervals


def per_prompt(run: Run, ids: Sequence[str]) -> dict[str, np.ndarray] | None:
    """Per-prompt sums behind the run's ratios, in the order of ``ids``: generated tokens, verifier
    calls, draft blocks, and the numerators and denominators of StrictToken (Eq. 1) and
    FullPrefix (Eq. 2). None when a sample lacks a count."""
    by = {s["task_id"]: s for s in run.samples if "task_id" in s}
    rounds: dict[str, list] = {}
    for r in run.rounds:
        rounds.setdefault(r.task_id, []).append(r)
    cols = {k: [] for k in ("N", "calls", "blocks", "st_num", "st_den", "fp_num", "fp_den")}
    for i in ids:
        s = by[i]
        if any(s.get(k) is None for k in ("generated_tokens", "verifier_calls", "draft_blocks")):
            return None
        cols["N"].append(s["generated_tokens"])
        cols["calls"].append(s["verifier_calls"])
        cols["blocks"].append(s["draft_blocks"])
        num, den, full, n = agreement_sums(rounds.get(i, ()))
        cols["st_num"].append(num)
        cols["st_den"].append(den)
        cols["fp_num"].append(full)
        cols["fp_den"].append(n)
    return {k: np.asarray(v, np.float64) for k, v in cols.items()}


def intervals(run: Run, ref: Run, ids: Sequence[str], n_boot: int, seed: int) -> dict | None:
    """Paired percentile bootstrap over the prompts both runs hold: the same resampled prompts
    for both runs in each replicate. Intervals of relative calls and relative blocks per
    generated token (ratios of sums, as the point values), StrictToken and FullPrefix; and for
    pass@1, the number of discordant prompts with a Clopper-Pearson upper bound on their share,
    which bounds |Δpass@1| even when every outcome coincides and the bootstrap collapses to 0."""
    if not ids:
        return None
    a, b = per_prompt(run, ids), per_prompt(ref, ids)
    if a is None or b is None:
        return None
    n = len(ids)
    out: dict = {"prompts": n, "resamples": n_boot}
    stats = {k: np.empty(n_boot) for k in ("rel_calls", "rel_blocks", "strict_token", "full_prefix")}
    start = 0
    with np.errstate(invalid="ignore", divide="ignore"):
        for idx in resample_indices(n, n_boot, seed, max_elements=1 << 21):
            sa = {k: v[idx].sum(axis=1) for k, v in a.items()}
            sb = {k: v[idx].sum(axis=1) for k, v in b.items()}
            sl = slice(start, start + idx.shape[0])
            stats["rel_calls"][sl] = (sa["calls"] / sa["N"]) / (sb["calls"] / sb["N"])
            stats["rel_blocks"][sl] = (sa["blocks"] / sa["N"]) / (sb["blocks"] / sb["N"])
            stats["strict_token"][sl] = np.where(sa["st_den"] > 0, sa["st_num"] / sa["st_den"], 1.0)
            stats["full_prefix"][sl] = np.where(sa["fp_den"] > 0, sa["fp_num"] / sa["fp_den"], 1.0)
            start += idx.shape[0]
    for k, v in stats.items():
        out[k] = percentile_interval(v)
    if run.policy in ("strict", "ar") or run is ref:  # exact by construction
        out["strict_token"] = out["full_prefix"] = (1.0, 1.0)
    pa = {s["task_id"]: s.get("passed") for s in run.samples if "task_id" in s}
    pb = {s["task_id"]: s.get("passed") for s in ref.samples if "task_id" in s}
    scored = [i for i in ids if pa.get(i) is not None and pb.get(i) is not None]
    if scored:
        d = sum(bool(pa[i]) != bool(pb[i]) for i in scored)
        out["pass_scored"] = len(scored)
        out["discordant"] = d
        out["delta_pass_bound"] = clopper_pearson_upper(d, len(scored))
    return out


def sample_sums(run: Run, ids: Sequence[str], num: str, den: str) -> np.ndarray | None:
    """[2, len(ids)]: the sample fields ``num`` and ``den`` of each prompt of ``ids`` (None when a
    sample lacks one)."""
    by = {s["task_id"]: s for s in run.samples if "task_id" in s}
    vals = [(by[i].get(num), by[i].get(den)) for i in ids]
    if any(a is None or b is None for a, b in vals):
        return None
    return np.asarray(vals, np.float64).reshape(len(ids), 2).T


def paired_ratio(a: np.ndarray, b: np.ndarray, n_boot: int,
                 seed: int) -> tuple[float, tuple[float, float] | None]:
    """(Σa[0]/Σa[1]) / (Σb[0]/Σb[1]) over paired prompts (columns), with a percentile bootstrap
    that resamples the same prompts for both (no interval when ``n_boot`` is 0)."""
    with np.errstate(invalid="ignore", divide="ignore"):
        point = float((a[0].sum() / a[1].sum()) / (b[0].sum() / b[1].sum()))
        if n_boot <= 0:
            return point, None
        idx = next(resample_indices(a.shape[1], n_boot, seed))
        v = (a[0][idx].sum(1) / a[1][idx].sum(1)) / (b[0][idx].sum(1) / b[1][idx].sum(1))
    return point, percentile_interval(v)


def ratio_ci(run: Run, other: Run, ids: Sequence[str], num: str, den: str, n_boot: int,
             seed: int) -> tuple[float, tuple[float, float] | None] | None:
    """(Σnum/Σden)_run / (Σnum/Σden)_other over the prompts ``ids`` both hold, with a paired
    percentile bootstrap over them: ``num``/``den`` name sample fields, ``verifier_calls`` over
    ``generated_tokens`` for calls per token, ``generated_tokens`` over ``decode_seconds`` for
    tokens/s. None when a sample lacks a field. The interval covers the choice of prompts only:
    two runs timed at different moments also differ by the machine's drift, which it does not see."""
    if not ids:
        return None
    a, b = sample_sums(run, ids, num, den), sample_sums(other, ids, num, den)
    if a is None or b is None:
        return None
    return paired_ratio(a, b, n_boot, seed)


def unit_costs(run: Run) -> tuple[float, float] | None:
    """The run's measured c_D (seconds per draft block) and c_V (seconds per verifier call) over
    all of its prompts; None without blocks or calls."""
    tot = {k: sum(s.get(k) or 0 for s in run.samples)
           for k in ("draft_seconds", "draft_blocks", "verify_seconds", "verifier_calls")}
    if not tot["draft_blocks"] or not tot["verifier_calls"]:
        return None
    return tot["draft_seconds"] / tot["draft_blocks"], tot["verify_seconds"] / tot["verifier_calls"]


def eq7_sums(run: Run, ids: Sequence[str], c_D: float, c_V: float) -> np.ndarray | None:
    """[2, len(ids)]: each prompt's generated tokens and its decode time under Eq. 7 at the costs
    ``c_D`` and ``c_V``: draft blocks × c_D + verifier calls × c_V + the learned predictor's own
    measured seconds (None when a sample lacks a count)."""
    by = {s["task_id"]: s for s in run.samples if "task_id" in s}
    out = []
    for i in ids:
        s = by[i]
        if any(s.get(k) is None for k in ("generated_tokens", "draft_blocks", "verifier_calls")):
            return None
        out.append((s["generated_tokens"],
                    s["draft_blocks"] * c_D + s["verifier_calls"] * c_V + (s.get("predict_seconds") or 0.0)))
    return np.asarray(out, np.float64).reshape(len(ids), 2).T


def eq7_ratio(run: Run, other: Run, ids: Sequence[str], costs: Run, n_boot: int,
              seed: int) -> tuple[float, tuple[float, float] | None] | None:
    """tokens/s of ``run`` over ``other``'s on the prompts ``ids``, both timed by Eq. 7 at the c_D
    and c_V measured in ``costs`` (a Strict SDD run): what their counts of blocks and calls imply,
    free of the drift between two runs timed at different moments. It leaves out that a
    verification after a skip also reads the skipped tokens, so it flatters skipping a little; a
    repeated timing (``vskip compare``) measures what it leaves out. Paired bootstrap over prompts;
    the costs are held fixed."""
    c = unit_costs(costs) if costs.samples else None
    if not ids or c is None:
        return None
    a, b = eq7_sums(run, ids, *c), eq7_sums(other, ids, *c)
    if a is None or b is None:
        return None
    return paired_ratio(a, b, n_boot, seed)


def clopper_pearson_upper(k: int, n: int, level: float = 0.95) -> float:
    """One-sided upper confidence bound on a binomial share from ``k`` of ``n`` (exact)."""
    from scipy.stats import beta

    return 1.0 if k >= n else float(beta.ppf(level, k + 1, n - k))


def equal_outputs(run: Run, ar: Run) -> tuple[int, int] | None:
    """(prompts whose generated tokens equal ``ar``'s, prompts both hold with tokens): an exact
    second quality axis that separates policies where pass@1 cannot."""
    ta = {s["task_id"]: s.get("tokens") for s in run.samples if "task_id" in s}
    tb = {s["task_id"]: s.get("tokens") for s in ar.samples if "task_id" in s}
    both = [i for i in ta if ta[i] is not None and tb.get(i) is not None]
    if not both:
        return None
    return sum(ta[i] == tb[i] for i in both), len(both)
