"""The threshold ``--lam`` of ``--policy prefix`` that keeps a promised
agreement, by conformal risk control on Strict SDD traces (:mod:`vskip.engine.policy.prefix`).

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

from ...engine.policy.prefix import Calibration, calibrate
from ...files import check_input_dir


def verdict(mean: float, ci: tuple[float, float] | None, alpha: float) -> str:
    """``within`` where the realised mean is at most ``alpha``; above it, ``exceeded`` where the
    whole interval lies above ``alpha`` and ``above, unresolved`` where it still holds ``alpha``."""
    if mean <= alpha:
        return "within"
    return "exceeded" if ci is not None and ci[0] > alpha else "above, unresolved"


def promise_fields(d: np.ndarray, alpha: float, n_boot: int = 10_000, seed: int = 0) -> dict:
    """The mean of per-prompt losses ``d`` against ``alpha``: ``mean``, its percentile bootstrap
    interval over prompts (``ci95``), the bootstrap's 95th percentile (``upper95``) and the
    :func:`verdict`."""
    from ...stats import bootstrap_means, percentile_interval

    d = np.asarray(d, np.float64)
    boot = bootstrap_means(d, n_boot, seed)
    m, ci = float(d.mean()), percentile_interval(boot)
    return {"mean": m, "ci95": ci, "upper95": float(np.quantile(boot, 0.95)), "verdict": verdict(m, ci, alpha)}


def prompts_from_traces(ts) -> list[tuple[np.ndarray, np.ndarray]]:
    """(survival [B, gamma], L [B]) per traced prompt, survival as ``--policy prefix`` sees it."""
    S = np.cumprod(ts.confidence.astype(np.float64), axis=1)
    return [(S[ts.prompt == i], ts.L[ts.prompt == i]) for i in range(len(ts.prompt_ids)) if (ts.prompt == i).any()]


def calibrate_traces(trace_dirs, alpha: float, step: float = 0.005) -> tuple[Calibration, dict]:
    from ..traces import load_traces

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

    Per prompt and ``alpha``: :func:`vskip.engine.policy.prefix.prompt_loss` of the held-out survival
    (:meth:`PrefixPredictor.score_traces`) at the threshold the prompt's own rotation calibrated.
    On Strict SDD traces of new prompts its mean estimates what the promise bounds. On traces decoded
    while a scheduler skipped (shadow-verified), it shows whether the threshold still holds on
    blocks drafted after skips, which the calibration never replayed. Prompts in no test fold of
    ``pred`` are left out. The interval is a percentile bootstrap over prompts. Each row also gives
    the ``thresholds`` replayed, one per rotation (``None``: too few calibration prompts, no skip)."""
    from ...engine.policy.prefix import prompt_loss, skip_lengths

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


# ----------------------------------------------------------------------------- online


#: the run settings that calibration and test must share
_SHARED = (("policy", "name"), ("policy", "survival"), ("policy", "cost_ratio"), ("policy", "s_max"),
           ("policy", "guards"), ("decode", "gamma"), ("decode", "max_new_tokens"), ("decode", "shadow"),
           ("decode", "gamma_max"), ("decode", "trim"), ("models", "steps"), ("models", "drafter"),
           ("models", "verifier"), ("models", "copy_prior"), ("models", "dtype"), ("models", "drafter_dtype"))


#: settings the calibration needs (its runs recover L) that never change what a run commits
_NOT_COMMITTING = ("decode/shadow",)

#: what a run's sampling settings hold that the guarantee depends on (its seed only picks the draws)
_SAMPLING = ("temperature", "top_p", "top_k", "speculative")
#: the models a run decoded with, as its ``config.json`` records them (the copy prior by its sha256)
_IDENTITY = ("verifier", "drafter", "copy_prior")


def run_settings(run_cfg: dict) -> dict:
    """The settings of a run (its ``config.json``'s ``run``) that an online calibration and the runs
    that use its thresholds must share, as ``{"policy/cost_ratio": ..., "decode/sampling": ...}``:
    the policy, the block, the budget, the models asked for, and the sampling (greedy or its
    temperature, top-p, top-k and rule)."""
    out = {"/".join(k): (run_cfg.get(k[0]) or {}).get(k[1]) for k in _SHARED}
    sampling = (run_cfg.get("decode") or {}).get("sampling")
    out["decode/sampling"] = {k: sampling.get(k) for k in _SAMPLING} if isinstance(sampling, dict) else sampling
    return out


def run_identity(config: dict) -> dict:
    """The models a finished run decoded with (its ``config.json``'s ``models``: the verifier and the
    drafter it loaded, the copy prior's sha256), as ``{"identity/verifier": ..., ...}``."""
    models = config.get("models") if isinstance(config.get("models"), dict) else {}
    return {f"identity/{k}": models.get(k) for k in _IDENTITY}


def check_online_settings(pred, run_cfg: dict) -> None:
    """Refuse a run with ``--alpha`` whose settings differ from those the online thresholds of
    ``pred`` were chosen with: the guarantee is for that policy only."""
    want = ((pred.online or {}).get("settings")) if run_cfg.get("policy", {}).get("alpha") else None
    if not want:
        return
    have = run_settings(run_cfg)
    # the models' identities are known once they load: the calibration's record keeps them beside;
    # shadow verification only recovers L after a skip and never changes a committed token, so a
    # run may leave it off (as a server does) and keep the guarantee
    diff = [f"{k} {have.get(k)!r} (calibrated with {v!r})" for k, v in want.items()
            if not k.startswith("identity/") and k not in _NOT_COMMITTING and have.get(k) != v]
    if diff:
        raise ValueError(f"the online thresholds of {pred.path} hold for the settings they were chosen with; this run "
                         f"differs in {', '.join(diff)}")


