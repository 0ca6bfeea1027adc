"""Whether every variant of the native runtime this machine runs decodes the same tokens.

For each variant (``--variants``, default every one this CPU runs) and task, ``vskip compare
--preset default --configs ar,strict`` decodes the first ``--limit`` prompts with that variant
forced (``VSKIP_NATIVE_ISA``), into ``OUT/<task>-<variant>`` (resumable: a rerun decodes what is
missing). Then the digests of every prompt's tokens are compared: across variants, configuration
by configuration, and Strict SDD against ``ar`` within each variant. ``--reference TASK=DIR`` also
compares each variant's ``ar`` with the ``ar`` of an earlier comparison of the same prompts (its
first ``--max-new-tokens`` tokens, where it decoded more): what the kernels computed before they
ran on every CPU. The verdict goes to ``OUT/same_tokens.json`` and is printed. Usage::

    python benchmarks/isa_same_tokens.py --out docs/results/isa/same \
      --reference humaneval=docs/results/runtime/he164-512,mbpp=docs/results/runtime/mbpp200-512
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

CONFIGS = ("ar", "strict")


def rows_of(run: Path, what: str = "digest") -> dict[tuple[str, str], str]:
    """(task id, configuration) -> token digest (or tokens) of a comparison directory's first repeat."""
    out = {}
    for f in sorted(run.glob("shard-*.jsonl*")):
        raw = gzip.decompress(f.read_bytes()) if f.suffix == ".gz" else f.read_bytes()
        for line in raw.decode().splitlines():
            if line.strip():
                r = json.loads(line)
                if r.get("repeat", 0) == 0:
                    out[(r["task_id"], r["config"])] = r[what]
    return out


def verdict(out: Path, tasks: list[str], variants: list[str], refs: dict[str, str], max_new: int) -> dict:
    """What the runs ``out/<task>-<variant>`` say: per variant its decodes and Strict SDD = ar; the
    (task id, configuration) pairs whose tokens differ between variants; against each reference
    directory, how many ``ar`` decodes are the same text (the reference cut where this one stopped)."""
    result = {"variants": variants, "tasks": tasks, "max_new_tokens": max_new, "configs": list(CONFIGS),
              "by_variant": {}, "differing": []}
    digests = {v: {} for v in variants}
    for task in tasks:
        for v in variants:
            digests[v] |= rows_of(out / f"{task}-{v}")
    keys = sorted(set().union(*digests.values()))
    for v in variants:
        d = digests[v]
        prompts = sorted({t for t, _ in d})
        result["by_variant"][v] = {"decodes": len(d), "prompts": len(prompts),
                                   "strict_equals_ar": sum(d.get((t, "strict")) == d.get((t, "ar")) for t in prompts)}
    for key in keys:
        seen = {v: digests[v].get(key) for v in variants}
        if len(set(seen.values())) != 1:
            result["differing"].append({"task_id": key[0], "config": key[1], "digests": seen})
    for task, ref_dir in refs.items():
        ref = {t: tok for (t, c), tok in rows_of(Path(ref_dir), "tokens").items() if c == "ar"}
        for v in variants:
            mine = {t: tok for (t, c), tok in rows_of(out / f"{task}-{v}", "tokens").items() if c == "ar"}
            both = sorted(set(mine) & set(ref))
            # the same text, cut where this decode stopped (its budget, or the end token both reached)
            same = sum(mine[t] == ref[t][:len(mine[t])] and len(mine[t]) in (max_new, len(ref[t])) for t in both)
            by_task = result.setdefault("against_reference", {}).setdefault(task, {"dir": ref_dir})
            by_task[v] = {"prompts": len(both), "same": same}
    result["compared"] = len(keys)
    result["equal_across_variants"] = len(keys) - len(result["differing"])
    return result


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--variants", help="comma-separated variants (default: every one this CPU runs)")
    p.add_argument("--tasks", default="humaneval,mbpp")
    p.add_argument("--limit", type=int, default=32, help="prompts per task (the first ones)")
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--reference", default="", help="TASK=DIR,...: earlier comparisons whose ar to compare with")
    a = p.parse_args(argv)
    refs = dict(x.split("=", 1) for x in a.reference.split(",") if x.strip())

    from vskip.engine.models.native.build import ENV, parse_variants
    from vskip.files import write_json

    try:
        variants = parse_variants(a.variants)
    except ValueError as e:
        p.error(str(e))
    tasks = a.tasks.split(",")
    for task in tasks:
        for v in variants:
            run = a.out / f"{task}-{v}"
            cmd = [sys.executable, "-m", "vskip", "compare", "--preset", "default", "--task", task, "--limit",
                   str(a.limit), "--max-new-tokens", str(a.max_new_tokens), "--configs", ",".join(CONFIGS),
                   "--threads", str(a.threads), "--out", str(run)]
            print(f"isa_same_tokens: {task} on {v}: {' '.join(cmd[1:])}", file=sys.stderr, flush=True)
            subprocess.run(cmd, check=True, env=os.environ | {ENV: v}, stdout=subprocess.DEVNULL)
    result = verdict(a.out, tasks, variants, refs, a.max_new_tokens)
    result["prompts_per_task"] = a.limit
    a.out.mkdir(parents=True, exist_ok=True)
    write_json(a.out / "same_tokens.json", result)
    n = result["compared"] // len(CONFIGS)
    print(f"{result['equal_across_variants']}/{result['compared']} decodes ({n} prompts x {', '.join(CONFIGS)}) "
          f"give the same tokens on every variant ({', '.join(variants)})")
    for v, r in result["by_variant"].items():
        print(f"  {v}: Strict SDD = ar on {r['strict_equals_ar']}/{r['prompts']} prompts")
    for task, by in result.get("against_reference", {}).items():
        print(f"  {task}: ar as {by['dir']} decoded it: " + ", ".join(
            f"{v} {r['same']}/{r['prompts']}" for v, r in by.items() if v != "dir"))
    return 0 if not result["differing"] else 1


if __name__ == "__main__":
    sys.exit(main())
