"""``vskip score``: score an EvalPlus-style samples file in the sandbox."""

from __future__ import annotations

from pathlib import Path

from .flags import add_task_flag


def register(subparsers) -> None:
    s = subparsers.add_parser("score", help="score an EvalPlus-style samples file in the sandbox")
    add_task_flag(s, required=True, help="the benchmark the samples answer")
    s.add_argument("--samples", required=True, nargs="+", metavar="FILE",
                   help="JSONL (or .jsonl.gz) with task_id and completion (or solution); several files are "
                        "scored as one (the parts of a run)")
    s.add_argument("--out", help="write per-sample results as JSON here")
    s.add_argument("--paired-with", metavar="SCORE_JSON",
                   help="another sampler's score file (vskip score --out) on the same tasks: adds the "
                        "difference of pass@k, paired by task, with a bootstrap interval over tasks")
    s.set_defaults(fn=cmd_score)


def cmd_score(a) -> int:
    import contextlib

    from ..bench.scoring import paired_with, read_score_file, score_samples_file
    from ..files import DirLock, check_output_path, write_json

    lock = contextlib.nullcontext()
    if a.out is not None:  # before scoring: results must not be lost to an unwritable --out
        lock = DirLock(check_output_path(a.out).parent, "directory of --out")
    from ..study.runner import check_sandbox

    check_sandbox(a.task)
    theirs = None if a.paired_with is None else read_score_file(a.paired_with)  # before the scoring, not after
    with lock:
        res = score_samples_file(a.task, a.samples)
        if theirs is not None:
            res["paired"] = paired_with(res, theirs, a.paired_with)
        if a.out is not None:
            write_json(a.out, res)
    print(f"{res['task']}: pass@1 = {res['pass_at_1']:.4f} ({res['passed']}/{res['n']}) sandbox={res['sandbox']}")
    for k, e in res["pass_at_k"].items():
        print(f"  pass@{k} = {e['estimate']:.4f} [{e['ci'][0]:.4f}, {e['ci'][1]:.4f}] over {e['tasks']} tasks, "
              f"{e['samples_per_task']}+ samples each (95% bootstrap over tasks)")
    if (d := res.get("decode")) is not None:
        per_call = "no verifier call" if d["tokens_per_call"] is None else f"{d['tokens_per_call']:.3f} tokens per verifier call"
        print(f"  decode: {d['generated_tokens']} tokens in {d['decode_seconds']:.1f} s ({d['tokens_per_s']:.2f} tokens/s a sequence), "
              f"{per_call} over {d['n_samples']} completions")
    for k, e in res.get("paired", {}).get("pass_at_k", {}).items():
        print(f"  pass@{k} minus {a.paired_with}'s = {e['difference']:+.4f} [{e['ci'][0]:+.4f}, {e['ci'][1]:+.4f}] "
              f"over {e['tasks']} shared tasks (higher on {e['higher']}, lower on {e['lower']})")
    return 0
