"""Paired speed benchmark: Strict SDD against the verifier alone and transformers' own decoders.

Every prompt is decoded by every configuration, one after the other, in an order that rotates from
prompt to prompt, so machine drift falls on all configurations alike. Configurations:

- ``ar``: the verifier's own greedy decoding through vskip's verifier runtime (the reference);
- ``strict``: Strict SDD with the given drafter settings (must equal ``ar`` token for token);
- ``hf``: transformers' greedy ``generate`` on the same model object;
- ``lookupN``: transformers' prompt-lookup assisted generation, ``prompt_lookup_num_tokens=N``.

Results go to ``OUT/shard-I-of-N.jsonl`` a line per (prompt, configuration), so several processes
(``--shard I/N``) split the prompts and a killed run resumes. ``--summarize`` aggregates: tokens/s
as ΣN/ΣT, the ratio to ``ar`` with a bootstrap interval over prompts, tokens per verifier call,
c_D, c_V, the share of decode time outside model forwards, and how many outputs equal ``ar``::

    python benchmarks/bench_speed.py --limit 164 --max-new-tokens 512 --configs ar,strict,lookup10 \\
        --shard 1/2 --threads 1 --out runs/speed &
    python benchmarks/bench_speed.py ... --shard 2/2 ... ; python benchmarks/bench_speed.py --summarize runs/speed
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from pathlib import Path

import numpy as np


def _digest(tokens) -> str:
    return hashlib.sha256(json.dumps([int(t) for t in tokens]).encode()).hexdigest()[:16]


def _hf_generate(pair, ids, max_new, lookup: int | None):
    import torch

    model = pair.verifier.model
    x = torch.tensor([ids], device=pair.verifier.device)
    eos = sorted(pair.verifier.eos_ids)
    kw = {"prompt_lookup_num_tokens": lookup} if lookup else {}
    t = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=max_new, do_sample=False,
                             eos_token_id=eos, pad_token_id=eos[0], **kw)
    seconds = time.perf_counter() - t
    tokens = out[0, len(ids):].tolist()
    return tokens, seconds


def run_shard(a) -> None:
    from tqdm import tqdm

    from vskip import tasks
    from vskip.decode import DecodeConfig, decode, warmup
    from vskip.models.load import load_pair
    from vskip.policy import PolicyConfig
    from vskip.prompting import encode_chat
    from vskip.runtime import resolve_runtime

    configs = [c.strip() for c in a.configs.split(",") if c.strip()]
    i, n = (int(x) for x in a.shard.split("/"))
    if not 1 <= i <= n:
        raise SystemExit(f"--shard must be I/N with 1 <= I <= N, got {a.shard}")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"shard-{i}-of-{n}.jsonl"
    done = set()
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                r = json.loads(line)
            except json.JSONDecodeError:
                continue
            done.add((r["task_id"], r["config"]))
    settings = {k: v for k, v in vars(a).items() if k not in ("shard", "summarize")}
    (out / "settings.json").write_text(json.dumps(settings, indent=1))

    runtime = resolve_runtime("cpu", a.dtype, a.threads, a.drafter_dtype)
    pair = load_pair(runtime, steps=a.steps, copy_prior=a.copy_prior)
    problems = tasks.load_task(a.task, limit=a.limit)
    mine = problems[i - 1 :: n]
    prompts = [(p.task_id, encode_chat(pair.tokenizer, tasks.user_prompt(p))) for p in mine]
    warmup(pair.drafter, pair.verifier, prompts[0][1], a.gamma)
    cfg = DecodeConfig(gamma=a.gamma, max_new_tokens=a.max_new_tokens, shadow=False)
    with open(path, "a") as f:
        for k, (tid, ids) in enumerate(tqdm(prompts, desc=f"shard {i}/{n}", disable=a.quiet)):
            order = configs[k % len(configs):] + configs[: k % len(configs)]
            for name in order:
                if (tid, name) in done:
                    continue
                row = {"task_id": tid, "config": name, "prompt_tokens": len(ids)}
                if name in ("ar", "strict"):
                    r = decode(ids, pair.drafter, pair.verifier, PolicyConfig.make(name), cfg)
                    tokens = r.tokens
                    row |= {"seconds": r.decode_seconds, "calls": r.verifier_calls, "blocks": r.draft_blocks,
                            "draft_seconds": r.draft_seconds, "verify_seconds": r.verify_seconds,
                            "accepted": [x.accepted for x in r.rounds if x.verified and x.gamma]}
                elif name == "hf" or name.startswith("lookup"):
                    lookup = int(name[len("lookup"):]) if name != "hf" else None
                    tokens, seconds = _hf_generate(pair, ids, a.max_new_tokens, lookup)
                    row |= {"seconds": seconds}
                else:
                    raise SystemExit(f"unknown configuration {name!r}")
                row |= {"tokens": len(tokens), "digest": _digest(tokens)}
                f.write(json.dumps(row) + "\n")
                f.flush()


def _bootstrap_ratio(N: np.ndarray, T: np.ndarray, N0: np.ndarray, T0: np.ndarray, reps=2000, seed=0):
    """95% percentile interval of (ΣN/ΣT) / (ΣN0/ΣT0) resampling prompts."""
    rng = np.random.default_rng(seed)
    k = len(N)
    idx = rng.integers(0, k, size=(reps, k))
    r = (N[idx].sum(1) / T[idx].sum(1)) / (N0[idx].sum(1) / T0[idx].sum(1))
    return float(np.percentile(r, 2.5)), float(np.percentile(r, 97.5))


def summarize(a) -> int:
    from tabulate import tabulate

    src = Path(a.summarize)
    rows = [json.loads(line) for p in sorted(src.glob("shard-*.jsonl")) for line in p.read_text().splitlines()
            if line.strip()]
    by = {}
    for r in rows:
        by.setdefault(r["config"], {})[r["task_id"]] = r
    if "ar" not in by:
        raise SystemExit("no ar rows to compare against")
    common = sorted(set.intersection(*(set(v) for v in by.values())))
    ar = by["ar"]
    N0 = np.array([ar[t]["tokens"] for t in common], float)
    T0 = np.array([ar[t]["seconds"] for t in common], float)
    table, out = [], {"n_prompts": len(common), "settings": json.loads((src / "settings.json").read_text()), "configs": {}}
    for name, res in by.items():
        N = np.array([res[t]["tokens"] for t in common], float)
        T = np.array([res[t]["seconds"] for t in common], float)
        same = sum(res[t]["digest"] == ar[t]["digest"] for t in common)
        d = {"tokens": int(N.sum()), "seconds": float(T.sum()), "tokens_per_s": float(N.sum() / T.sum()),
             "ratio_vs_ar": float((N.sum() / T.sum()) / (N0.sum() / T0.sum())),
             "ratio_ci95": _bootstrap_ratio(N, T, N0, T0), "same_as_ar": int(same)}
        if name == "strict":
            calls = sum(res[t]["calls"] for t in common)
            blocks = sum(res[t]["blocks"] for t in common)
            draft = sum(res[t]["draft_seconds"] for t in common)
            verify = sum(res[t]["verify_seconds"] for t in common)
            acc = [x for t in common for x in res[t]["accepted"]]
            d |= {"tokens_per_call": float(N.sum() / calls), "mean_L": float(np.mean(acc)),
                  "c_D_ms": 1000 * draft / blocks, "c_V_ms": 1000 * verify / calls, "c_D_over_c_V": (draft / blocks) / (verify / calls),
                  "outside_forwards": float((T.sum() - draft - verify) / T.sum())}
        if name == "ar":
            calls = sum(res[t]["calls"] for t in common)
            d |= {"c_V_ms": 1000 * sum(res[t]["verify_seconds"] for t in common) / calls,
                  "outside_forwards": float((T.sum() - sum(res[t]["verify_seconds"] for t in common)) / T.sum())}
        out["configs"][name] = d
        lo, hi = d["ratio_ci95"]
        table.append([name, d["tokens"], f"{d['tokens_per_s']:.2f}", f"{d['ratio_vs_ar']:.3f}", f"[{lo:.3f}, {hi:.3f}]",
                      f"{d['same_as_ar']}/{len(common)}", f"{d.get('tokens_per_call', float('nan')):.2f}",
                      f"{d.get('c_D_over_c_V', float('nan')):.3f}", f"{100 * d.get('outside_forwards', float('nan')):.1f}%"])
    text = tabulate(table, headers=["config", "tokens", "tok/s", "x ar", "95% CI (prompts)", "== ar", "tokens/call",
                                    "c_D/c_V", "outside fwd"], tablefmt="github")
    print(text)
    print(f"prompts: {len(common)}; settings: {json.dumps(out['settings'])}")
    if a.out:
        dst = Path(a.out)
        dst.mkdir(parents=True, exist_ok=True)
        (dst / "results.json").write_text(json.dumps(out, indent=1))
        (dst / "results.md").write_text(text + "\n")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--summarize", metavar="DIR", help="aggregate the shard files of DIR instead of running")
    ap.add_argument("--task", default="humaneval")
    ap.add_argument("--limit", type=int)
    ap.add_argument("--max-new-tokens", type=int, default=512)
    ap.add_argument("--gamma", type=int, default=8)
    ap.add_argument("--steps", type=int, default=1)
    ap.add_argument("--copy-prior", default="auto")
    ap.add_argument("--configs", default="ar,strict", help="comma-separated: ar, strict, hf, lookupN")
    ap.add_argument("--dtype", default="float32", help="the verifier's dtype (ar, strict, hf and lookup alike)")
    ap.add_argument("--drafter-dtype", default="auto")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--shard", default="1/1", help="I/N: this process takes prompts I, I+N, ...")
    ap.add_argument("--out", help="run directory (or, with --summarize, where to write results.json/md)")
    ap.add_argument("--quiet", action="store_true")
    a = ap.parse_args(argv)
    if a.summarize:
        return summarize(a)
    if not a.out:
        ap.error("--out is required")
    run_shard(a)
    return 0


if __name__ == "__main__":
    sys.exit(main())
