"""The threshold ``--lam`` of ``--policy prefix`` that keeps a promised
agreement, by conformal risk control on Strict SDD traces (:mod:`vskip.policy.prefix`).

Each traced prompt gives its blocks' survival as the policy estimates it (the running product of the
drafter's confidences) and their accepted lengths ``L``. The threshold is the smallest one whose
replayed loss meets the conformal bound. The loss counts the drafted tokens a skip would commit
beyond ``L``, over the tokens Strict SDD commits, capped at 1.

The policy skips a subset of what the replay skips: it waits for the break-even length, and
staleness and the guards only remove skips. So the promise, ``E[loss] <= alpha``, carries over to
it for a new prompt exchangeable with the traced ones. See docs/prefix.md for what breaks that.
"""

from __future__ import annotations

import numpy as np

from .policy.prefix import Calibration, calibrate


def prompts_from_traces(ts) -> list[tuple[np.ndarray, np.ndarray]]:
    """(survival [B, gamma], L [B]) per traced prompt, survival as ``--policy prefix`` sees it."""
    S = np.cumprod(ts.confidence.astype(np.float64), axis=1)
    return [(S[ts.prompt == i], ts.L[ts.prompt == i]) for i in range(len(ts.prompt_ids)) if (ts.prompt == i).any()]


def calibrate_traces(trace_dirs, alpha: float, step: float = 0.005) -> tuple[Calibration, dict]:
    from .traces import load_traces

    if not 0 < step <= 0.5:
        raise ValueError(f"--step must lie in (0, 0.5], got {step}")
    ts = load_traces(trace_dirs, hidden=False)
    prompts = prompts_from_traces(ts)
    cal = calibrate(prompts, alpha, grid=np.arange(0.0, 1.0 + step / 2, step))
    record = {"lam": cal.lam, "alpha": alpha, "prompts": cal.n, "risk": cal.risk, "bound": cal.bound,
              "blocks": int(ts.n_blocks), "gamma": ts.gamma, "traces": [str(t) for t in trace_dirs],
              "policies": list(ts.policies)}
    return cal, record


def replay_promise(pred, ts, alphas=(0.01, 0.02, 0.05), n_boot: int = 10_000, seed: int = 0) -> list[dict]:
    """Each rotation's calibrated threshold replayed on the traced blocks of the prompts it tests.

    Per prompt and ``alpha``: :func:`vskip.policy.prefix.prompt_loss` of the held-out survival
    (:meth:`PrefixPredictor.score_traces`) at the threshold the prompt's own rotation calibrated.
    On Strict SDD traces of new prompts its mean estimates what the promise bounds. On traces decoded
    while a scheduler skipped (shadow-verified), it shows whether the threshold still holds on
    blocks drafted after skips, which the calibration never replayed. Prompts in no test fold of
    ``pred`` are left out. The interval is a percentile bootstrap over prompts. Each row also gives
    the ``thresholds`` replayed, one per rotation (``None``: too few calibration prompts, no skip)."""
    from .policy.prefix import prompt_loss, skip_lengths
    from .report.scheduler import promise_fields

    S = pred.score_traces(ts)
    prompts = []
    for i, pid in enumerate(ts.prompt_ids):
        sel = ts.prompt == i
        try:
            pred.rotation_of(pid)
        except ValueError:
            continue
        if sel.any():
            prompts.append((pid, S[sel], ts.L[sel]))
    if not prompts:
        raise ValueError("no traced prompt lies in a test fold of the prefix model")
    rows = []
    for alpha in alphas:
        loss, blocks, skips, wrong, skipped = [], 0, 0, 0, 0
        for pid, s, L in prompts:
            lam = pred.threshold(pid, alpha)
            loss.append(prompt_loss(s, L, lam))
            K = skip_lengths(s, lam)
            blocks += len(L)
            skips += int((K > 0).sum())
            wrong += int((K > L).sum())
            skipped += int(K.sum())
        f = promise_fields(np.asarray(loss), alpha, n_boot, seed)
        lams = [None if lam == float("inf") else float(lam) for _, _, lam in pred.thresholds(alpha)]
        rows.append({"alpha": float(alpha), "thresholds": lams, "replayed_loss": f["mean"], "replayed_loss_ci95": f["ci95"],
                     "verdict": f["verdict"], "n_prompts": len(prompts), "blocks": blocks,
                     "skipped_blocks": skips, "wrong_skip_share": wrong / skips if skips else None,
                     "mean_skip": skipped / skips if skips else None})
    return rows
