"""Confirm an install on this machine's devices: build a tiny random Qwen3 verifier and a tiny
Dream drafter (the paper's pair layout, tokenizers differing in special tokens), place them on
different devices (the verifier spread over two GPUs when there are two), and decode 3 HumanEval
prompts with ``ar``, Strict SDD (cache on and off; it must equal ``ar`` token for token) and one
raw-confidence point. Prints the memory plan, tokens/s and peak memory per device; exits 1 if
Strict SDD differs from ``ar``. On a machine without GPUs both models run on the CPU.

    bash scripts/gpu_check.sh [--limit 3] [--max-new-tokens 64] [--out check.json]
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import tempfile
from pathlib import Path

import torch

from vskip.bench import tasks
from vskip.bench.tasks import encode_problem
from vskip.engine.decode import DecodeConfig, decode
from vskip.engine.metrics import PromptResult
from vskip.engine.models import tiny
from vskip.engine.models.config import ModelConfig
from vskip.engine.door import open_models
from vskip.engine.policy import PolicyConfig


def placement() -> tuple[ModelConfig, str]:
    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    common = dict(dtype="float32", drafter_dtype="float32")  # float32: Strict SDD must equal ar exactly
    if n == 0:
        return ModelConfig(device="cpu", **common), "no GPU: both models on the CPU"
    if n == 1:
        return ModelConfig(device="cuda:0", **common), "one GPU: both models on cuda:0"
    free = [torch.cuda.mem_get_info(i)[0] for i in range(2)]
    mm = ",".join(f"{i}={f // (1 << 20)}MiB" for i, f in enumerate(free))
    return (ModelConfig(device="cuda:0", drafter_device="cuda:1", verifier_device="balanced", max_memory=mm, **common),
            f"{n} GPUs: drafter on cuda:1, verifier spread over cuda:0 and cuda:1")


def peak_memory() -> dict[str, float]:
    out = {"cpu_max_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / (1 << 20)}
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            out[f"cuda:{i}_peak_gib"] = torch.cuda.max_memory_allocated(i) / (1 << 30)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--limit", type=int, default=3, help="HumanEval prompts (default: 3)")
    ap.add_argument("--max-new-tokens", type=int, default=64, help="(default: 64)")
    ap.add_argument("--gamma", type=int, default=8, help="(default: 8)")
    ap.add_argument("--out", help="write the results as JSON here")
    a = ap.parse_args(argv)

    models, where = placement()
    print(f"gpu_check: torch {torch.__version__}; {where}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        v = tiny.tiny_qwen3(Path(tmp) / "qwen3", layers=8)
        d = tiny.tiny_dream(Path(tmp) / "dream")
        results, bad = [], 0
        for cache in (True, False):
            m = ModelConfig(**{**models.__dict__, "verifier": str(v), "drafter": str(d), "verifier_cache": cache})
            pair = open_models(m, budget=(2048, a.max_new_tokens, a.gamma))
            if pair.plan.verifier_map:
                used = sorted(set(pair.plan.verifier_map.values()))
                print(f"gpu_check: verifier device map over {', '.join(used)}", flush=True)
            cfg = DecodeConfig(gamma=a.gamma, max_new_tokens=a.max_new_tokens)
            runs = [("ar", PolicyConfig(name="ar")), ("strict", PolicyConfig(name="strict"))]
            if cache:
                runs.append(("raw", PolicyConfig.make("raw", eta_b=0.5, eta_c=0.5, k_min=2)))
            for p in tasks.load_task("humaneval", limit=a.limit):
                ids = encode_problem(pair.tokenizer, p)
                ref = None
                for name, pol in runs:
                    pair.verifier.reset()
                    pair.drafter.reset()
                    res = decode(ids, None if name == "ar" else pair.drafter, pair.verifier, pol, cfg)
                    ref = res.tokens if name == "ar" else ref
                    same = res.tokens == ref
                    if name == "strict" and not same:
                        bad += 1
                    n = res.generated_tokens
                    results.append({"task_id": p.task_id, "policy": name, "verifier_cache": cache,
                                    **PromptResult.of(res).to_json(), "tok_s": n / max(res.decode_seconds, 1e-9),
                                    "equals_ar": same})
            del pair
    print(f"{'prompt':<14} {'policy':<7} {'cache':<5} {'tokens':>6} {'tok/s':>9} {'calls':>5} {'skips':>5}  = ar")
    for r in results:
        print(f"{r['task_id']:<14} {r['policy']:<7} {str(r['verifier_cache']):<5} {r['generated_tokens']:>6} "
              f"{r['tok_s']:>9.1f} {r['verifier_calls']:>5} {r['skipped_rounds']:>5}  "
              f"{'yes' if r['equals_ar'] else 'no'}")
    mem = peak_memory()
    print("peak memory: " + ", ".join(f"{k} {v:.2f}" for k, v in mem.items()))
    verdict = "PASS: Strict SDD equals ar on every prompt" if not bad else f"FAIL: Strict SDD differs from ar on {bad} run(s)"
    print(f"gpu_check: {verdict}")
    if a.out:
        Path(a.out).write_text(json.dumps({"placement": where, "results": results, "memory": mem, "pass": not bad},
                                          indent=1))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
