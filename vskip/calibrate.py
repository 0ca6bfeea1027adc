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
