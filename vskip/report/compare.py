"""One run's aggregates, and its comparison with the Strict SDD run of its task."""

from __future__ import annotations

from dataclasses import dataclass

from ..metrics import agreement_from_rounds
from ..policy import break_even_length
from .runs import SAMPLES, Run

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


def _total(samples: list[dict], key: str, missing: list[str]):
    vals = [s.get(key) for s in samples]
    if any(v is None for v in vals):
        missing.append(key)
        return None
    return sum(vals)


def _div(a, b):
    return a / b if a is not None and b else None


def _agreement(rounds: list[dict], method: str | None, missing: list[str]):
    """StrictToken and FullPrefix (Eqs. 1-2); rounds of writers without ``relaxed`` or
    ``accepted`` fall back to the DESIGN §8 fields (a skipped round is relaxed, K its length)."""
    if method in ("strict", "ar"):
        return 1.0, 1.0
    if not rounds:
        return None, None
    if all("relaxed" in r and "accepted" in r and "verified" in r for r in rounds):
        lacking = sum(1 for r in rounds if r["relaxed"] and r.get("L") is None)
        if lacking:
            missing.append(f"L on {lacking} relaxed rounds (no shadow verifier)")
        st, fp, n = agreement_from_rounds(rounds)
        return (st, fp) if n or not lacking else (None, None)
    if method in ("lenience", "topk"):
        missing.append("relaxed/accepted round fields")
        return None, None
    missing.append("relaxed/accepted round fields (agreement from skipped rounds)")
    pairs = [(r.get("K") or 0, r.get("L")) for r in rounds if r.get("verified") is False]
    pairs = [(k, l) for k, l in pairs if k > 0 and l is not None]
    if not pairs:
        return 1.0, 1.0
    return (sum(min(k, l) for k, l in pairs) / sum(k for k, _ in pairs),
            sum(k <= l for k, l in pairs) / len(pairs))


def compute_metrics(run: Run, ids: set[str] | None = None) -> Metrics:
    """Aggregates over the run's prompts, or over ``ids`` only (for comparisons on the prompts
    two runs share). ΣN/ΣT throughput; calls and blocks per generated token (§5.1, A.8)."""
    missing: list[str] = []
    if not run.samples and run.summary:
        s = run.summary
        return Metrics(s.get("n_prompts") or 0, s.get("generated_tokens"), s.get("decode_seconds"),
                       s.get("tokens_per_s"), s.get("calls_per_token"), s.get("blocks_per_token"),
                       s.get("pass_at_1"), {}, s.get("strict_token"), s.get("full_prefix"),
                       s.get("skipped_rounds"), s.get("c_D"), s.get("c_V"), s.get("A"), [SAMPLES])
    samples = [s for s in run.samples if ids is None or s.get("task_id") in ids]
    keep = {s.get("task_id") for s in samples}
    rounds = [r for r in run.rounds if r.get("task_id") in keep]
    N = _total(samples, "generated_tokens", missing)
    T = _total(samples, "decode_seconds", missing)
    calls = _total(samples, "verifier_calls", missing)
    blocks = _total(samples, "draft_blocks", missing)
    skipped = _total(samples, "skipped_rounds", missing)
    draft_s = _total(samples, "draft_seconds", missing)
    verify_s = _total(samples, "verify_seconds", missing)
    passed = {s["task_id"]: bool(s["passed"]) for s in samples if s.get("passed") is not None and "task_id" in s}
    st, fp = _agreement(rounds, run.method, missing)
    verified = [r for r in rounds if r.get("verified") and (r.get("gamma") is None or r.get("gamma", 0) > 0)]
    commits = [r["committed"] for r in verified if r.get("committed") is not None]
    return Metrics(
        n=len(samples), tokens=N, seconds=T, tokens_per_s=_div(N, T),
        calls_per_token=_div(calls, N), blocks_per_token=_div(blocks, N),
        pass_at_1=(sum(passed.values()) / len(passed)) if passed else None, passed=passed,
        strict_token=st, full_prefix=fp, skipped_rounds=skipped,
        c_D=_div(draft_s, blocks), c_V=_div(verify_s, calls),
        A=(sum(commits) / len(commits)) if commits else None, missing=missing,
    )


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

    @property
    def name(self) -> str:
        return self.run.label

    @property
    def method(self) -> str | None:
        return self.run.method

    def p(self, key):
        return self.run.params.get(key)


def choose_reference(run: Run, strict_runs: list[Run]) -> Run | None:
    """The Strict SDD run of the same task, preferring the same gamma, then the most prompts in
    common with ``run``."""
    if run.method == "strict":
        return run
    same = [s for s in strict_runs if s.task == run.task]
    if not same:
        return None
    ids = set(run.ids)
    return max(same, key=lambda s: (s.gamma == run.gamma, len(ids & set(s.ids)), len(s.ids)))


def _ratio(a, b):
    return a / b if a is not None and b else None


def compare(run: Run, ref: Run | None, n_boot: int, seed: int) -> Row:
    from ..scoring import paired_bootstrap

    row = Row(run, run.metrics())
    if ref is None:
        return row
    row.ref = ref
    if run.samples and ref.samples:
        common = set(run.ids) & set(ref.ids)
        row.common = len(common)
        if not common:
            return row
        a = run.metrics() if common == set(run.ids) else compute_metrics(run, common)
        b = ref.metrics() if common == set(ref.ids) else compute_metrics(ref, common)
    else:  # a writer without samples: compare whole-run summaries
        a, b = row.m, ref.metrics()
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
    row.A = ref.metrics().A
    if row.A is not None and row.m.c_D is not None and row.m.c_V is not None and row.m.c_D + row.m.c_V > 0:
        row.K_star = break_even_length(row.A, row.m.c_D, row.m.c_V)
    return row
