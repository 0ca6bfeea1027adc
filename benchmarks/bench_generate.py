"""Distillation generation throughput: the slot engine (the native runtime's body, continuous
batching) at several slot counts against transformers' batched float32 ``generate``, on the same prompts.

Each configuration decodes training prompts (a fixed sample, every ``len/N``-th, answers of up
to ``--max-new-tokens``) for ``--seconds`` of wall time after a warm-up, and counts the answer
tokens it produced; configurations run in turn, ``--repeats`` times, interleaved. The floor is
the float32 compute of the verifier's weights per token at the machine's measured matrix-product
throughput (``benchmarks/bench_calls.py``'s method), ignoring attention. Usage::

    python benchmarks/bench_generate.py --out docs/results/distill/generate.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch


def _prompts(n: int, tokenizer) -> list[list[int]]:
    from vskip.distill.prompts import build_prompts
    from vskip.engine.prompting import encode_chat

    ps = build_prompts(("stdlib", "codeio", "math"), seed=0)
    step = max(1, len(ps) // n)
    return [encode_chat(tokenizer, p.text) for p in ps[::step][:n]]


def _engine_rate(net, prompts, slots, max_new, eos, seconds) -> dict:
    from vskip.distill.engine import SlotEngine

    eng = SlotEngine(net, slots=slots, max_new_tokens=max_new, eos_id=eos)
    count = [0]
    t0 = [None]
    stop = [False]

    def tick():
        count[0] += 1
        if t0[0] is None and count[0] >= slots:  # all slots filled: measure from here
            t0[0], count[0] = time.perf_counter(), 0
        elif t0[0] is not None and time.perf_counter() - t0[0] > seconds:
            stop[0] = True

    gen = eng.run(((i, p) for i, p in enumerate(prompts)), on_token=tick)
    for _ in gen:
        if stop[0]:
            break
    gen.close()
    return {"tokens": count[0], "seconds": time.perf_counter() - t0[0]}


def _hf_rate(hf, prompts, batch, max_new, eos, seconds) -> dict:
    from vskip.distill.generate import generate_batch

    tokens, t = 0, time.perf_counter()
    i = 0
    while time.perf_counter() - t < seconds:
        rows = generate_batch(hf, prompts[i : i + batch], max_new, eos, eos)
        tokens += sum(len(r["completion"]) for r in rows)
        i = (i + batch) % len(prompts)
    return {"tokens": tokens, "seconds": time.perf_counter() - t}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--slots", default="32,64,128")
    ap.add_argument("--hf-batch", type=int, default=16, help="batch of the transformers baseline (0: skip)")
    ap.add_argument("--prompts", type=int, default=512)
    ap.add_argument("--max-new-tokens", type=int, default=384)
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", help="JSON file to write")
    a = ap.parse_args()

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from vskip.distill.engine import load_causal_lm
    from vskip.engine.models.source import transformers_dir, verifier_dir

    sys.path.insert(0, str(Path(__file__).parent))
    from bench_calls import machine

    from vskip.engine.runtime import Runtime

    Runtime(threads=a.threads).activate()
    vdir = verifier_dir(None)
    tok = AutoTokenizer.from_pretrained(str(vdir))
    prompts = _prompts(a.prompts, tok)
    net = load_causal_lm(vdir, a.threads)
    hf = AutoModelForCausalLM.from_pretrained(str(transformers_dir(None)), dtype=torch.float32).eval() \
        if a.hf_batch else None
    eos = 2
    mach = machine(a.threads)
    s = net.shape  # multiply-adds per token: the layers' products and the head
    params = s.n_layers * (s.dim * (s.n_heads + 2 * s.n_kv) * s.head_dim + s.n_heads * s.head_dim * s.dim
                           + 3 * s.dim * s.ffn) + s.vocab * s.dim
    floor = mach["gemm_float32_GFLOPs"] * 1e9 / (2 * params)
    configs = [f"slots{s}" for s in a.slots.split(",") if s] + ([f"hf{a.hf_batch}"] if a.hf_batch else [])
    rates: dict[str, list[float]] = {c: [] for c in configs}
    for r in range(a.repeats):
        for c in configs if r % 2 == 0 else configs[::-1]:
            if c.startswith("slots"):
                res = _engine_rate(net, prompts, int(c[5:]), a.max_new_tokens, eos, a.seconds)
            else:
                res = _hf_rate(hf, prompts, a.hf_batch, a.max_new_tokens, eos, a.seconds)
            rates[c].append(res["tokens"] / res["seconds"])
            print(f"{c}: {rates[c][-1]:.1f} tok/s ({res['tokens']} tokens, {res['seconds']:.0f} s)", flush=True)
    summary = {
        "settings": {k: v for k, v in vars(a).items() if k != "out"},
        "machine": mach,
        "params_per_token": params,
        "floor_tok_s": floor,
        "configs": {c: {"tok_s": v, "median": statistics.median(v)} for c, v in rates.items()},
    }
    print(f"{'config':<10} {'median tok/s':>12} {'runs':>20} {'x floor':>8}")
    for c, v in rates.items():
        med = statistics.median(v)
        print(f"{c:<10} {med:12.1f} {', '.join(f'{x:.0f}' for x in v):>20} {med / floor:8.2f}")
    print(f"floor (weights' float32 FLOPs only): {floor:.0f} tok/s")
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
