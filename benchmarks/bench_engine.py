"""Engine benchmark: tokens/s of ar, Strict SDD (verifier cache on and off) and raw-confidence
skipping on HumanEval prompts with the embedded pair, measured in one run on this machine.

Prints ratios to ``ar`` (the verifier's own greedy decoding), verifier calls and draft blocks per
generated token, the share of decode time outside model forwards (T_policy of Eq. 7), and whether
Strict SDD reproduced ``ar`` token for token. Timing follows A.8 (warm-up, synchronised clocks,
ΣN/ΣT). Usage::

    python benchmarks/bench_engine.py --limit 5 --max-new-tokens 128 --threads 2
"""

from __future__ import annotations

import argparse
import json
import sys

from tabulate import tabulate

from vskip import tasks
from vskip.decode import DecodeConfig, decode, warmup
from vskip.models.config import ModelConfig
from vskip.metrics import result_row, summarize
from vskip.models.load import open_pair
from vskip.policy import PolicyConfig
from vskip.prompting import encode_chat

CONFIGS = [
    ("ar", True, {}),
    ("strict", True, {}),
    ("strict", False, {}),
    ("raw", True, {}),
    ("raw", True, {"eta_b": 0.7, "eta_c": 0.7, "k_min": 3}),
]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--limit", type=int, default=5)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--gamma", type=int, default=16)
    ap.add_argument("--threads", type=int)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--drafter")
    ap.add_argument("--json", help="also write the rows here")
    a = ap.parse_args(argv)

    pair = open_pair(ModelConfig(drafter=a.drafter, device="cpu", dtype=a.dtype, threads=a.threads))
    prompts = [encode_chat(pair.tokenizer, tasks.user_prompt(p)) for p in tasks.load_task("humaneval", limit=a.limit)]
    warmup(pair.drafter, pair.verifier, prompts[0], a.gamma)
    cfg = DecodeConfig(gamma=a.gamma, max_new_tokens=a.max_new_tokens)
    rows, outputs = [], {}
    for name, cache, kw in CONFIGS:
        pair.verifier.set_cache(cache)
        policy = PolicyConfig.make(name, **kw)
        outs, samples = [], []
        for ids in prompts:
            r = decode(ids, pair.drafter, pair.verifier, policy, cfg)
            outs.append(r.tokens)
            samples.append(result_row(r))
        s = summarize(samples, [])
        label = f"{name}{'' if cache else ' (no cache)'}{''.join(f' {k}={v}' for k, v in kw.items())}"
        outputs[label] = outs
        rows.append({
            "config": label, "tokens": int(s["generated_tokens"]), "seconds": s["decode_seconds"],
            "tok_s": s["tokens_per_s"], "calls_per_token": s["calls_per_token"],
            "blocks_per_token": s["blocks_per_token"], "c_D_ms": 1000 * s["c_D"] if s["c_D"] is not None else None,
            "c_V_ms": 1000 * s["c_V"], "policy_share": s["policy_share"],
        })
        print(f"done: {label}", file=sys.stderr)
    base = rows[0]["tok_s"]
    for r in rows:
        r["speedup_vs_ar"] = r["tok_s"] / base
    lossless = {k: outputs[k] == outputs["ar"] for k in outputs if k.startswith("strict")}
    print(tabulate(
        [[r["config"], r["tokens"], f"{r['tok_s']:.2f}", f"{r['speedup_vs_ar']:.3f}", f"{r['calls_per_token']:.3f}",
          f"{r['blocks_per_token']:.3f}", "-" if r["c_D_ms"] is None else f"{r['c_D_ms']:.1f}", f"{r['c_V_ms']:.1f}",
          f"{100 * r['policy_share']:.2f}%"] for r in rows],
        headers=["config", "tokens", "tok/s", "x ar", "calls/tok", "blocks/tok", "c_D ms", "c_V ms", "T_policy"],
    ))
    print(f"prompts={len(prompts)} max_new_tokens={a.max_new_tokens} gamma={a.gamma} dtype={a.dtype} "
          f"threads={a.threads} drafter={pair.identity.get('drafter')}")
    print("Strict SDD == ar token for token: " + ", ".join(f"{k}: {v}" for k, v in lossless.items()))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"rows": rows, "lossless": lossless}, f, indent=1)
    return 0 if all(lossless.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
