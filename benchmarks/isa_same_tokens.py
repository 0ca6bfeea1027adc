"""Whether every variant of the native runtime this machine runs decodes the same tokens.

For each variant (``--variants``, default every one this CPU runs) and task, ``vskip compare
--preset default --configs ar,strict`` decodes the first ``--limit`` prompts with that variant
forced (``VSKIP_NATIVE_ISA``), into ``OUT/<task>-<variant>`` (resumable: a rerun decodes what is
missing). Then the digests of every prompt's tokens are compared: across variants, configuration
by configuration, and Strict SDD against ``ar`` within each variant. The verdict goes to
``OUT/same_tokens.json`` and is printed. Usage::

    python benchmarks/isa_same_tokens.py --out docs/results/isa/same
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


def rows_of(run: Path) -> dict[tuple[str, str], str]:
    """(task id, configuration) -> token digest of a comparison directory's first repeat."""
    out = {}
    for f in sorted(run.glob("shard-*.jsonl*")):
        raw = gzip.decompress(f.read_bytes()) if f.suffix == ".gz" else f.read_bytes()
        for line in raw.decode().splitlines():
            if line.strip():
                r = json.loads(line)
                if r.get("repeat", 0) == 0:
                    out[(r["task_id"], r["config"])] = r["digest"]
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--variants", help="comma-separated variants (default: every one this CPU runs)")
    p.add_argument("--tasks", default="humaneval,mbpp")
    p.add_argument("--limit", type=int, default=32, help="prompts per task (the first ones)")
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args(argv)

    from vskip.engine.models.native.build import ENV, cannot_run, runnable
    from vskip.files import write_json

    variants = a.variants.split(",") if a.variants else runnable()
    bad = [f"{v}: {cannot_run(v)}" for v in variants if cannot_run(v)]
    if bad:
        p.error("; ".join(bad))
    tasks = a.tasks.split(",")
    for task in tasks:
        for v in variants:
            run = a.out / f"{task}-{v}"
            cmd = [sys.executable, "-m", "vskip", "compare", "--preset", "default", "--task", task, "--limit",
                   str(a.limit), "--max-new-tokens", str(a.max_new_tokens), "--configs", ",".join(CONFIGS),
                   "--threads", str(a.threads), "--out", str(run)]
            print(f"isa_same_tokens: {task} on {v}: {' '.join(cmd[1:])}", file=sys.stderr, flush=True)
            subprocess.run(cmd, check=True, env=os.environ | {ENV: v}, stdout=subprocess.DEVNULL)
    result = {"variants": variants, "tasks": tasks, "prompts_per_task": a.limit, "max_new_tokens": a.max_new_tokens,
              "configs": list(CONFIGS), "by_variant": {}, "differing": []}
    digests = {v: {} for v in variants}
    for task in tasks:
        for v in variants:
            digests[v] |= rows_of(a.out / f"{task}-{v}")
    keys = sorted(digests[variants[0]])
    for v in variants:
        d = digests[v]
        prompts = sorted({t for t, _ in d})
        result["by_variant"][v] = {"decodes": len(d), "prompts": len(prompts),
                                   "strict_equals_ar": sum(d.get((t, "strict")) == d.get((t, "ar")) for t in prompts)}
    for key in keys:
        seen = {v: digests[v].get(key) for v in variants}
        if len(set(seen.values())) != 1:
            result["differing"].append({"task_id": key[0], "config": key[1], "digests": seen})
    result["compared"] = len(keys)
    result["equal_across_variants"] = len(keys) - len(result["differing"])
    a.out.mkdir(parents=True, exist_ok=True)
    write_json(a.out / "same_tokens.json", result)
    print(f"{result['equal_across_variants']}/{result['compared']} decodes ({len(keys) // len(CONFIGS)} prompts x "
          f"{', '.join(CONFIGS)}) give the same tokens on every variant ({', '.join(variants)})")
    for v, r in result["by_variant"].items():
        print(f"  {v}: Strict SDD = ar on {r['strict_equals_ar']}/{r['prompts']} prompts")
    return 0 if not result["differing"] else 1


if __name__ == "__main__":
    sys.exit(main())
