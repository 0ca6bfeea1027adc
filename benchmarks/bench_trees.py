"""Two source trees of vskip decoding the same prompts, taking turns prompt by prompt.

A change to the decode loop's Python or to the kernels moves a round's time by a few percent,
less than this machine's speed drifts between two runs. So each tree (``--a``, ``--b``: a
checkout, e.g. ``git worktree add /tmp/base HEAD~1``) runs in its own process with its own
decoder, and the two decode prompt i one after the other, the order alternating with i: both
meet the same machine. Every prompt's tokens must be the same in both. Printed and written to
``--out`` (JSON): B's tokens per second over A's with a 95% bootstrap interval over prompts, and
per tree the native forwards, their mean time and the mean time outside them per forward (the
loop's own Python). Usage::

    python benchmarks/bench_trees.py --a /tmp/base --b . --task mbpp --limit 60 \\
        --out docs/results/payoff/trees-mbpp60.json [-- --policy ar]

Arguments after ``--`` go to both decoders' settings (``vskip generate`` flags). The native
runtime must be the verifier's (the forward clock wraps it).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import numpy as np

from vskip.files import write_json

WORKER = r'''
import hashlib, json, sys, time
tree = sys.argv[1]
sys.path.insert(0, tree)
import vskip
assert vskip.__file__.startswith(tree), (vskip.__file__, tree)
from vskip.bench.tasks import encode_problem, load_task
from vskip.commands import build_parser
from vskip.commands.flags import settings
from vskip.engine.door import open_decoder
from vskip.engine.models.native import model
dec = open_decoder(settings(build_parser().parse_args(["generate", "x", "--max-new-tokens", sys.argv[4]] + sys.argv[5:])))
net = [c for c in vars(model).values() if isinstance(c, type) and hasattr(c, "forward") and hasattr(c, "new_cache")][0]
forward, clock = net.forward, [0.0, 0]
def timed(self, *a, **k):
    t = time.perf_counter()
    try:
        return forward(self, *a, **k)
    finally:
        clock[0] += time.perf_counter() - t
        clock[1] += 1
net.forward = timed
prompts = [encode_problem(dec.pair.tokenizer, p) for p in load_task(sys.argv[2], limit=int(sys.argv[3]))]
dec.warmup(prompts[0])
for ids in prompts[:2]:
    dec.decode(ids)
print("ready", flush=True)
for line in sys.stdin:
    i = int(line)
    clock[:] = [0.0, 0]
    t = time.perf_counter()
    r = dec.decode(prompts[i])
    t = time.perf_counter() - t
    digest = hashlib.sha1(json.dumps([int(x) for x in r.tokens]).encode()).hexdigest()[:16]
    print(json.dumps({"t": t, "n": len(r.tokens), "digest": digest, "forward": clock[0], "forwards": clock[1]}), flush=True)
'''


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--a", required=True, help="tree A (the baseline): a directory holding the vskip package")
    ap.add_argument("--b", required=True, help="tree B (the change)")
    ap.add_argument("--task", default="mbpp")
    ap.add_argument("--limit", type=int, default=60)
    ap.add_argument("--max-new-tokens", type=int, default=512)
    ap.add_argument("--out", help="where the JSON goes")
    a = ap.parse_args(argv[: argv.index("--")] if "--" in argv else argv)
    trees = {"A": str(Path(a.a).resolve()), "B": str(Path(a.b).resolve())}
    for name, tree in trees.items():
        if not (Path(tree) / "vskip" / "__init__.py").exists():
            ap.error(f"--{name.lower()} {tree}: no vskip package there")
    procs = {k: subprocess.Popen([sys.executable, "-c", WORKER, tree, a.task, str(a.limit), str(a.max_new_tokens),
                                  *extra], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
             for k, tree in trees.items()}
    for k, p in procs.items():
        if p.stdout.readline().strip() != "ready":
            print(f"tree {k} did not start", file=sys.stderr)
            return 1
    rows = {"A": [], "B": []}
    try:
        for i in range(a.limit):
            for k in ("A", "B") if i % 2 == 0 else ("B", "A"):
                procs[k].stdin.write(f"{i}\n")
                procs[k].stdin.flush()
                line = procs[k].stdout.readline()
                if not line:
                    print(f"tree {k} stopped at prompt {i} (its error is above)", file=sys.stderr)
                    return 1
                rows[k].append(json.loads(line))
            if rows["A"][-1]["digest"] != rows["B"][-1]["digest"]:
                print(f"prompt {i}: the trees decoded different tokens", file=sys.stderr)
                return 1
    finally:
        for p in procs.values():
            p.stdin.close()
            p.wait()
    t = {k: np.array([r["t"] for r in v]) for k, v in rows.items()}
    n = np.array([r["n"] for r in rows["A"]])
    idx = np.random.default_rng(0).integers(0, len(n), (4000, len(n)))
    boot = t["A"][idx].sum(1) / t["B"][idx].sum(1)
    out = {"command": "python benchmarks/bench_trees.py " + " ".join(argv), "task": a.task, "prompts": a.limit,
           "max_new_tokens": a.max_new_tokens, "settings": extra, "same_tokens": True,
           "b_over_a": round(float(t["A"].sum() / t["B"].sum()), 4),
           "ci95": [round(float(np.quantile(boot, q)), 4) for q in (0.025, 0.975)], "trees": {}}
    for k, v in rows.items():
        seconds, fwd, calls = t[k].sum(), sum(r["forward"] for r in v), sum(r["forwards"] for r in v)
        out["trees"][k] = {"tokens_per_s": round(float(n.sum() / seconds), 1), "forwards": int(calls),
                           "forward_ms": round(1e3 * fwd / calls, 3), "outside_ms": round(1e3 * (seconds - fwd) / calls, 3)}
    print(f"B / A tokens per second: {out['b_over_a']} [{out['ci95'][0]}, {out['ci95'][1]}] over {a.limit} prompts, "
          "the same tokens")
    for k, v in out["trees"].items():
        print(f"  {k}: {v['tokens_per_s']} tok/s, {v['forwards']} forwards, {v['forward_ms']} ms each, "
              f"{v['outside_ms']} ms outside per forward")
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        write_json(a.out, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
