"""What a step and an n-token call cost on each candidate runtime, side by side on this machine.

For n = 1, 2, 4, 8, 9, 16 and 17 positions after a context of ``--depth`` tokens (256, real text:
HumanEval's prompts), the time of one verifier call that scores n positions (the last committed
token and n - 1 more of the text; n = 1 is a greedy step), on:

- ``native``: vskip's own kernels (:mod:`vskip.engine.models.native`) on the GGUF blocks as they
  ship, through the verifier protocol (the head and the argmax included); ``native-1-thread`` the
  same on one thread;
- ``transformers``: the float32 transformers verifier with the exact head, the reference of the
  committed studies, through the same protocol;
- ``llamacpp``: llama.cpp's ``llama-bench`` (``-d DEPTH -p n``: a prompt of n tokens evaluated
  after DEPTH, which is what a verification of n positions is) on the same GGUF file and threads,
  built by ``scripts/llamacpp.sh`` (left out, and said so, where it is not built).

The runtimes take turns, every n of one before the next, ``--repeats`` times; the page gives the
median of the repeats' medians and their range, each cost also in the runtime's own steps. The
floor of a step is the bytes of weights a call reads over the read bandwidth measured here (a sum
over 1 GiB). Usage::

    python benchmarks/bench_runtime.py --out docs/results/runtime/costs.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

import torch
from bench_calls import _median_ms  # benchmarks/ is on the path of a script run from there

NS = (1, 2, 4, 8, 9, 16, 17)


def _time_ms(f, reps: int) -> float:
    return _median_ms(f, reps)[0]


def text_tokens(tokenizer, n: int) -> list[int]:
    """``n`` tokens of real text (HumanEval prompts one after another): a verifier's logits on
    them are as peaked as in a decode, which the exact head's cost depends on."""
    from vskip.bench import tasks

    ids: list[int] = []
    for p in tasks.load_task("humaneval"):
        ids += tokenizer(p.prompt)["input_ids"]
        if len(ids) >= n:
            return ids[:n]
    raise ValueError(f"HumanEval holds fewer than {n} tokens")


def protocol_costs(verifier, text: list[int], depth: int, reps: int) -> dict[int, float]:
    """Median ms of a call scoring n positions after ``depth`` tokens of ``text`` (the context, then
    n - 1 tokens of the text that follows it), through the Verifier protocol."""
    ctx = text[:depth]
    verifier.reset()
    verifier.score(ctx, [])  # the context, cached once
    out = {}
    for n in NS:
        block = text[depth: depth + n - 1]
        out[n] = _time_ms(lambda: verifier.score(ctx, block), reps)
    return out


def llamacpp_costs(binary: Path, gguf: Path, threads: int, depth: int, reps: int) -> dict[int, float]:
    """llama-bench's mean ms of an n-token evaluation after ``depth`` tokens."""
    cmd = [str(binary), "-m", str(gguf), "-t", str(threads), "-d", str(depth), "-p", ",".join(map(str, NS)),
           "-n", "0", "-r", str(reps), "-o", "json"]
    runs = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)
    return {int(r["n_prompt"]): float(r["avg_ns"]) / 1e6 for r in runs}


def read_bandwidth() -> float:
    x = torch.ones(1 << 28)
    ms = min(_time_ms(lambda: x.sum(), 3) for _ in range(2))
    return x.numel() * 4 / (ms / 1000) / 1e9


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--depth", type=int, default=256)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--reps", type=int, default=20, help="timed calls per n in one repeat")
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args(argv)

    from vskip.engine.models.embedded import gguf_path
    from vskip.engine.models.load import load_pair
    from vskip.engine.runtime import machine, machine_id, resolve_runtime
    from vskip.study.llamacpp import server_binary, version

    native = resolve_runtime("cpu", threads=a.threads, verifier_runtime="native")
    ref = resolve_runtime("cpu", "float32", threads=a.threads)
    loaded = load_pair(native, need_drafter=False)
    one = load_pair(resolve_runtime("cpu", threads=1, verifier_runtime="native"), need_drafter=False).verifier
    one.net.threads = 1  # the same kernels on one thread: what the second thread adds
    runtimes = {"native": loaded.verifier, "native-1-thread": one,
                "transformers": load_pair(ref, need_drafter=False).verifier}
    text = text_tokens(loaded.tokenizer, a.depth + max(NS))
    native.activate()
    server = server_binary()
    bench = server.with_name("llama-bench") if server is not None else None
    if bench is None or not bench.exists():
        print("bench_runtime: llama.cpp is not built here (bash scripts/llamacpp.sh); measuring vskip's runtimes alone",
              file=sys.stderr)
        bench = None
    rows: dict[str, dict[int, list[float]]] = {k: {n: [] for n in NS} for k in [*runtimes, *(["llamacpp"] if bench else [])]}
    for rep in range(a.repeats):
        for name, ver in runtimes.items():
            for n, ms in protocol_costs(ver, text, a.depth, a.reps).items():
                rows[name][n].append(ms)
        if bench:
            for n, ms in llamacpp_costs(bench, gguf_path(), a.threads, a.depth, max(3, a.reps // 4)).items():
                rows["llamacpp"][n].append(ms)
        print(f"repeat {rep + 1}/{a.repeats} done", file=sys.stderr)
    bw = read_bandwidth()
    net = runtimes["native"].net
    result = {
        "machine": machine(native) | {"id": machine_id(machine(native))},
        "depth": a.depth, "threads": a.threads, "repeats": a.repeats, "reps": a.reps,
        "read_GBps": bw,
        "native_weight_bytes": net.nbytes,
        "native_step_floor_ms": net.nbytes / (bw * 1e9) * 1000,
        "llamacpp": version(server) if bench else None,
        "runtimes": {},
    }
    for name, by_n in rows.items():
        med = {n: statistics.median(v) for n, v in by_n.items()}
        result["runtimes"][name] = {
            "ms": {str(n): med[n] for n in NS},
            "range_ms": {str(n): [min(v), max(v)] for n, v in by_n.items()},
            "steps": {str(n): med[n] / med[1] for n in NS},
        }
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"machine: {result['machine']['id']}; read bandwidth {bw:.1f} GB/s; native weights "
          f"{net.nbytes / 1e6:.1f} MB, step floor {result['native_step_floor_ms']:.2f} ms")
    print_costs(result["runtimes"])
    return 0


def print_costs(by_name: dict[str, dict]) -> None:
    """A table of each configuration's ms per n, and the same in its own steps."""
    print("n      " + "".join(f"{name:>24}" for name in by_name))
    for n in NS:
        cells = [f"{c['ms'][str(n)]:8.2f} ms ({c['steps'][str(n)]:4.2f} st)" for c in by_name.values()]
        print(f"{n:<7}" + "".join(f"{c:>24}" for c in cells))


if __name__ == "__main__":
    sys.exit(main())
