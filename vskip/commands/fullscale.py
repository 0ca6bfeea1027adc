"""``vskip fullscale STEP``: the full-scale study's pieces (:mod:`vskip.study.fullscale`), each
ending in files a commit keeps; ``scripts/fullscale.sh`` runs them."""

from __future__ import annotations

from .flags import bounded

#: the pieces (``vskip.study.fullscale.STEPS`` holds them; a test keeps both equal)
STEP_NAMES = ("unpack", "traces", "train", "sweep", "timing", "onpolicy", "onpolicy-check", "onpolicy-sweep", "pack")


def _limit(text: str) -> tuple[str, int]:
    import argparse

    task, _, n = text.partition("=")
    try:
        return task, int(n)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected TASK=N, got {text!r}") from None


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "fullscale", help="a piece of the full-scale study: traces, predictors, sweeps, timings, on-policy rounds",
        description="The full-scale study of docs/results/full.md in pieces that each end in files a commit keeps, "
                    "so that another machine resumes where the last piece stopped. unpack: the committed run "
                    "directories back under --runs; traces: Strict SDD traces of every task; train: the marginal, "
                    "conditional and prefix models and their diagnostics; sweep: --grid on every task; timing: the "
                    "key points timed again, paired per prompt; onpolicy: one on-policy round (--round) of the "
                    "prefix model; onpolicy-check: its thresholds replayed offline; onpolicy-sweep: the round's "
                    "model at the promised risks; pack: the reports and their archives. Run from the repository "
                    "root: the reports record the paths as given.")
    p.add_argument("step", choices=STEP_NAMES, help="the piece to run")
    p.add_argument("--runs", help="where the run directories go (default: runs/full)")
    p.add_argument("--results", help="what is committed: models, timings, reports (default: docs/results/full)")
    p.add_argument("--max-new-tokens", type=bounded(int, 1, 1 << 20), help="output budget (default: 256)")
    p.add_argument("--limit", type=_limit, action="append", metavar="TASK=N",
                   help="the first N prompts of a task of the study (default: all 164 of humaneval, 200 of mbpp)")
    p.add_argument("--grid", help="the grid of `sweep` (default: full)")
    p.add_argument("--round", type=bounded(int, 1, 9), help="the on-policy round the onpolicy steps make or read "
                                                            "(default: 1)")
    p.add_argument("--only", metavar="TASK", help="sweep, timing and onpolicy-sweep on this task alone, so that two "
                                                  "steps can share the machine, one task each")
    p.add_argument("--until", metavar="HH:MM", help="stop sweep, timing, onpolicy and onpolicy-sweep at this local "
                                                    "time (each process loses at most the prompt it was decoding)")
    p.add_argument("--key", metavar="CONFIGS", help="the configurations timed with the verifier's cache")
    p.add_argument("--nocache-key", metavar="CONFIGS", help="the configurations timed without it")
    p.add_argument("--nocache-tasks", metavar="TASKS",
                   help="comma-separated tasks timed without it (default: humaneval)")
    p.set_defaults(fn=cmd_fullscale)


def cmd_fullscale(a) -> int:
    from pathlib import Path

    from ..study import fullscale
    from ..study.jobs import Processes, deadline

    if a.only and a.step not in fullscale.ONE_TASK_STEPS:
        raise ValueError(f"--only narrows {', '.join(fullscale.ONE_TASK_STEPS)}, not {a.step}")
    given = {"runs": a.runs and Path(a.runs), "results": a.results and Path(a.results),
             "max_new_tokens": a.max_new_tokens, "grid": a.grid, "round": a.round, "only": a.only, "key": a.key,
             "nocache_key": a.nocache_key}
    kw = {k: v for k, v in given.items() if v is not None}
    if a.limit:
        limits = dict(fullscale.STUDY_TASKS)
        unknown = [t for t, _ in a.limit if t not in limits]
        if unknown:
            raise ValueError(f"--limit {unknown[0]}: the study's tasks are {', '.join(limits)}")
        kw["limits"] = tuple({**limits, **dict(a.limit)}.items())
    if a.nocache_tasks is not None:
        kw["nocache_tasks"] = tuple(t for t in a.nocache_tasks.split(",") if t)
    fs = fullscale.FullScale(**kw)
    fullscale.STEPS[a.step](fs, Processes(deadline(a.until), what="fullscale"))
    return 0
