"""What a step and an n-token call cost on each variant of the native runtime this machine runs,
beside llama.cpp built for the same ISA level, side by side in one run.

For n = 1, 2, 4, 8, 9, 16 and 17 positions after ``--depth`` tokens of real text (HumanEval's
prompts), the time of one verifier call that scores n positions (n = 1 is a greedy step):

- ``native <variant>``: vskip's kernels built for that variant (``avx512vnni``, ``avxvnni``,
  ``avx2``, ``portable``; ``neon-dotprod``, ``neon`` on ARM64), every variant this CPU runs unless
  ``--variants`` names fewer, through the verifier protocol (head and argmax included);
- ``llamacpp <level>``: ``llama-bench -d DEPTH -p n`` of llama.cpp built for that level by
  ``LLAMA_CPP_ISA=<level> bash scripts/llamacpp.sh`` (``native`` is ``-march=native``), for each
  level built here (others are named as not built).

The configurations take turns, every n of one before the next, ``--repeats`` times; the JSON keeps
the median of the repeats' medians and their range, each cost also in the configuration's own
steps. Usage::

    python benchmarks/bench_isa.py --out docs/results/isa/costs

writes ``costs.json`` (the figures) and ``config.json`` (the machine) into ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from bench_runtime import NS, llamacpp_costs, print_costs, protocol_costs, text_tokens

ROOT = Path(__file__).resolve().parents[1]
LEVELS = ("avx512vnni", "avxvnni", "avx2", "portable", "native")


def llamacpp_bin(level: str) -> Path | None:
    """The bin directory of llama.cpp built for ``level`` here, or None."""
    done = subprocess.run(["bash", str(ROOT / "scripts" / "llamacpp.sh"), "path"], capture_output=True, text=True,
                          env=os.environ | {"LLAMA_CPP_ISA": level})
    return Path(done.stdout.strip().splitlines()[-1]) if done.returncode == 0 and done.stdout.strip() else None


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--variants", help="comma-separated variants (default: every one this CPU runs)")
    p.add_argument("--llamacpp", default=",".join(LEVELS),
                   help="comma-separated llama.cpp build levels to measure where built (default: %(default)s)")
    p.add_argument("--depth", type=int, default=256)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--reps", type=int, default=20, help="timed calls per n in one repeat")
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args(argv)

    from vskip.engine.models.embedded import gguf_path
    from vskip.engine.models.load import load_pair
    from vskip.engine.models.native.build import parse_variants
    from vskip.engine.runtime import machine, machine_id, resolve_runtime

    try:
        variants = parse_variants(a.variants)
    except ValueError as e:
        p.error(str(e))
    levels = [lv.strip() for lv in a.llamacpp.split(",") if lv.strip()]
    unknown = [lv for lv in levels if lv not in LEVELS]
    if unknown:
        p.error(f"unknown llama.cpp level(s) {', '.join(unknown)} (one of {', '.join(LEVELS)})")
    benches = {}
    for lv in levels:
        b = llamacpp_bin(lv)
        if b is not None and (b / "llama-bench").exists():
            benches[lv] = b / "llama-bench"
        else:
            print(f"bench_isa: llama.cpp for {lv} is not built here (LLAMA_CPP_ISA={lv} bash scripts/llamacpp.sh)",
                  file=sys.stderr)

    runtime = resolve_runtime("cpu", threads=a.threads, verifier_runtime="native")
    pair = load_pair(runtime, need_drafter=False)
    ver = pair.verifier
    text = text_tokens(pair.tokenizer, a.depth + max(NS))
    runtime.activate()
    names = [f"native {v}" for v in variants] + [f"llamacpp {lv}" for lv in benches]
    rows: dict[str, dict[int, list[float]]] = {k: {n: [] for n in NS} for k in names}
    for rep in range(a.repeats):
        for v in variants:
            ver.net.isa = v
            for n, ms in protocol_costs(ver, text, a.depth, a.reps).items():
                rows[f"native {v}"][n].append(ms)
        for lv, bench in benches.items():
            for n, ms in llamacpp_costs(bench, gguf_path(), a.threads, a.depth, max(3, a.reps // 4)).items():
                rows[f"llamacpp {lv}"][n].append(ms)
        print(f"repeat {rep + 1}/{a.repeats} done", file=sys.stderr)
    ver.net.isa = None
    info = machine(runtime)
    info.pop("runtime", None)  # every variant ran: the rows name theirs
    result = {"machine": info | {"id": machine_id(info)}, "depth": a.depth, "threads": a.threads,
              "repeats": a.repeats, "reps": a.reps, "configs": {}}
    for name, by_n in rows.items():
        med = {n: statistics.median(v) for n, v in by_n.items()}
        result["configs"][name] = {"ms": {str(n): med[n] for n in NS},
                                   "range_ms": {str(n): [min(v), max(v)] for n, v in by_n.items()},
                                   "steps": {str(n): med[n] / med[1] for n in NS}}
    for v in variants:  # each variant against llama.cpp built for its level, where built
        if v in benches:
            mine, theirs = result["configs"][f"native {v}"]["ms"], result["configs"][f"llamacpp {v}"]["ms"]
            result["configs"][f"native {v}"]["x_llamacpp_same_level"] = {n: theirs[n] / mine[n] for n in mine}
    from vskip.files import write_json

    a.out.mkdir(parents=True, exist_ok=True)
    write_json(a.out / "costs.json", result)
    write_json(a.out / "config.json", {"machine": result["machine"], "command": "python benchmarks/bench_isa.py "
                                       + " ".join(argv if argv is not None else sys.argv[1:])})
    print(f"machine: {result['machine']['id']}; depth {a.depth}; {a.repeats} repeats of {a.reps} calls")
    print_costs(result["configs"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
