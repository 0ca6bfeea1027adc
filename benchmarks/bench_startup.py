"""How long ``vskip generate`` takes to print, from a cold and from a warm cache.

Each run is a fresh process (``python -m vskip generate PROMPT --max-new-tokens N``) timed from its
start to the first byte it writes on stdout (generate prints the text when the decode is done, so
with one new token this is the start-up: imports, the kernels' build, reading the models, the
prompt's prefill) and to its exit. Three cache states, interleaved, ``--repeats`` times each:

- ``cold``: an empty ``$VSKIP_CACHE`` (the kernels compile, any model conversion runs);
- ``kernels``: the kernels built, no model cached (what a second variant or a cleared model cache sees);
- ``warm``: everything cached, as every run after the first.

Usage::

    python benchmarks/bench_startup.py --out docs/results/startup --repeats 3
    python benchmarks/bench_startup.py --source OTHER_CHECKOUT --out DIR   # another tree's code, same venv
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

PROMPT = "Write a Python function that returns the sum of a list."


def one_run(cache: Path, source: Path | None, new_tokens: int, extra: list[str]) -> dict:
    env = dict(os.environ, VSKIP_CACHE=str(cache))
    if source is not None:
        env["PYTHONPATH"] = str(source) + os.pathsep + env.get("PYTHONPATH", "")
    cmd = [sys.executable, "-m", "vskip", "generate", PROMPT, "--max-new-tokens", str(new_tokens), *extra]
    t0 = time.perf_counter()
    # from the cache's directory: ``python -m`` puts its working directory first on the path, and
    # the checkout's own tree must not shadow --source
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=cache.parent)
    first = proc.stdout.read(1)
    t_first = time.perf_counter() - t0
    rest = proc.stdout.read()
    err = proc.stderr.read().decode(errors="replace")
    rc = proc.wait()
    total = time.perf_counter() - t0
    if rc != 0 or not first:
        raise SystemExit(f"generate failed (rc {rc}): {err[-2000:]}")
    return {"first_s": t_first, "exit_s": total, "text": (first + rest).decode(errors="replace").strip()}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--new-tokens", type=int, default=1)
    p.add_argument("--source", type=Path, default=None, help="import vskip from this checkout instead")
    p.add_argument("--states", default="cold,kernels,warm")
    p.add_argument("extra", nargs="*", help="more generate arguments (after --)")
    a = p.parse_args(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    states = a.states.split(",")
    root = Path(tempfile.mkdtemp(prefix="vskip-startup-"))
    runs: list[dict] = []
    try:
        warm = root / "warm"
        one_run(warm, a.source, a.new_tokens, a.extra)  # fills the warm cache (not timed)
        for rep in range(a.repeats):
            for i in range(len(states)):
                state = states[(i + rep) % len(states)]
                cache = root / f"{state}-{rep}"
                if state == "kernels":
                    shutil.copytree(warm / "native", cache / "native")
                elif state == "warm":
                    cache = warm
                r = one_run(cache, a.source, a.new_tokens, a.extra)
                r |= {"state": state, "repeat": rep}
                runs.append(r)
                print(f"{state:8s} repeat {rep}: first output {r['first_s']:.2f} s, exit {r['exit_s']:.2f} s",
                      flush=True)
                if cache != warm:
                    shutil.rmtree(cache, ignore_errors=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    summary = {}
    for state in states:
        f = [r["first_s"] for r in runs if r["state"] == state]
        summary[state] = {"median_first_s": float(np.median(f)), "min_first_s": float(min(f)),
                          "max_first_s": float(max(f)), "n": len(f)}
        print(f"{state:8s} median {np.median(f):.2f} s [{min(f):.2f}, {max(f):.2f}] over {len(f)}")
    from vskip.files import write_json

    write_json(a.out / "startup.json", {"runs": runs, "summary": summary, "argv": sys.argv[1:]})
    return 0


if __name__ == "__main__":
    sys.exit(main())
