"""Run-level metrics from per-prompt samples and per-round records (§3.2, §5.1, Eq. 7–8, A.8).

Works on plain dicts as written to ``samples.jsonl`` and ``rounds.jsonl``, so reports need no model.
"""

from __future__ import annotations

from typing import Iterable, Sequence


def agreement_from_rounds(rounds: Iterable[dict]) -> tuple[float, float, int]:
    """(StrictToken Eq. 1, FullPrefix Eq. 2, |A|) over rounds where a relaxed rule committed a
    nonempty draft prefix and L is known; (1, 1, 0) when there is none (Strict SDD)."""
    num = den = full = n = 0
    for r in rounds:
        if not r.get("relaxed") or r.get("L") is None:
            continue
        K = r["accepted"] if r["verified"] else r["K"]
        if K <= 0:
            continue
        num += min(K, r["L"])
        den += K
        full += K <= r["L"]
        n += 1
    if n == 0:
        return 1.0, 1.0, 0
    return num / den, full / n, n


def summarize(samples: Sequence[dict], rounds: Sequence[dict]) -> dict:
    """The summary of one run: ΣN/ΣT throughput, calls and blocks per generated token, agreement,
    pass@1 over scored samples, and the cost model of Eq. 7 (c_D, c_V, mean strict commit A)."""
    N = sum(s["generated_tokens"] for s in samples)
    T = sum(s["decode_seconds"] for s in samples)
    calls = sum(s["verifier_calls"] for s in samples)
    blocks = sum(s["draft_blocks"] for s in samples)
    skipped = sum(s["skipped_rounds"] for s in samples)
    scored = [s["passed"] for s in samples if s.get("passed") is not None]
    strict_token, full_prefix, n_relaxed = agreement_from_rounds(rounds)
    draft_s = sum(s.get("draft_seconds", 0.0) for s in samples)
    verify_s = sum(s.get("verify_seconds", 0.0) for s in samples)
    predict_s = sum(s.get("predict_seconds", 0.0) for s in samples)
    verified = [r for r in rounds if r["verified"]]
    strict_commit = [r["committed"] for r in verified if r.get("gamma", 0) > 0]
    return {
        "n_prompts": len(samples),
        "pass_at_1": (sum(scored) / len(scored)) if scored else None,
        "n_scored": len(scored),
        "generated_tokens": N,
        "decode_seconds": T,
        "tokens_per_s": N / T if T > 0 else None,
        "verifier_calls": calls,
        "draft_blocks": blocks,
        "calls_per_token": calls / N if N else None,
        "blocks_per_token": blocks / N if N else None,
        "strict_token": strict_token,
        "full_prefix": full_prefix,
        "relaxed_rounds": n_relaxed,
        "skipped_rounds": skipped,
        "rounds": len(rounds),
        "draft_seconds": draft_s,
        "verify_seconds": verify_s,
        "predict_seconds": predict_s,
        "policy_seconds": max(0.0, T - draft_s - verify_s),
        "policy_share": max(0.0, T - draft_s - verify_s) / T if T > 0 else None,
        "shadow_seconds": sum(s.get("shadow_seconds", 0.0) for s in samples),
        "c_D": draft_s / blocks if blocks else None,
        "c_V": verify_s / calls if calls else None,
        "A": sum(strict_commit) / len(strict_commit) if strict_commit else None,
        "mean_accepted": (sum(r["L"] for r in verified if r.get("L") is not None and r.get("gamma", 0) > 0)
                          / len(strict_commit)) if strict_commit else None,
    }


def acceptance_histogram(rounds: Iterable[dict], gamma: int) -> list[int]:
    """Counts of the strict accepted length L = 0..gamma over full-length blocks."""
    h = [0] * (gamma + 1)
    for r in rounds:
        if r.get("L") is not None and r.get("gamma") == gamma:
            h[r["L"]] += 1
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
