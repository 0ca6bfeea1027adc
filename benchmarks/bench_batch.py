"""Batched decoding on this machine: throughput and per-sequence latency at several batch sizes,
exactness against batch-1 ``ar``, and the verifier's cost per forward at batch B.

Each configuration decodes the same prompts at every batch size; the (configuration, batch size)
cells are run in a rotating order, ``--repeats`` times, so that machine drift falls on all of
them. Throughput is generated tokens over the wall time of the whole set (every slot busy until
the queue runs dry); latency is each prompt's own decode time. A prompt's output is compared
with batch-1 ``ar``; where it differs, the gap between the verifier's top two logits at the first
differing token is recomputed in float64 (a near-tie that the batch's float32 rounding flipped
has a gap far below 1e-4).

Every forward a cell runs is counted by its shape (the verifier's rows x positions, the drafter's
rows), and the cost of each shape is measured apart (the verifier after 300 cached tokens, the
drafter drafting a block per row): Eq. 7 at batch B predicts each cell's wall time as the sum of
its forwards' costs, set beside the measured one, and Eq. 8 at batch B gives the break-even skip
length from the cost of one more row in the batch. Skipped rounds are not shadow-verified unless
``--shadow`` asks (a shadow forward is real work in a batch's wall time). Usage::

    python benchmarks/bench_batch.py --task humaneval --limit 16 --max-new-tokens 128 \\
        --batch 1,2,4,8,16 --configs ar,strict,raw --repeats 2 --out docs/results/batching/he16
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

#: name -> (policy, its parameters, decode settings over the command's, predictor directory)
CONFIGS = {
    "ar": ("ar", {}, {}, None),
    "strict": ("strict", {}, {}, None),
    "fast": ("strict", {}, {"gamma": 4, "gamma_max": 16, "min_match": 6, "trim": 0.5}, None),
    "raw": ("raw", {"eta_b": 0.9, "eta_c": 0.93, "k_min": 6, "s_max": 64}, {}, None),  # the paper's gates
    # the prefix scheduler at alpha 0.05 with the committed online-calibrated model (decode its test
    # prompts: --ids-file docs/results/online/predictor/ids/humaneval.test; 128 new tokens, gamma 8)
    "prefix": ("prefix", {"alpha": 0.05, "survival": "model", "cost_ratio": 0.22}, {},
               "docs/results/online/predictor/prefix"),
}


def _settings(name: str, gamma: int, max_new: int, shadow: bool = False):
    from vskip.engine.decode import DecodeConfig
    from vskip.engine.models.config import ModelConfig
    from vskip.engine.policy import PolicyConfig
    from vskip.engine.settings import Settings

    policy, params, decode, predictor = CONFIGS[name]
    cfg = DecodeConfig(**{"gamma": gamma, "max_new_tokens": max_new, "shadow": shadow, **decode})
    return Settings(PolicyConfig.make(policy, **params), cfg, ModelConfig(device="cpu", threads=2, steps=1), predictor=predictor)


class Forwards:
    """Counts the forwards of a cell by their shape: the verifier's (rows x positions, the longest
    row's) and the drafter's (rows), wrapping the pair's calls."""

    def __init__(self, pair):
        self.verifier, self.drafter = {}, {}
        v, d = pair.verifier, pair.drafter
        score_many, propose_many = v.score_many, d.propose_many

        def scored(calls):
            key = f"{len(calls)}x{max(len(c.block) for c in calls) + 1}"
            self.verifier[key] = self.verifier.get(key, 0) + 1
            return score_many(calls)

        def proposed(requests, *args, **kw):
            self.drafter[str(len(requests))] = self.drafter.get(str(len(requests)), 0) + 1
            return propose_many(requests, *args, **kw)

        v.score_many, d.propose_many = scored, proposed

    def take(self) -> dict:
        out = {"verifier": dict(self.verifier), "drafter": dict(self.drafter)}
        self.verifier.clear()
        self.drafter.clear()
        return out


def _rss() -> int:
    """This process's resident memory in bytes (Linux)."""
    import os

    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class PeakRss:
    """The highest resident memory while a block runs, sampled every 10 ms by a thread."""

    def __enter__(self):
        import threading

        self.peak, self.stop = _rss(), threading.Event()

        def sample():
            while not self.stop.wait(0.01):
                self.peak = max(self.peak, _rss())

        self.thread = threading.Thread(target=sample, daemon=True)
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()
        self.peak = max(self.peak, _rss())


