"""``vskip run``: decode a task's prompts with one configuration into a run directory."""

from __future__ import annotations

import argparse
import json

from .flags import add_batch_flag, add_policy_flags, add_task_flag, bounded, settings, task_ids


def register(subparsers) -> None:
    r = subparsers.add_parser("run", help="decode a task's prompts with one configuration and score them")
    add_task_flag(r, required=True, help="the benchmark whose prompts to decode")
    r.add_argument("--limit", type=int, help="first N prompts")
    r.add_argument("--ids", help="comma-separated task ids")
    r.add_argument("--out", required=True, help="run directory (resumable)")
    r.add_argument("--score", action=argparse.BooleanOptionalAction, default=True, help="score by execution")
    r.add_argument("--trace", action="store_true", help="store the A.7 inputs of every block (for predictors)")
    r.add_argument("--quiet", action="store_true", help="no progress bar")
    add_policy_flags(r)
    r.add_argument("--samples-per-prompt", type=bounded(int, 1, 100_000), default=1,
                   help="completions per prompt, each with its own random numbers (pass@k; needs --temperature > 0)")
    add_batch_flag(r)
    r.set_defaults(fn=cmd_run)


def cmd_run(a) -> int:
    from ..study.runner import RunConfig, run

    if a.limit is not None and a.limit < 1:
        raise ValueError(f"--limit must be >= 1, got {a.limit}")
    s = settings(a)
    cfg = RunConfig.of(s, a.task, limit=a.limit, ids=task_ids(a.ids), score=a.score,
                       samples_per_prompt=a.samples_per_prompt, batch_size=a.batch_size)
    summary = run(cfg, a.out, progress=not a.quiet, command=getattr(a, "command_line", None))
    keys = ("task", "policy", "n_prompts", "pass_at_1", "tokens_per_s", "calls_per_token", "blocks_per_token",
            "strict_token", "full_prefix", "skipped_rounds")
    from ..engine.runtime import machine_name

    # a speed figure names its machine (summary.json keeps the ids; the line here is readable)
    machines = [machine_name(m) for m in summary.get("machines") or []]
    print(json.dumps({**{k: summary.get(k) for k in keys}, "machines": machines}))
    return 0
