"""Speed from a repeated timing (``vskip compare --repeats``) beside a run's single timing.

A sweep times every run once, at its own moment, so its tokens/s ratio to Strict SDD carries the
machine's drift between the two runs. ``vskip compare`` decodes each prompt with every
configuration in a rotating order, several times: the drift falls on all configurations alike. A
report given such comparisons (``vskip report --timing DIR``) finds, for a run, the configuration
of a comparison that decodes as the run did (same task, token budget, batch size, policy and parameters,
predictor, block settings, reveal steps, verifier cache and drafter precision) and takes its speed
against the comparison's ``strict`` from there, paired per prompt over the prompts the comparison
timed. The timed prompts are a subset of the run's; the ratio speaks for that subset. A policy that
reads the clock (the prefix scheduler's cost-aware choice with a measured cost ratio) may decide
otherwise in the comparison than in the run: the same configuration, not the same tokens.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, replace
from pathlib import Path
from typing import Sequence

#: the model settings a timed configuration must share with the run
_MODEL_KEYS = ("drafter", "verifier", "dtype", "device", "drafter_dtype", "copy_prior", "reveal")
#: the decode settings a timed configuration must share with the run (``shadow`` and ``trace`` cost
#: time without changing the tokens: the timing leaves them off)
_DECODE_KEYS = ("gamma", "gamma_max", "min_match", "trim", "drafts")
#: what a decode setting recorded before it existed reads as
_ABSENT = {"drafts": "drafter"}


class Timing:
    """One comparison directory: its settings (``settings.json``) and rows."""

    def __init__(self, path: Path):
        from ..study.compare_summary import rows_of

        self.path = Path(path)
        try:
            s = json.loads((self.path / "settings.json").read_text())
            self.fixed, self.configs = s["fixed"], s["configs"]
        except (OSError, ValueError, KeyError, TypeError):
            raise ValueError(f"{self.path} is not a comparison directory (no readable settings.json)") from None
        self.rows = rows_of(self.path)

    @property
    def task(self) -> str | None:
        return self.fixed.get("task")

    def config_for(self, run_cfg: dict) -> str | None:
        """The name of the configuration that decodes as the run of ``run_cfg`` did, or None."""
        if run_cfg.get("task") != self.task:
            return None
        dec, models = run_cfg.get("decode") or {}, run_cfg.get("models") or {}
        fm = self.fixed.get("models") or {}
        if dec.get("max_new_tokens") != self.fixed.get("max_new_tokens"):
            return None
        if (run_cfg.get("batch_size") or 1) != (self.fixed.get("batch_size") or 1):  # clocks of another batch
            return None
        if any(fm.get(k) != models.get(k) for k in _MODEL_KEYS):
            return None
        for name, c in self.configs.items():
            if c.get("policy") is None or not _same_policy(c, run_cfg.get("policy") or {}):
                continue
            cd = c.get("decode") or {}
            if any(cd.get(k, _ABSENT.get(k)) != dec.get(k, _ABSENT.get(k)) for k in _DECODE_KEYS) or c.get("steps") != models.get("steps"):
                continue
            cache = c.get("cache") if c.get("cache") is not None else fm.get("verifier_cache")
            if cache != models.get("verifier_cache"):
                continue
            if _policy_of(c).learned and not _same_path(c.get("predictor") or self.fixed.get("predictor"),
                                                         run_cfg.get("predictor")):
                continue
            return name
        return None


def _policy_of(c: dict):
    from ..engine.policy import PolicyConfig

    return PolicyConfig.make(c["policy"], **(c.get("params") or {}))


def _same_policy(c: dict, run_policy: dict) -> bool:
    mine = json.loads(json.dumps(asdict(_policy_of(c))))  # tuples become lists, as the run's were read back
    return mine == run_policy


def _same_path(a, b) -> bool:
    return a is not None and b is not None and os.path.normpath(str(a)) == os.path.normpath(str(b))


def load_timings(paths: Sequence[Path]) -> list[Timing]:
    return [Timing(p) for p in paths]


def timed_fields(run_cfgs: Sequence[dict], timings: Sequence[Timing]) -> dict:
    """The speed of the runs of ``run_cfgs`` (one per task; several are pooled over their prompts)
    against Strict SDD from ``timings``: ``timed_tokens_per_s_ratio`` with its interval over
    prompts and each repeat's ratio, the prompts timed and where. Empty where some run has no timed
    configuration, or its comparison has no ``strict``."""
    from ..study.compare_summary import summarize_comparison

    rows, dirs, kept = [], [], 0
    for cfg in run_cfgs:
        hit = next(((t, c) for t in timings if (c := t.config_for(cfg)) is not None and "strict" in t.configs), None)
        if hit is None:
            return {}
        t, name = hit
        mine = [replace(r, config="x") if r.config == name else r for r in t.rows
                if r.config in (name, "strict", "ar")]
        try:  # each task must bring prompts of its own: a pooled figure never stands for one task alone
            k = summarize_comparison(mine)["n_prompts"] if mine else 0
        except ValueError:
            k = 0
        if not k:
            return {}
        kept += k
        rows += mine
        dirs.append(f"{t.path} ({name})")
    try:
        s = summarize_comparison(rows)
    except ValueError:
        return {}
    p = s.get("pairwise", {}).get("x", {}).get("strict")
    if s["n_prompts"] != kept or p is None:  # pooled, every task's prompts are kept (the same repeats in each)
        return {}
    return {"timed_tokens_per_s_ratio": p["ratio"], "timed_tokens_per_s_ratio_ci95": list(p["ci95"]),
            "timed_by_repeat": p.get("by_repeat"), "timed_prompts": s["n_prompts"], "timed_in": dirs}
