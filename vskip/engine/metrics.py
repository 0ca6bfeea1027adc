"""Run-level metrics from per-prompt samples and per-round records (§3.2, §5.1, Eq. 7–8, A.8).

Samples are the plain dicts of ``samples.jsonl``, whose measures are a :class:`PromptResult`;
rounds are anything with the fields of a :class:`Round`: the loop's
:class:`vskip.engine.decode.RoundRecord` or the run directory's :class:`vskip.study.rundir.RoundRow`
(a field that an old file lacks is None). Reports need no model.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Iterable, Protocol, Sequence

import numpy as np


class Round(Protocol):
    """The fields of one round the metrics read (None where a file written by an older version
    lacks one)."""

    verified: bool | None
    K: int | None
    L: int | None
    accepted: int | None
    committed: int | None
    relaxed: bool | None
    gamma: int | None


def agreement_sums(rounds: Iterable[Round]) -> tuple[int, int, int, int]:
    """The sums behind StrictToken (Eq. 1) and FullPrefix (Eq. 2): (Σ min(K, L), Σ K, #{K <= L},
    |A|) over the rounds A where a relaxed rule committed a nonempty draft prefix of K tokens
    (``accepted`` on a verified round, ``K`` on a skip) and the strict length L is known. The one
    place these sums are taken: the loop, the runner, the report and ``compare`` call it."""
    num = den = full = n = 0
    for r in rounds:
        if not r.relaxed or r.L is None or r.verified is None:
            continue
        K = (r.accepted if r.verified else r.K) or 0
        if K <= 0:
            continue
        num += min(K, r.L)
        den += K
        full += K <= r.L
        n += 1
    return num, den, full, n


def agreement_from_rounds(rounds: Iterable[Round]) -> tuple[float, float, int]:
    """(StrictToken Eq. 1, FullPrefix Eq. 2, |A|) from :func:`agreement_sums`; (1, 1, 0) when no
    round is in A (Strict SDD)."""
    num, den, full, n = agreement_sums(rounds)
    if n == 0:
        return 1.0, 1.0, 0
    return num / den, full / n, n


def _total(results: Sequence[PromptResult], key: str, missing: list[str]):
    """The sum of the field ``key`` over the results; None (and ``key`` named in ``missing``) when a
    result lacks it."""
    vals = [getattr(r, key) for r in results]
    if any(v is None for v in vals):
        missing.append(key)
        return None
    return sum(vals)


def _div(a, b):
    return a / b if a is not None and b else None


def _agreement(rounds: Sequence[Round], missing: list[str]) -> tuple[float | None, float | None, int]:
    """:func:`agreement_from_rounds`, or None where the rounds cannot tell: rounds written without
    the fields it needs, or relaxed rounds whose L nobody measured (no shadow verifier)."""
    if any(r.verified is None or r.relaxed is None or r.accepted is None for r in rounds):
        missing.append("relaxed/accepted round fields")
        return None, None, 0
    lacking = sum(1 for r in rounds if r.relaxed and r.L is None)
    st, fp, n = agreement_from_rounds(rounds)
    if lacking:
        missing.append(f"L on {lacking} relaxed rounds (no shadow verifier)")
        if not n:
            return None, None, 0
    return st, fp, n


@dataclass(frozen=True)
class PromptResult:
    """What decoding one prompt measured, in the one vocabulary of ``vskip run``'s
    ``samples.jsonl`` and ``vskip compare``'s rows: the generated tokens N and the decode seconds T
    (A.8), then the loop's counts and clocks. A decoder outside the loop (transformers'
    ``generate``) has N and T alone; the rest is None there, and wherever a file written by an
    older version lacks a field."""

    generated_tokens: int | None
    decode_seconds: float | None
    verifier_calls: int | None = None
    draft_blocks: int | None = None
    skipped_rounds: int | None = None
    draft_seconds: float | None = None
    verify_seconds: float | None = None
    predict_seconds: float | None = None
    shadow_seconds: float | None = None

    @classmethod
    def of(cls, res) -> "PromptResult":
        """The record of a :class:`vskip.engine.decode.DecodeResult`."""
        return cls(**{f.name: getattr(res, f.name) for f in fields(cls)})

    @classmethod
    def from_json(cls, d: dict) -> "PromptResult":
        return cls(**{f.name: d.get(f.name) for f in fields(cls)})

    def to_json(self) -> dict:
        """The fields that are known (a line never carries a null for a measure nobody took)."""
        return {k: v for k, v in asdict(self).items() if v is not None}


def summarize(samples: Sequence[dict], rounds: Sequence[Round]) -> dict:
    """The summary of one run: ΣN/ΣT throughput, calls and blocks per generated token, agreement
    (Eqs. 1-2), pass@1 over scored samples, the cost model of Eq. 7 (c_D, c_V, mean strict
    commit A) and the machines the clocks were read on. Every aggregate of a run is computed here:
    the run's own ``summary.json``, a merged sweep and the report. A total whose field some sample
    lacks is None, and ``missing`` (present only then) names the fields that could not be found."""
    missing: list[str] = []
    res = [PromptResult.from_json(s) for s in samples]
    N = _total(res, "generated_tokens", missing)
    T = _total(res, "decode_seconds", missing)
    calls = _total(res, "verifier_calls", missing)
    blocks = _total(res, "draft_blocks", missing)
    skipped = _total(res, "skipped_rounds", missing)
    draft_s = _total(res, "draft_seconds", missing)
    verify_s = _total(res, "verify_seconds", missing)
    predict_s = sum(r.predict_seconds or 0.0 for r in res)
    scored = [s["passed"] for s in samples if s.get("passed") is not None]
    strict_token, full_prefix, n_relaxed = _agreement(rounds, missing)
    verified = [r for r in rounds if r.verified and (r.gamma or 0) > 0]  # rounds that verified a draft
    strict_commit = [r.committed for r in verified]
    policy_s = max(0.0, T - draft_s - verify_s) if None not in (T, draft_s, verify_s) else None
    out = {
        "n_prompts": len(samples),
        "pass_at_1": (sum(scored) / len(scored)) if scored else None,
        "n_scored": len(scored),
        "generated_tokens": N,
        "decode_seconds": T,
        "tokens_per_s": _div(N, T),
        "verifier_calls": calls,
        "draft_blocks": blocks,
        "calls_per_token": _div(calls, N),
        "blocks_per_token": _div(blocks, N),
        "strict_token": strict_token,
        "full_prefix": full_prefix,
        "relaxed_rounds": n_relaxed,
        "skipped_rounds": skipped,
        "rounds": len(rounds),
        "draft_seconds": draft_s,
        "verify_seconds": verify_s,
        "predict_seconds": predict_s,
        "policy_seconds": policy_s,
        "policy_share": _div(policy_s, T),
        "shadow_seconds": sum(r.shadow_seconds or 0.0 for r in res),
        "c_D": _div(draft_s, blocks),
        "c_V": _div(verify_s, calls),
        "A": sum(strict_commit) / len(strict_commit) if strict_commit else None,
        "mean_accepted": ((sum(r.L for r in verified if r.L is not None) / len(strict_commit))
                          if strict_commit else None),
    }
    hosts = sorted({s["machine"] for s in samples if s.get("machine")})
    if hosts:  # the machines its clocks were read on (:func:`vskip.engine.runtime.machine_id`), where samples name them
        out["machines"] = hosts
    tasks = {s.get("task_id") for s in samples}
    if len(tasks) < len(samples):  # several completions per prompt (--samples-per-prompt)
        out["n_prompts"], out["n_samples"] = len(tasks), len(samples)
        per_task: dict = {}
        for s in samples:
            if s.get("passed") is not None:
                per_task.setdefault(s.get("task_id"), []).append(bool(s["passed"]))
        if per_task:

            out["pass_at_k"] = pass_at_k_table(per_task)
    if missing:
        out["missing"] = missing
    return out


def acceptance_histogram(rounds: Iterable[Round], gamma: int) -> list[int]:
    """Counts of the strict accepted length L = 0..gamma over full-length blocks."""
    h = [0] * (gamma + 1)
    for r in rounds:
        if r.L is not None and r.gamma == gamma:
            h[r.L] += 1
    return h


def survival_curve(hist: Sequence[int]) -> list[float]:
    """P(L >= j) for j = 1..gamma from a histogram of L."""
    n = sum(hist)
    if n == 0:
        return [0.0] * (len(hist) - 1)
    out, tail = [], n
    for j in range(1, len(hist)):
        tail -= hist[j - 1]
        out.append(tail / n)
    return out


def auroc(scores, labels) -> float:
    """AUROC (scikit-learn's ``roc_auc_score``; ties count one half); NaN when a class is empty."""
    import numpy as np
    from sklearn.metrics import roc_auc_score

    y = np.asarray(labels).astype(bool)
    if y.all() or not y.any():
        return float("nan")
    return float(roc_auc_score(y, np.asarray(scores, np.float64)))


def _task_interval(x: np.ndarray, level: float, seed: int) -> list[float]:
    """Percentile bootstrap interval of the mean of the per-task values ``x`` (tasks resampled);
    one task, or every task alike, leaves nothing to resample."""
    from scipy.stats import bootstrap

    if len(x) > 1 and np.ptp(x) > 0:
        ci = bootstrap((x,), np.mean, confidence_level=level, n_resamples=2000, method="percentile", rng=seed)
        return [float(ci.confidence_interval.low), float(ci.confidence_interval.high)]
    return [float(x.mean())] * 2


def pass_at_k_table(per_task: dict[str, Sequence[bool]], ks: Sequence[int] = (1, 10, 100), level: float = 0.95,
                    seed: int = 0) -> dict[str, dict]:
    """pass@k for each k in ``ks`` that every task has at least k samples for, and for k = the
    fewest samples a task has (pass@5 of five samples a task): the mean over tasks of the unbiased
    estimator, with a percentile bootstrap interval over tasks (``level``)."""
    fewest = min((len(v) for v in per_task.values()), default=0)
    out = {}
    for k in sorted(set(ks) | ({fewest} if fewest > 1 else set())):
        if k > fewest:
            continue
        x = np.array([pass_at_k(len(v), int(sum(v)), k) for v in per_task.values()])
        out[str(k)] = {"estimate": float(x.mean()), "ci": _task_interval(x, level, seed), "tasks": len(x),
                       "samples_per_task": fewest}
    return out


def pass_at_k_paired(per_task: dict[str, Sequence[bool]], other: dict[str, Sequence[bool]],
                     ks: Sequence[int] = (1, 10, 100), level: float = 0.95, seed: int = 0) -> dict[str, dict]:
    """pass@k of ``per_task`` minus pass@k of ``other``, paired by task: for each k that every
    task of both has at least k samples for (and the fewest samples, as in
    :func:`pass_at_k_table`), the mean over the tasks both hold of the difference of their unbiased
    estimates, a percentile bootstrap interval that resamples tasks (``level``), and how many
    tasks each side wins. Two samplers of one distribution give an interval that holds 0."""
    ids = sorted(set(per_task) & set(other))
    if not ids:
        raise ValueError("the two sample sets share no task")
    fewest = min(min(len(per_task[t]), len(other[t])) for t in ids)
    out = {}
    for k in sorted(set(ks) | ({fewest} if fewest > 1 else set())):
        if k > fewest:
            continue
        a = np.array([pass_at_k(len(per_task[t]), int(sum(per_task[t])), k) for t in ids])
        b = np.array([pass_at_k(len(other[t]), int(sum(other[t])), k) for t in ids])
        d = a - b
        out[str(k)] = {"difference": float(d.mean()), "ci": _task_interval(d, level, seed), "estimate": float(a.mean()),
                       "other": float(b.mean()), "tasks": len(d), "samples_per_task": fewest,
                       "higher": int((d > 0).sum()), "lower": int((d < 0).sum())}
    return out


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples of which c are correct: 1 - C(n-c, k) / C(n, k)."""
    if not (0 <= c <= n) or k < 1 or k > n:
        raise ValueError(f"need 0 <= c <= n and 1 <= k <= n (n={n}, c={c}, k={k})")
    if n - c < k:
        return 1.0
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def disagreement_counts(run, ids: Sequence[str]) -> tuple[np.ndarray, np.ndarray] | None:
    """Per prompt of ``ids`` of a run (its ``rounds`` and ``samples`` rows): the drafted tokens its
    skips committed beyond the shadow verifier's ``L``, and its generated tokens (None when a
    skipped round has no shadow ``L``)."""
    wrong = dict.fromkeys(ids, 0)
    for r in run.rounds:
        if r.task_id in wrong and r.verified is False and (r.K or 0) > 0:
            if r.L is None:
                return None
            wrong[r.task_id] += max(0, r.K - r.L)
    n = {s["task_id"]: s.get("generated_tokens") or 0 for s in run.samples if "task_id" in s}
    return (np.array([wrong[i] for i in ids], np.float64), np.array([n.get(i) or 0 for i in ids], np.float64))


def prompt_disagreement(run, ids: Sequence[str]) -> np.ndarray | None:
    """Per prompt of ``ids``: :func:`disagreement_counts`' wrong tokens over generated tokens (0
    for a prompt that generated none), the disagreement with the verifier in the run's own context
    that the prefix scheduler promises to bound, averaged over prompts, and is calibrated on."""
    c = disagreement_counts(run, ids)
    return None if c is None else disagreement_shares(*c)


def disagreement_shares(wrong: np.ndarray, n: np.ndarray) -> np.ndarray:
    """Per prompt, wrong tokens over generated tokens (0 where none were generated)."""
    return np.divide(wrong, n, out=np.zeros_like(wrong), where=n > 0)