def _run_cell(decoder, prompts, batch: int, forwards: Forwards) -> dict:
    from vskip.engine.decode import Job

    jobs = [Job(ids, task_id=tid) for tid, ids in prompts]
    forwards.take()
    with PeakRss() as rss:
        t = time.perf_counter()
        out = {job.task_id: res for job, res in decoder.decode_many(jobs, batch)}
        wall = time.perf_counter() - t
    tokens = sum(r.generated_tokens for r in out.values())
    return {"wall": wall, "tokens": tokens, "throughput": tokens / wall,
            "latency": {k: r.decode_seconds for k, r in out.items()}, "outputs": {k: r.tokens for k, r in out.items()},
            "calls": sum(r.verifier_calls for r in out.values()), "skipped": sum(r.skipped_rounds for r in out.values()),
            "forwards": forwards.take(), "peak_rss": rss.peak}


def _gap(model, prompt, ref: list[int], got: list[int]) -> float | None:
    """Top-two logit gap (float64) of the verifier at the first position where ``got`` leaves ``ref``."""
    t = next((i for i, (a, b) in enumerate(zip(ref, got)) if a != b), None)
    if t is None:
        return None
    with torch.inference_mode():
        z = model(input_ids=torch.tensor([list(prompt) + ref[:t]])).logits[0, -1].double()
    top = z.topk(2).values
    return float(top[0] - top[1])


def _forward_costs(verifier, batches, gamma: int, texts: list[list[int]], reps: int = 6) -> dict:
    """Median seconds of one verifier forward of B sequences x n new positions, n = 1 (a step) and
    gamma + 1 (a verification), on real text: row i is ``texts[i]`` (a prompt and its ``ar``
    continuation) with its last gamma + 1 tokens new, the block being the text's own next tokens.
    (Random token ids would make the exact head rescore many near-tied tokens and cost more than
    a decode's forwards do.)"""
    from vskip.engine.models.protocols import Call

    out = {}
    for B in batches:
        rows = [texts[i % len(texts)] for i in range(B)]
        for n in (1, gamma + 1):
            verifier.open_slots(B)
            ctx = [t[: len(t) - gamma - 1] for t in rows]
            verifier.score_many([Call(c, [], slot=i) for i, c in enumerate(ctx)])  # cache the context
            ts = []
            for _ in range(reps):
                calls = [Call(c + t[len(c): len(c) + 1] if n == 1 else c, [] if n == 1 else t[len(c): len(c) + gamma],
                              shadow=True, slot=i) for i, (c, t) in enumerate(zip(ctx, rows))]
                t0 = time.perf_counter()
                verifier.score_many(calls)
                ts.append(time.perf_counter() - t0)
            out[f"{B}x{n}"] = statistics.median(ts)
    verifier.open_slots(1)
    return out


def _draft_costs(drafter, batches, gamma: int, texts: list[list[int]], reps: int = 6) -> dict:
    """Median seconds of one drafter call drafting a block of ``gamma`` for each of B sequences of
    real text (``texts`` as :func:`_forward_costs` reads them), their contexts cached."""
    out = {}
    for B in batches:
        seqs = [texts[i % len(texts)][: len(texts[i % len(texts)]) - gamma - 1] for i in range(B)]
        drafter.reset()
        drafter.propose_many([(i, s, gamma) for i, s in enumerate(seqs)])  # the contexts cached
        ts = []
        for _ in range(reps):
            t = time.perf_counter()
            drafter.propose_many([(i, s, gamma) for i, s in enumerate(seqs)])
            ts.append(time.perf_counter() - t)
        out[str(B)] = statistics.median(ts)
    drafter.reset()
    return out


def _texts(decoders, pair, prompts, gamma: int) -> list[list[int]]:
    """Each prompt with its ``ar`` continuation (decoded side by side), long enough for a block."""
    from vskip.engine.decode import Job

    dec = decoders.get("ar") or next(iter(decoders.values()))
    if dec.settings.policy.name != "ar":
        from vskip.study.door import open_decoder

        dec = open_decoder(_settings("ar", gamma, 128), pair=pair)
    out = [list(j.prompt) + r.tokens for j, r in dec.decode_many([Job(ids, task_id=t) for t, ids in prompts],
                                                                  len(prompts))]
    return [t for t in out if len(t) > 2 * (gamma + 1)]


def _planned_mb(a, prompt_tokens: int, batch: int) -> dict:
    """What ``vskip plan --batch-size B`` plans on this CPU for the decode's caches and activations (MB)."""
    from vskip.engine.models.load import resolve_drafter_dir, resolve_verifier_dir
    from vskip.engine.models.placement import plan_memory

    plan = plan_memory(resolve_verifier_dir(None), resolve_drafter_dir(None), verifier_device="cpu",
                       drafter_device="cpu", dtype="float32", drafter_dtype="float32", prompt_tokens=prompt_tokens,
                       max_new_tokens=a.max_new_tokens, gamma=a.gamma, batch=batch)
    d = plan.devices[0]
    return {"cache": d.cache / 1e6, "activations": d.activations / 1e6}


