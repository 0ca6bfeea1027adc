"""Batched decoding on this machine: throughput and per-sequence latency at several batch sizes,
exactness against batch-1 ``ar``, and the verifier's cost per forward at batch B.

Each configuration decodes the same prompts at every batch size; the (configuration, batch size)
cells are run in a rotating order, ``--repeats`` times, so that machine drift falls on all of
them. Throughput is generated tokens over the wall time of the whole set (every slot busy until
the queue runs dry); latency is each prompt's own decode time. A prompt's output is compared
with batch-1 ``ar``; where it differs, the gap between the verifier's top two logits at the first
differing token is recomputed in float64 (a near-tie that the batch's float32 rounding flipped
has a gap far below 1e-4). Usage::

    python benchmarks/bench_batch.py --task humaneval --limit 12 --max-new-tokens 96 \\
        --batch 1,2,4,8 --configs ar,strict,raw --repeats 2 --out docs/results/batching/he12
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

CONFIGS = {
    "ar": ("ar", {}),
    "strict": ("strict", {}),
    "raw": ("raw", {"eta_b": 0.9, "eta_c": 0.93, "k_min": 6, "s_max": 64}),  # the paper's gates
}


def _settings(name: str, gamma: int, max_new: int):
    from vskip.engine.decode import DecodeConfig
    from vskip.engine.models.config import ModelConfig
    from vskip.engine.policy import PolicyConfig
    from vskip.engine.settings import Settings

    policy, params = CONFIGS[name]
    return Settings(PolicyConfig.make(policy, **params), DecodeConfig(gamma=gamma, max_new_tokens=max_new),
                    ModelConfig(device="cpu", dtype="float32", threads=2))


def _run_cell(decoder, prompts, batch: int) -> dict:
    from vskip.engine.decode import Job

    jobs = [Job(ids, task_id=tid) for tid, ids in prompts]
    t = time.perf_counter()
    out = {job.task_id: res for job, res in decoder.decode_many(jobs, batch)}
    wall = time.perf_counter() - t
    tokens = sum(r.generated_tokens for r in out.values())
    return {"wall": wall, "tokens": tokens, "throughput": tokens / wall,
            "latency": {k: r.decode_seconds for k, r in out.items()}, "outputs": {k: r.tokens for k, r in out.items()},
            "calls": sum(r.verifier_calls for r in out.values()), "skipped": sum(r.skipped_rounds for r in out.values())}


def _gap(model, prompt, ref: list[int], got: list[int]) -> float | None:
    """Top-two logit gap (float64) of the verifier at the first position where ``got`` leaves ``ref``."""
    t = next((i for i, (a, b) in enumerate(zip(ref, got)) if a != b), None)
    if t is None:
        return None
    with torch.inference_mode():
        z = model(input_ids=torch.tensor([list(prompt) + ref[:t]])).logits[0, -1].double()
    top = z.topk(2).values
    return float(top[0] - top[1])


def _forward_costs(verifier, batches, gamma: int, ctx: int = 300, reps: int = 6) -> dict:
    """Median seconds of one verifier forward of B sequences x n new positions after ``ctx``
    cached tokens each, n = 1 (a step) and gamma + 1 (a verification)."""
    from vskip.engine.models.protocols import Call

    rng = np.random.default_rng(0)
    out = {}
    for B in batches:
        seqs = [[int(x) for x in rng.integers(100, 20000, ctx)] for _ in range(B)]
        for n in (1, gamma + 1):
            verifier.open_slots(B)
            verifier.score_many([Call(s[:-1], [], slot=i) for i, s in enumerate(seqs)])  # cache the context
            ts = []
            for _ in range(reps):
                calls = [Call(s, [5] * (n - 1), shadow=True, slot=i) for i, s in enumerate(seqs)]
                t = time.perf_counter()
                verifier.score_many(calls)
                ts.append(time.perf_counter() - t)
            out[f"{B}x{n}"] = statistics.median(ts)
    verifier.open_slots(1)
    return out


def table(record: dict) -> str:
    """The results as a table, ending with the machine line (results.md; printed)."""
    from vskip.engine.runtime import machine_id

    names = list(dict.fromkeys(r["config"] for r in record["rows"]))
    lines = ["| config | B | tok/s | range | x ar at B | x B=1 | latency s | = ar at B=1 |", "|---|---|---|---|---|---|---|---|"]
    for r in sorted(record["rows"], key=lambda r: (r["batch"], names.index(r["config"]))):
        lines.append(f"| {r['config']} | {r['batch']} | {r['throughput']:.2f} | {r['throughput_min']:.2f}-"
                     f"{r['throughput_max']:.2f} | {r['x_ar_same_batch'] or 0:.3f} | {r['x_batch1'] or 0:.2f} | "
                     f"{r['latency_median']:.2f} | {r.get('equal_ar1', '-')}/{r.get('n', '-')} |")
    gaps = [f"{r['config']} at B={r['batch']}, {k}: top-two gap {g:.2e}" for r in record["rows"]
            for k, g in (r.get("gaps") or {}).items() if g is not None]
    lines += ["", "Outputs unlike ar at B=1 (float64 gap at the first differing token): " + ("; ".join(gaps) or "none")]
    costs = record["verifier_forward_seconds"]
    one = costs["1x1"]
    lines += ["", "Verifier forward, cost against 1x1: " + ", ".join(f"{k} {v / one:.2f}" for k, v in costs.items()),
              "", f"Machine: {machine_id(record['machine'])}"]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--task", default="humaneval")
    p.add_argument("--limit", type=int, default=16)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--gamma", type=int, default=8)
    p.add_argument("--batch", default="1,2,4,8")
    p.add_argument("--configs", default="ar,strict,raw")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--out", required=True)
    p.add_argument("--summary", action="store_true", help="only rewrite OUT/results.md from OUT/results.json")
    a = p.parse_args(argv)
    if a.summary:
        text = table(json.loads((Path(a.out) / "results.json").read_text()))
        (Path(a.out) / "results.md").write_text(text)
        print(text, end="")
        return 0
    from tqdm import tqdm

    from vskip.bench import tasks
    from vskip.engine.runtime import machine
    from vskip.study.door import open_decoder, open_models

    batches = [int(b) for b in a.batch.split(",")]
    names = [c for c in a.configs.split(",") if c]
    base = _settings("strict", a.gamma, a.max_new_tokens)
    pair = open_models(base.models, True)
    problems = tasks.load_task(a.task, limit=a.limit)
    prompts = [(pr.task_id, tasks.encode_problem(pair.tokenizer, pr)) for pr in problems]
    decoders = {n: open_decoder(_settings(n, a.gamma, a.max_new_tokens), pair=pair) for n in names}
    decoders[names[0]].warmup(prompts[0][1])
    cells = [(n, b) for b in batches for n in names]
    results: dict = {f"{n}@{b}": [] for n, b in cells}
    with tqdm(total=len(cells) * a.repeats, file=sys.stderr) as bar:
        for rep in range(a.repeats):
            k = rep % len(cells)
            for n, b in cells[k:] + cells[:k]:
                results[f"{n}@{b}"].append(_run_cell(decoders[n], prompts, b))
                bar.update(1)
    ref = results.get("ar@1", [None])[0]
    rows = []
    for key, runs in results.items():
        n, b = key.split("@")
        thr = [r["throughput"] for r in runs]
        row = {"config": n, "batch": int(b), "throughput": statistics.median(thr), "throughput_min": min(thr),
               "throughput_max": max(thr), "latency_median": statistics.median(
                   statistics.median(r["latency"].values()) for r in runs),
               "tokens": runs[0]["tokens"], "calls": runs[0]["calls"], "skipped": runs[0]["skipped"]}
        if ref is not None:
            outs = runs[0]["outputs"]
            same = [k for k in outs if outs[k] == ref["outputs"][k]]
            row["equal_ar1"] = len(same)
            row["n"] = len(outs)
            row["gaps"] = {k: _gap(pair.verifier.model, dict(prompts)[k], ref["outputs"][k], outs[k])
                           for k in outs if k not in same and n in ("ar", "strict")}
        rows.append(row)
    for row in rows:
        same_b = next((r for r in rows if r["config"] == "ar" and r["batch"] == row["batch"]), None)
        one = next((r for r in rows if r["config"] == row["config"] and r["batch"] == 1), None)
        row["x_ar_same_batch"] = row["throughput"] / same_b["throughput"] if same_b else None
        row["x_batch1"] = row["throughput"] / one["throughput"] if one else None
    costs = _forward_costs(pair.verifier, batches, a.gamma)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    record = {"command": " ".join(["python", "benchmarks/bench_batch.py", *(argv or sys.argv[1:])]),
              "machine": machine(pair.runtime), "threads": torch.get_num_threads(), "task": a.task, "limit": a.limit,
              "max_new_tokens": a.max_new_tokens, "gamma": a.gamma, "repeats": a.repeats, "rows": rows,
              "verifier_forward_seconds": costs}
    (out / "results.json").write_text(json.dumps(record, indent=1) + "\n")
    (out / "config.json").write_text(json.dumps({"command": record["command"], "machine": record["machine"]},
                                                indent=1) + "\n")  # where the machine of these clocks is read
    text = table(record)
    (out / "results.md").write_text(text)
    print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
