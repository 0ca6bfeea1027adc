"""Per-call costs of the embedded pair against their floors, measured on this machine.

For the verifier, c_V(1) (a greedy step) and c_V(gamma + 1) (a verification: the last committed
token and a block); for the drafter, c_D with 1 and 2 reveal steps, each call also encoding three
context tokens its cache lacks, as after a round. Both in float32 and bfloat16, with 1 and 2
threads, after a context of ``--context`` tokens.

Each call's floor is the larger of two times measured here with torch, never a datasheet:
bytes it must read (weights, output head, KV cache) over the machine's read bandwidth (a sum over
1 GiB), and its FLOPs over the machine's matrix-product throughput (a 2048³ product) in that
dtype and thread count. ``x floor`` says how far above it a call runs. Usage::

    python benchmarks/bench_calls.py --out docs/results/speed/calls
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

GAMMAS = (4, 8, 16, 32)


def _median_ms(f, reps: int) -> tuple[float, float]:
    """Median and interquartile range of ``reps`` timed calls (ms), after two untimed ones."""
    f()
    f()
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        f()
        ts.append(1000 * (time.perf_counter() - t))
    q = statistics.quantiles(ts, n=4)
    return statistics.median(ts), q[2] - q[0]


def machine(threads: int) -> dict:
    """Read bandwidth (GB/s) and matrix-product throughput (GFLOP/s, float32 and bfloat16)."""
    from vskip.engine.runtime import Runtime

    Runtime(threads=threads).activate()
    x = torch.ones(1 << 28)  # 1 GiB, touched
    bw = max(x.numel() * 4 / (_median_ms(lambda: x.sum(), 5)[0] / 1000) / 1e9 for _ in range(2))
    del x
    out = {"threads": threads, "read_GBps": bw}
    n = 2048
    for dt in (torch.float32, torch.bfloat16):
        a, b = torch.randn(n, n).to(dt), torch.randn(n, n).to(dt)
        ms = _median_ms(lambda: a @ b, 5)[0]
        out[f"gemm_{str(dt).split('.')[1]}_GFLOPs"] = 2 * n**3 / (ms / 1000) / 1e9
    return out


def _counts(cfg, n_layers: int, head_rows: int, vocab: int, ctx: int, m: int, elsize: int) -> tuple[float, float]:
    """(bytes read, FLOPs) of one forward of ``m`` new positions through ``n_layers`` layers of a
    Llama-layout model after ``ctx`` cached positions, with an output head of ``head_rows`` rows."""
    d, f = cfg["hidden_size"], cfg["intermediate_size"]
    hd = d // cfg["num_attention_heads"]
    kv = cfg["num_key_value_heads"] * hd
    layer = d * d * 2 + d * kv * 2 + 3 * d * f  # q, o, k, v, gate, up, down
    weights = n_layers * layer + head_rows * d
    cache = n_layers * 2 * ctx * kv
    flops = 2 * weights * m + n_layers * 4 * (ctx + m) * d * m
    return (weights + cache) * elsize, flops


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--context", type=int, default=300, help="cached context length (default: 300)")
    ap.add_argument("--reps", type=int, default=9, help="timed calls per measurement (default: 9)")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--steps", default="1,2", help="reveal steps of the drafts (default: 1,2)")
    ap.add_argument("--drafter", nargs="+", metavar="DIR",
                    help="drafter directories to time side by side, each draft call after the other's "
                         "(default: the embedded drafter)")
    ap.add_argument("--out", help="directory for calls.json and calls.md")
    a = ap.parse_args(argv)
    for d in a.drafter or []:
        if not (Path(d) / "drafter.json").exists():
            ap.error(f"--drafter {d}: not a drafter directory (no drafter.json)")
    drafters = a.drafter or [None]

    from tabulate import tabulate

    from vskip.bench import tasks
    from vskip.engine.models.backbone import read_hf_config
    from vskip.engine.models.config import ModelConfig
    from vskip.engine.models.embedded import embedded_verifier_dir
    from vskip.engine.door import open_models
    from vskip.engine.prompting import encode_chat

    cfg = read_hf_config(embedded_verifier_dir())
    rows, machines = [], {}
    for threads in (int(t) for t in a.threads.split(",")):
        mach = machine(threads)
        machines[threads] = mach
        for dtype in a.dtypes.split(","):
            elsize = 4 if dtype == "float32" else 2
            peak = mach[f"gemm_{dtype}_GFLOPs"] * 1e9
            bw = mach["read_GBps"] * 1e9

            def floor_ms(nbytes, flops):
                return 1000 * max(nbytes / bw, flops / peak)

            for steps in (int(x) for x in a.steps.split(",")):
                pairs = [open_models(ModelConfig(drafter=d, device="cpu", dtype=dtype, threads=threads, drafter_dtype=dtype,
                                               steps=steps)) for d in drafters]
                pair = pairs[0]
                ver, dr = pair.verifier, pair.drafter
                prompt = encode_chat(pair.tokenizer, tasks.user_prompt(tasks.load_task("humaneval", limit=1)[0]))
                seq = (prompt * (a.context // len(prompt) + 1))[: a.context]
                alt = seq[:-3] + [t + 1 for t in seq[-3:]]  # three context tokens to re-encode per call
                if steps == 1:
                    ver.reset()
                    ver.score(seq, [])
                    for g in (0, *GAMMAS):
                        block = seq[-g:] if g else []
                        ms, iqr = _median_ms(lambda: ver.score(seq, block), a.reps)
                        nb, fl = _counts(cfg, cfg["num_hidden_layers"], cfg["vocab_size"], cfg["vocab_size"], a.context,
                                         g + 1, elsize)
                        rows.append({"call": f"c_V({g + 1})", "dtype": dtype, "threads": threads, "ms": ms, "iqr": iqr,
                                     "floor_ms": floor_ms(nb, fl), "bytes": nb, "flops": fl})
                for g in GAMMAS:
                    for name, p in zip(drafters, pairs):  # the drafters one after the other at each gamma
                        dr = p.drafter
                        head_rows = dr._W.shape[0]
                        n_layers_d = dr.spec.backbone.num_layers
                        state = {"i": 0}

                        def draft():
                            state["i"] += 1
                            dr.propose(seq if state["i"] % 2 else alt, g)

                        ms, iqr = _median_ms(draft, a.reps)
                        nb, fl = _counts(cfg, n_layers_d, head_rows, cfg["vocab_size"], a.context, g + 1 + 3, elsize)
                        fl = fl + (steps - 1) * _counts(cfg, n_layers_d, head_rows, cfg["vocab_size"], a.context, g + 1,
                                                        elsize)[1]
                        label = f" [{name}, {n_layers_d} layers]" if a.drafter else ""
                        rows.append({"call": f"c_D(gamma {g}, {steps} step{'s' if steps > 1 else ''}){label}",
                                     "dtype": dtype, "threads": threads, "ms": ms, "iqr": iqr,
                                     "floor_ms": floor_ms(nb * steps, fl), "bytes": nb * steps, "flops": fl,
                                     "drafter": name, "drafter_layers": n_layers_d})
                del pair, pairs
            print(f"done: {dtype}, {threads} thread(s)", file=sys.stderr)
    for r in rows:
        r["x_floor"] = r["ms"] / r["floor_ms"]
    text = tabulate([[r["call"], r["dtype"], r["threads"], f"{r['ms']:.1f}", f"{r['iqr']:.1f}", f"{r['floor_ms']:.1f}",
                      f"{r['x_floor']:.1f}"] for r in rows],
                    headers=["call", "dtype", "threads", "median ms", "IQR ms", "floor ms", "x floor"], tablefmt="github")
    mtext = tabulate([[m["threads"], f"{m['read_GBps']:.1f}", f"{m['gemm_float32_GFLOPs']:.0f}",
                       f"{m['gemm_bfloat16_GFLOPs']:.0f}"] for m in machines.values()],
                     headers=["threads", "read GB/s", "fp32 GFLOP/s", "bf16 GFLOP/s"], tablefmt="github")
    print(mtext)
    print()
    print(text)
    if a.out:
        out = Path(a.out)
        out.mkdir(parents=True, exist_ok=True)
        cmd = "python benchmarks/bench_calls.py " + " ".join(sys.argv[1:] if argv is None else argv)
        (out / "calls.json").write_text(json.dumps({"command": cmd, "context": a.context, "reps": a.reps,
                                                     "machine": machines, "rows": rows}, indent=1))
        (out / "calls.md").write_text(f"`{cmd}`\n\n" + mtext + "\n\n" + text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
