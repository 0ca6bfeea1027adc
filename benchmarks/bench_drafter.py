"""Drafter quality under Strict SDD: for each gamma, the mean accepted length L, its histogram,
P(L >= j), generated tokens per verifier call, c_D / c_V, and tokens/s against the verifier's own
greedy decoding (``ar``), all measured in one run on HumanEval prompts. Usage::

    python benchmarks/bench_drafter.py --limit 164 --gammas 8,16,32 --max-new-tokens 256 --out docs/results/drafter
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from tabulate import tabulate
from tqdm import tqdm

from vskip import tasks
from vskip.decode import DecodeConfig, decode, warmup
from vskip.metrics import acceptance_histogram, survival_curve
from vskip.models.load import load_pair
from vskip.policy import PolicyConfig
from vskip.prompting import encode_chat
from vskip.runtime import resolve_runtime


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--limit", type=int, default=20)
    ap.add_argument("--gammas", default="8,16,32")
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--threads", type=int)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--drafter")
    ap.add_argument("--out", help="directory for results.json and results.md")
    a = ap.parse_args(argv)
    gammas = [int(g) for g in a.gammas.split(",")]

    pair = load_pair(resolve_runtime("cpu", a.dtype, a.threads), drafter=a.drafter)
    problems = tasks.load_task("humaneval", limit=a.limit)
    prompts = [encode_chat(pair.tokenizer, tasks.user_prompt(p)) for p in problems]
    warmup(pair.drafter, pair.verifier, prompts[0], max(gammas))
    results = {}
    for name, g in [("ar", 1)] + [("strict", g) for g in gammas]:
        cfg = DecodeConfig(gamma=g, max_new_tokens=a.max_new_tokens, shadow=False)
        N = T = calls = blocks = draft = verify = 0.0
        rounds = []
        for ids in tqdm(prompts, desc=f"{name} gamma={g}", unit="prompt", file=sys.stderr):
            r = decode(ids, pair.drafter, pair.verifier, PolicyConfig(name=name), cfg)
            N += r.generated_tokens
            T += r.decode_seconds
            calls += r.verifier_calls
            blocks += r.draft_blocks
            draft += r.draft_seconds
            verify += r.verify_seconds
            rounds += [{"L": x.L, "gamma": x.gamma} for x in r.rounds]
        key = "ar" if name == "ar" else f"gamma={g}"
        res = {"tokens": int(N), "seconds": T, "tok_s": N / T, "tokens_per_call": N / calls}
        if name != "ar":
            hist = acceptance_histogram(rounds, g)
            full = [x["L"] for x in rounds if x["gamma"] == g]
            res |= {
                "mean_L": sum(full) / len(full),
                "histogram": hist,
                "p_L_ge": survival_curve(hist),
                "c_D_ms": 1000 * draft / blocks,
                "c_V_ms": 1000 * verify / calls,
                "c_D_over_c_V": (draft / blocks) / (verify / calls),
            }
        results[key] = res
    for k, r in results.items():
        r["speedup_vs_ar"] = r["tok_s"] / results["ar"]["tok_s"]
    rows = [[k, r["tokens"], f"{r.get('mean_L', float('nan')):.2f}", f"{r['tokens_per_call']:.2f}",
             f"{r.get('c_D_ms', float('nan')):.1f}", f"{r.get('c_V_ms', float('nan')):.1f}",
             f"{r.get('c_D_over_c_V', float('nan')):.2f}", f"{r['tok_s']:.2f}", f"{r['speedup_vs_ar']:.3f}"]
            for k, r in results.items()]
    table = tabulate(rows, headers=["config", "tokens", "mean L", "tok/call", "c_D ms", "c_V ms", "c_D/c_V", "tok/s", "x ar"])
    head = (f"prompts={len(prompts)} max_new_tokens={a.max_new_tokens} dtype={a.dtype} threads={a.threads} "
            f"drafter={pair.identity.get('drafter')}")
    print(table)
    print(head)
    for k, r in results.items():
        if "p_L_ge" in r:
            print(f"{k}: P(L>=j) j=1.. " + " ".join(f"{p:.2f}" for p in r["p_L_ge"]))
            print(f"{k}: histogram of L " + " ".join(str(c) for c in r["histogram"]))
    if a.out:
        out = Path(a.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "results.json").write_text(json.dumps({"settings": vars(a), "results": results}, indent=1))
        (out / "results.md").write_text(f"```\n{table}\n{head}\n```\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