def _interp(xs: list[int], ys: list[float], x: float) -> float:
    """``ys`` at ``x``, linear between the measured ``xs`` (and beyond them, along the last segment)."""
    if len(xs) == 1:
        return ys[0] * x / xs[0]
    i = max(1, min(len(xs) - 1, int(np.searchsorted(xs, x))))
    x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0)


def cost_model(record: dict) -> dict:
    """Eq. 7 at batch B: a cell's wall time predicted as the sum of its forwards' costs, each
    verifier forward of b rows x n positions at c_V(b, n) and each drafter call of b rows at
    c_D(b), both read off the cost tables (linear in b between the batch sizes measured, linear in
    n between 1 and gamma + 1); and Eq. 8 at batch B, K*(B) = A dc_D / (dc_D + dc_V), with the
    marginal costs of one more row at B and A Strict SDD's tokens per call there."""
    g1 = record["gamma"] + 1
    cv = record["verifier_forward_seconds"]
    cd = record["drafter_call_seconds"]
    bs = sorted({int(k.split("x")[0]) for k in cv})

    def c_V(b, n):
        one = _interp(bs, [cv[f"{x}x1"] for x in bs], b)
        full = _interp(bs, [cv[f"{x}x{g1}"] for x in bs], b)
        return one + (full - one) * (n - 1) / (g1 - 1)

    def c_D(b):
        return _interp(bs, [cd[str(x)] for x in bs], b)

    cells = {}
    for r in record["rows"]:
        f = r.get("forwards")
        if not f:
            continue
        t = sum(k * c_V(*map(int, key.split("x"))) for key, k in f["verifier"].items())
        t += sum(k * c_D(int(b)) for b, k in f["drafter"].items())
        cells[f"{r['config']}@{r['batch']}"] = {"predicted_wall": t, "predicted_throughput": r["tokens"] / t,
                                                 "measured_over_predicted": r["throughput"] / (r["tokens"] / t)}
    marginal = {}
    for lo, B in zip([0] + bs, bs):  # one more row's cost: between the batch sizes measured
        if lo == 0 and B > 1:
            continue
        dv = cv[f"{B}x{g1}"] - (cv[f"{lo}x{g1}"] if lo else 0.0)
        dd = cd[str(B)] - (cd[str(lo)] if lo else 0.0)
        dv, dd = dv / (B - lo), dd / (B - lo)
        st = next((r for r in record["rows"] if r["config"] == "strict" and r["batch"] == B), None)
        A = st["tokens"] / st["calls"] if st and st["calls"] else None
        marginal[str(B)] = {"dc_V": dv, "dc_D": dd, "A": A,
                            "K_star": A * dd / (dd + dv) if A is not None and dd + dv > 0 else None}
    return {"cells": cells, "marginal": marginal}


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
    lines += ["", "Verifier forward, cost against 1x1: " + ", ".join(f"{k} {v / one:.2f}" for k, v in costs.items())]
    if "drafter_call_seconds" in record:
        lines += ["", "Drafter call (a block for each of B rows), cost against the verifier's 1x1: "
                  + ", ".join(f"{k} {v / one:.2f}" for k, v in record["drafter_call_seconds"].items())]
        model = cost_model(record)
        lines += ["", "Eq. 7 at batch B (the forwards each cell ran, at the costs above): measured over predicted "
                  "throughput: " + ", ".join(f"{k} {v['measured_over_predicted']:.2f}" for k, v in model["cells"].items()),
                  "", "Eq. 8 at batch B: one more row's cost (ms) and K*(B) = A dc_D / (dc_D + dc_V): "
                  + "; ".join(f"B={b}: dc_V {1000 * m['dc_V']:.1f}, dc_D {1000 * m['dc_D']:.1f}, A "
                              f"{'-' if m['A'] is None else format(m['A'], '.2f')}, K* "
                              f"{'-' if m['K_star'] is None else format(m['K_star'], '.2f')}"
                              for b, m in model["marginal"].items())]
    if "planned_mb" in record:
        peak = {}
        for r in record["rows"]:
            peak[r["batch"]] = max(peak.get(r["batch"], 0.0), r["peak_rss_mb"] - record["loaded_rss_mb"])
        lines += ["", "Resident memory above the loaded, warmed-up pair (MB) at its peak in the first repeat, which runs the batch "
                  "sizes in increasing order (the allocator keeps what it took), beside what vskip plan "
                  "plans for its caches and activations: " + "; ".join(
                      f"B={b}: {peak[b]:.0f} measured, {p['cache'] + p['activations']:.0f} planned"
                      for b, p in ((int(k), v) for k, v in record["planned_mb"].items()))]
    if "shadow" in record:  # (the first records, all shadow-verified, say nothing of it)
        lines += ["", f"Shadow verification of skipped rounds: {'on' if record['shadow'] else 'off'}"]
    lines += ["", f"Machine: {machine_id(record['machine'])}"]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--task", default="humaneval")
    p.add_argument("--limit", type=int, default=16)
    p.add_argument("--ids-file", help="a file of comma-separated task ids to decode (before --limit)")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--gamma", type=int, default=8)
    p.add_argument("--batch", default="1,2,4,8")
    p.add_argument("--configs", default="ar,strict,raw")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--shadow", action="store_true",
                   help="shadow-verify skipped rounds (off: a skip adds no verifier forward, as a server runs)")
    p.add_argument("--out", required=True)
    p.add_argument("--summary", action="store_true", help="only rewrite OUT/results.md from OUT/results.json")
    p.add_argument("--recost", action="store_true",
                   help="only measure the cost tables again (on real text) for OUT/results.json, and rewrite it")
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
    base = _settings("strict", a.gamma, a.max_new_tokens, a.shadow)
    pair = open_models(base.models, True)
    ids = Path(a.ids_file).read_text().strip().split(",") if a.ids_file else None
    problems = tasks.load_task(a.task, ids=ids)[: a.limit]
    prompts = [(pr.task_id, tasks.encode_problem(pair.tokenizer, pr)) for pr in problems]
    decoders = {n: open_decoder(_settings(n, a.gamma, a.max_new_tokens, a.shadow), pair=pair) for n in names}
    forwards = Forwards(pair)
    decoders[names[0]].warmup(prompts[0][1])
    loaded_rss = _rss()  # the pair loaded and warmed up
    if a.recost:
        out = Path(a.out)
        record = json.loads((out / "results.json").read_text())
        batches = sorted({r["batch"] for r in record["rows"]})
        texts = _texts(decoders, pair, prompts, a.gamma)
        record["verifier_forward_seconds"] = _forward_costs(pair.verifier, batches, a.gamma, texts)
        record["drafter_call_seconds"] = _draft_costs(pair.drafter, batches, a.gamma, texts)
        record["cost_model"] = cost_model(record)
        record["recost_command"] = " ".join(["python", "benchmarks/bench_batch.py", *(argv or sys.argv[1:])])
        (out / "results.json").write_text(json.dumps(record, indent=1) + "\n")
        text = table(record)
        (out / "results.md").write_text(text)
        print(text, end="")
        return 0
    cells = [(n, b) for b in batches for n in names]
    results: dict = {f"{n}@{b}": [] for n, b in cells}
    with tqdm(total=len(cells) * a.repeats, file=sys.stderr) as bar:
        for rep in range(a.repeats):
            k = rep % len(cells)
            for n, b in cells[k:] + cells[:k]:
                results[f"{n}@{b}"].append(_run_cell(decoders[n], prompts, b, forwards))
                bar.update(1)
    ref = results.get("ar@1", [None])[0]
    rows = []
    for key, runs in results.items():
        n, b = key.split("@")
        thr = [r["throughput"] for r in runs]
        row = {"config": n, "batch": int(b), "throughput": statistics.median(thr), "throughput_min": min(thr),
               "throughput_max": max(thr), "latency_median": statistics.median(
                   statistics.median(r["latency"].values()) for r in runs),
               "tokens": runs[0]["tokens"], "calls": runs[0]["calls"], "skipped": runs[0]["skipped"],
               "forwards": runs[0]["forwards"], "peak_rss_mb": runs[0]["peak_rss"] / 1e6}  # the first repeat runs the batch sizes in increasing order
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
    texts = _texts(decoders, pair, prompts, a.gamma)
    costs = _forward_costs(pair.verifier, batches, a.gamma, texts)
    draft_costs = _draft_costs(pair.drafter, batches, a.gamma, texts)
    longest = max(len(ids) for _, ids in prompts)
    planned = {str(b): _planned_mb(a, longest, b) for b in batches}
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    record = {"command": " ".join(["python", "benchmarks/bench_batch.py", *(argv or sys.argv[1:])]),
              "machine": machine(pair.runtime), "threads": torch.get_num_threads(), "task": a.task, "limit": a.limit,
              "max_new_tokens": a.max_new_tokens, "gamma": a.gamma, "repeats": a.repeats, "rows": rows,
              "verifier_forward_seconds": costs, "drafter_call_seconds": draft_costs, "shadow": a.shadow,
              "loaded_rss_mb": loaded_rss / 1e6, "planned_mb": planned}
    record["cost_model"] = cost_model(record)
    (out / "results.json").write_text(json.dumps(record, indent=1) + "\n")
    (out / "config.json").write_text(json.dumps({"command": record["command"], "machine": record["machine"]},
                                                indent=1) + "\n")  # where the machine of these clocks is read
    text = table(record)
    (out / "results.md").write_text(text)
    print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