def online_losses(pred, run_dirs) -> tuple[np.ndarray, list[str], np.ndarray, dict]:
    """(thresholds, prompt ids, losses [thresholds, prompts], shared settings) from complete runs of
    ``--policy prefix --lam LAM`` with the one-rotation model ``pred`` on its calibration prompts.
    The loss is :func:`vskip.engine.metrics.prompt_disagreement`, the same function the report
    scores the test prompts with. Refuses runs of another model or of other settings, and a
    threshold whose runs lack any calibration prompt. The settings compared are those of
    :func:`run_settings` (sampling included) and the models each run recorded
    (:func:`run_identity`): the guarantee is for one policy on one pair."""
    from pathlib import Path

    from ...engine.metrics import prompt_disagreement
    from ..rundir import load_run

    cal = set(pred.online_ids[0])
    by_lam: dict[float, list] = {}
    shared = None
    for d in run_dirs:
        check_input_dir(d, "calibration run")
        run = load_run(Path(d))
        cfg = run.run_cfg
        pol = cfg.get("policy") or {}
        if pol.get("name") != "prefix" or pol.get("alpha") is not None or pol.get("survival") != "model":
            raise ValueError(f"{d} is not a run of --policy prefix --predictor ... --lam LAM")
        if Path(str(cfg.get("predictor"))).resolve() not in (Path(pred.path).resolve(), Path(pred.path).resolve().parent):
            raise ValueError(f"{d} decoded with the model at {cfg.get('predictor')}, not {pred.path}")
        s = run_settings(cfg) | run_identity(run.config or {})
        if shared is not None and s != shared:
            diff = [f"{k} {s[k]!r} (the others: {shared.get(k)!r})" for k in s if s[k] != shared.get(k)]
            raise ValueError(f"{d} differs from the other runs in {', '.join(diff)}")
        shared = s
        if not set(run.ids) <= cal:
            raise ValueError(f"{d} decoded prompts outside the calibration folds: {sorted(set(run.ids) - cal)[:3]}")
        by_lam.setdefault(float(pol["lam"]), []).append(run)
    if not by_lam:
        raise ValueError("no calibration runs given")
    ids = sorted(cal)  # all of them: a part chosen by task or by hand would not be exchangeable with the test fold
    grid = np.array(sorted(by_lam, reverse=True))
    losses = np.zeros((len(grid), len(ids)))
    for g, lam in enumerate(grid):
        got = {}
        for run in by_lam[lam]:
            d = prompt_disagreement(run, run.ids)
            if d is None:
                raise ValueError(f"{run.path} has skipped rounds without a shadow L: decode with --shadow")
            got.update(zip(run.ids, d))
        missing = [i for i in ids if i not in got]
        if missing:
            raise ValueError(f"the runs at lam {lam:g} lack {len(missing)} calibration prompts (e.g. {missing[0]}): "
                             "finish them, or leave that threshold out")
        losses[g] = [got[i] for i in ids]
    return grid, ids, losses, shared


def choose_online(path, run_dirs, alphas, delta: float = 0.1) -> dict:
    """Choose the online thresholds of the one-rotation model at ``path`` for each risk of ``alphas``
    from its calibration runs: conformal risk control on the loss's envelope (what ``--alpha``
    decodes with) and Learn then Test at ``delta`` beside it. Writes them into the model's manifest
    and returns the record (also written as ``online.json`` beside it)."""
    import json
    from pathlib import Path

    from ...engine.policy.prefix import crc_online, ltt_fixed_sequence, online_envelope
    from ...files import write_json
    from ..rotations import MANIFEST
    from .model import load_prefix_predictor

    pred = load_prefix_predictor(path)
    grid, ids, losses, shared = online_losses(pred, run_dirs)
    env = online_envelope(grid, losses)
    rows = []
    for alpha in alphas:
        cal = crc_online(grid, losses, alpha)
        ltt, p = ltt_fixed_sequence(grid, losses, alpha, delta)
        rows.append({"alpha": alpha, "lam": None if cal.lam == float("inf") else cal.lam, "crc_bound": cal.bound,
                     "envelope_risk": cal.risk, "ltt_lam": None if ltt == float("inf") else ltt, "ltt_pvalues": p})
    record = {"rotation": pred.online["rotation"], "n_prompts": len(ids), "grid": grid.tolist(),
              "risk": losses.mean(1).tolist(), "envelope_risk": env.mean(1).tolist(),
              "delta": delta, "settings": shared, "choices": rows,
              "runs": [str(d) for d in run_dirs]}
    kdir = Path(pred.path)
    man = json.loads((kdir / MANIFEST).read_text())
    man["online"]["thresholds"] = {f"{r['alpha']:g}": r["lam"] for r in rows}
    man["online"]["settings"] = shared
    write_json(kdir / "online.json", record, indent=1)
    write_json(kdir / MANIFEST, man, indent=1)
    return record
