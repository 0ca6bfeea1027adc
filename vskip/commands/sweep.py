"""``vskip sweep``: every configuration of a named grid, as resumable units of work."""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

from ..defaults import GAMMA, K_MIN, MAX_NEW_TOKENS, S_MAX, STEPS
from .flags import (add_batch_flag, add_block_flags, add_model_flags, add_sampling_flags, add_task_flag, bounded,
                    decode_config, model_config, task_ids)

#: the named grids of ``vskip sweep`` (``vskip.study.grids.GRIDS`` holds them; a test keeps both equal)
GRID_NAMES = ("table5", "kmin", "gates", "periodic", "transfer", "cpu-small", "cpu-kmin", "cpu-signals", "prefix",
              "promise", "online-cal", "online-test", "full")


def _sweep_flags(s) -> None:
    add_task_flag(s, help="the benchmark whose prompts to decode")
    s.add_argument("--grid", help=f"named grid: {', '.join(GRID_NAMES)}")
    s.add_argument("--out", help="sweep directory: one run directory per configuration, and sweep.json")
    s.add_argument("--list", action="store_true", help="print the grid's configurations and exit")
    s.add_argument("--limit", type=int, help="first N prompts")
    s.add_argument("--ids", help="comma-separated task ids")
    w = s.add_argument_group("execution")
    w.add_argument("--workers", type=bounded(int, 1, 4096), default=1,
                   help="worker processes, each loading the models once (default: 1)")
    w.add_argument("--shards", type=bounded(int, 1, 100_000),
                   help="shards of the prompts per configuration (default: 1 with one worker, else enough to keep "
                        "all workers busy); a resumed sweep keeps the recorded value")
    w.add_argument("--executor", choices=("local", "ray"), default="local", help="local processes or Ray tasks")
    w.add_argument("--address", help="Ray cluster address (default: start a local Ray)")
    w.add_argument("--gpus-per-worker", type=bounded(float, 0.0, 1024.0), default=0.0,
                   help="Ray: GPUs reserved per worker (default: 0)")
    w.add_argument("--score", action=argparse.BooleanOptionalAction, default=True, help="score by execution")
    add_batch_flag(w)
    w.add_argument("--quiet", action="store_true", help="no progress bar")
    g = s.add_argument_group("decoding (shared by every configuration)")
    g.add_argument("--gamma", type=int, default=GAMMA, help=f"draft block length (default: {GAMMA}; the paper: 32)")
    g.add_argument("--steps", type=int, default=STEPS, help=f"diffusion steps per block (default: {STEPS}; the paper: 2)")
    add_block_flags(g)
    g.add_argument("--k-min", type=int, default=K_MIN, help=f"k_min where the grid does not set it (default: {K_MIN})")
    g.add_argument("--s-max", type=int, default=S_MAX, help=f"s_max where the grid does not set it (default: {S_MAX})")
    g.add_argument("--max-new-tokens", type=int, default=MAX_NEW_TOKENS, help=f"output budget (default: {MAX_NEW_TOKENS})")
    g.add_argument("--shadow", action=argparse.BooleanOptionalAction, default=True, help="shadow-verify skipped rounds")
    g.add_argument("--predictor", help="trained survival predictors; without it marginal/conditional are skipped")
    add_sampling_flags(s)
    add_model_flags(s, threads_help="torch CPU threads per worker (default: cores / workers)")



def register(subparsers) -> None:
    s = subparsers.add_parser(
        "sweep", help="run every configuration of a named grid (resumable)",
        description="Run every configuration of a named grid as resumable units (configuration x shard of "
                    "prompts) on local worker processes or Ray; one run directory per configuration under --out.",
    )
    _sweep_flags(s)
    s.set_defaults(fn=cmd_sweep)



def cmd_sweep(a) -> int:
    from ..study.grids import GRIDS, grid
    from ..study.sweep import plan, run_sweep

    if not a.grid:
        raise ValueError(f"--grid is required; expected one of {', '.join(GRIDS)}")
    if a.list:
        for pt in grid(a.grid, k_min=a.k_min, s_max=a.s_max):
            note = "  (needs --predictor)" if pt.policy.learned else ""
            print(f"{pt.name:40s} {pt.role}{note}")
        return 0
    if not a.task or a.out is None:
        raise ValueError("--task and --out are required")
    if a.workers < 1:
        raise ValueError(f"--workers must be >= 1, got {a.workers}")
    if a.shards is not None and a.shards < 1:
        raise ValueError(f"--shards must be >= 1, got {a.shards}")
    if a.limit is not None and a.limit < 1:
        raise ValueError(f"--limit must be >= 1, got {a.limit}")
    decode = decode_config(a)
    lossy = [pt.name for pt in grid(a.grid, k_min=a.k_min, s_max=a.s_max) if pt.policy.lossy_acceptance]
    if lossy and not decode.sampling.greedy:
        raise ValueError(f"grid {a.grid} holds lenience or top-k acceptance ({', '.join(lossy[:3])}...), which takes no "
                         "--temperature; sample with another grid")
    from ..files import check_writable_dir
    from ..engine.door import runtime_of

    models = model_config(a)
    runtime_of(models)  # checks them
    points = grid(a.grid, k_min=a.k_min, s_max=a.s_max)
    ids = task_ids(a.ids)
    check_writable_dir(a.out, "sweep directory")
    if a.score:
        from ..study.runner import check_sandbox

        check_sandbox(a.task)
    n_configs = len(points)
    shards = a.shards or (1 if a.workers == 1 else max(1, math.ceil(a.workers / n_configs)))
    p = plan(a.task, a.grid, decode, models, limit=a.limit, ids=ids, predictor=a.predictor, score=a.score,
             shards=shards, k_min=a.k_min, s_max=a.s_max, batch_size=a.batch_size)
    t0 = time.time()
    summaries = run_sweep(p, Path(a.out), workers=a.workers, executor=a.executor, address=a.address,
                          progress=not a.quiet, command=getattr(a, "command_line", None),
                          gpus_per_worker=a.gpus_per_worker)
    print(json.dumps({"out": str(a.out), "configs": len(summaries), "skipped": [n for n, _ in p.skipped],
                      "seconds": round(time.time() - t0, 1)}))
    return 0
