"""Strict SDD replayed on held-out distillation answers: what the copy prior buys, without a verifier.

The stored answers are the verifier's own greedy tokens, so a lossless decode of them makes
exactly the rounds this replay makes (:func:`vskip.distill.offline.simulate_strict`). For each
gamma it prints tokens per verifier call of the network alone, of the network with the copy prior,
and, with ``--oracle``, of a per-block oracle that takes whichever of the network, the mixture and
the raw copy hint is accepted furthest: an upper bound on choosing between them block by block.
Usage::

    python benchmarks/replay_copy.py --data DATA --shards shard_00002.safetensors \
        [--answers 48] [--max-new-tokens 64] [--gammas 8,16,32] [--steps 1,2] [--oracle] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
from tqdm import tqdm

from vskip.distill.copyfit import load_answers
from vskip.distill.offline import simulate_strict
from vskip.engine.models.config import ModelConfig
from vskip.engine.models.copy import copy_hint
from vskip.engine.door import open_models
from vskip.engine.policy.acceptance import leading_run


def accepted(draft, ref) -> int:
    return leading_run(np.asarray(draft)[: len(ref)] == ref)


def oracle(drafter, prior, rows, gamma: int, max_new_tokens: int) -> dict:
    calls = tokens = 0
    best = np.zeros(3)
    for row, P in tqdm(rows, desc=f"oracle gamma {gamma}", unit="answer", file=sys.stderr):
        end, b = min(len(row), P + max_new_tokens), P
        while b < end:
            g = min(gamma, end - b)
            ref, seq = row[b : b + g], row[:b].tolist()
            drafter.set_copy_prior(prior)
            mix = accepted(drafter.propose(seq, g).tokens, ref)
            drafter.set_copy_prior(None)
            net = accepted(drafter.propose(seq, g).tokens, ref)
            hint, length = copy_hint(row[:b], g)
            raw = accepted(hint, ref) if length else 0
            Ls = np.array([net, mix, raw])
            best += Ls == Ls.max()
            b += min(int(Ls.max()) + 1, end - b)
            calls += 1
        tokens += end - P
        drafter.reset()
    drafter.set_copy_prior(prior)
    return {"tokens_per_call": tokens / calls, "calls": calls,
            "best_share": dict(zip(("network", "mixture", "hint"), (best / calls).round(3).tolist()))}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", required=True, help="distillation data directory")
    ap.add_argument("--shards", required=True, help="comma-separated held-out shard files")
    ap.add_argument("--drafter", help="drafter directory (default: the embedded drafter)")
    ap.add_argument("--copy-prior", default="auto", help="auto, or a copy-prior file")
    ap.add_argument("--answers", type=int, default=48)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--gammas", default="16")
    ap.add_argument("--steps", default="2", help="comma-separated reveal step counts")
    ap.add_argument("--oracle", action="store_true")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=3)
    ap.add_argument("--out", help="write results.json here")
    a = ap.parse_args(argv)
    pair = open_models(ModelConfig(drafter=a.drafter, device="cpu", dtype="float32", threads=a.threads, copy_prior=a.copy_prior))
    d, prior = pair.drafter, pair.drafter.copy
    if prior is None:
        raise SystemExit("no copy prior: the drafter has no copy_prior.json and none was given")
    rows = load_answers(Path(a.data), [s for s in a.shards.split(",") if s])
    rows = [rows[i] for i in np.random.default_rng(a.seed).permutation(len(rows))[: a.answers]]
    results = {"answers": len(rows), "max_new_tokens": a.max_new_tokens, "shards": a.shards, "runs": []}
    for gamma in (int(g) for g in a.gammas.split(",")):
        for steps in (int(s) for s in a.steps.split(",")):
            d.steps = steps
            row = {"gamma": gamma, "steps": steps}
            for name, p in (("network", None), ("mixture", prior)):
                d.set_copy_prior(p)
                t0 = time.perf_counter()
                r = simulate_strict(d, rows, gamma, a.max_new_tokens)
                row[name] = r | {"draft_ms_per_call": 1000 * (time.perf_counter() - t0) / r["calls"]}
            d.set_copy_prior(prior)
            row["ratio"] = row["mixture"]["tokens_per_call"] / row["network"]["tokens_per_call"]
            print(f"gamma {gamma} steps {steps}: tokens/call network {row['network']['tokens_per_call']:.3f}  "
                  f"with copy prior {row['mixture']['tokens_per_call']:.3f}  ratio {row['ratio']:.3f}  "
                  f"draft ms/call {row['network']['draft_ms_per_call']:.1f} -> {row['mixture']['draft_ms_per_call']:.1f}",
                  flush=True)
            results["runs"].append(row)
        if a.oracle:
            d.steps = 2
            o = oracle(d, prior, rows, gamma, a.max_new_tokens)
            print(f"gamma {gamma}: per-block oracle (network | mixture | hint) {o['tokens_per_call']:.3f} tokens/call, "
                  f"best share {o['best_share']}", flush=True)
            results.setdefault("oracle", {})[str(gamma)] = o
    if a.out:
        Path(a.out).mkdir(parents=True, exist_ok=True)
        (Path(a.out) / "results.json").write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
