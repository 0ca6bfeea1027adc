"""Where a comparison's speed-up comes from: the answers that end, and the ones that run to the budget.

A greedy 135M verifier sometimes repeats itself until ``--max-new-tokens``; such an answer
copies from itself, and its rounds commit many tokens. This splits each ``vskip compare`` run
(``--run``, its directory) by whether ``ar``'s answer ran to the budget, and gives per group the
prompts, the tokens, each configuration's seconds, tokens per verifier call and its speed over
``ar`` (total tokens over total seconds, as the comparison's own ratio), over the prompts every
configuration finished. Printed, and written to
``--out`` (JSON). Usage::

    python benchmarks/budget_split.py --run docs/results/payoff/lean-mbpp200-512 \\
        --run docs/results/payoff/lean-he164-512 --out docs/results/payoff/budget-split.json
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

from vskip.files import write_json
from vskip.study.compare_summary import rows_of


def split(run: Path) -> dict:
    settings = json.loads((run / "settings.json").read_text())
    budget = int(settings["fixed"]["max_new_tokens"])
    by_prompt: dict = defaultdict(dict)
    for r in rows_of(run):
        if r.repeat == 0:
            by_prompt[r.task_id][r.config] = r.result
    groups: dict = {}
    for rows in by_prompt.values():
        if "ar" not in rows or len(rows) < len({c for p in by_prompt.values() for c in p}):
            continue  # only the prompts every configuration finished
        name = "to_budget" if rows["ar"].generated_tokens >= budget else "ended"
        g = groups.setdefault(name, {"prompts": 0, "tokens": 0, "configs": defaultdict(lambda: [0.0, 0])})
        g["prompts"] += 1
        g["tokens"] += rows["ar"].generated_tokens
        for config, r in rows.items():
            g["configs"][config][0] += r.decode_seconds
            g["configs"][config][1] += r.verifier_calls
    out = {}
    for name, g in groups.items():
        ar_s = g["configs"]["ar"][0]
        out[name] = {"prompts": g["prompts"], "tokens": g["tokens"], "configs": {
            c: {"seconds": round(s, 2), "tokens_per_call": round(g["tokens"] / calls, 2),
                "ratio_vs_ar": round(ar_s / s, 3)} for c, (s, calls) in g["configs"].items()}}
    return {"budget": budget, "groups": out}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", action="append", required=True, help="a vskip compare directory (repeatable)")
    ap.add_argument("--out", help="where the JSON goes")
    a = ap.parse_args(argv)
    result = {"command": "python benchmarks/budget_split.py " + " ".join(sys.argv[1:] if argv is None else argv),
              "runs": {}}
    for run in map(Path, a.run):
        if not (run / "settings.json").is_file() or not any(run.glob("shard-*.jsonl*")):
            ap.error(f"--run {run}: not a vskip compare directory (no settings.json and shards)")
        result["runs"][run.name] = split(run)
        for name, g in result["runs"][run.name]["groups"].items():
            ratios = ", ".join(f"{c} {v['ratio_vs_ar']}x ({v['tokens_per_call']} tok/call)" for c, v in g["configs"].items()
                               if c != "ar")
            print(f"{run.name}: {name}: {g['prompts']} prompts, {g['tokens']} tokens: {ratios}")
    if a.out:
        write_json(a.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
