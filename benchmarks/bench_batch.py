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

from vskip.defaults import SHAPES
from vskip.files import write_atomic, write_json, write_jsonl

#: name -> (policy, its parameters, decode settings over the command's, predictor directory)
CONFIGS = {
    "ar": ("ar", {}, {}, None),
    "strict": ("strict", {}, {}, None),
    # the same, collecting the A.7 inputs of every block as `vskip run --trace` does (the traces the
    # predictors train on; their writing to the run directory aside): what tracing costs at B
    "strict-trace": ("strict", {}, {"trace": True}, None),
    "fast": ("strict", {}, {"gamma": 4, "gamma_max": 16, "min_match": 6, "trim": 0.5}, None),
    # Strict SDD in the default preset's shape (trimming at 0.3; vskip.defaults.SHAPES["default"])
    "default": ("strict", {}, {k: v for k, v in SHAPES["default"].items() if k in ("gamma", "gamma_max", "min_match",
                                                                                   "trim")}, None),
    "raw": ("raw", {"eta_b": 0.9, "eta_c": 0.93, "k_min": 6, "s_max": 64}, {}, None),  # the paper's gates
    # the prefix scheduler at alpha 0.05 with the committed online-calibrated model (decode its test
    # prompts: --ids-file docs/results/online/predictor/ids/humaneval.test; 128 new tokens, gamma 8)
    "prefix": ("prefix", {"alpha": 0.05, "survival": "model", "cost_ratio": 0.22}, {},
               "docs/results/online/predictor/prefix"),
    # the prefix scheduler at alpha 0.05 with the full-scale round-2 model (5 folds over HumanEval's
    # 164 and MBPP's first 200 prompts, 256 new tokens, gamma 8: docs/results/scheduler.md), so that
    # every prompt of the protocol lies in a test fold
    "prefix-full": ("prefix", {"alpha": 0.05, "survival": "model"}, {}, "docs/results/full/predictors-round2/prefix"),
}
#: a configuration named NAME:padded is NAME with the verifier's and the drafter's rows padded to the
#: longest instead of packed (vskip.engine.models.attention.packed, drafter_batch), to measure what
#: packing buys
PADDED = ":padded"
#: the configurations that must decode batch-1 ``ar``'s tokens (their differing outputs get a gap)
LOSSLESS = ("ar", "strict", "strict-trace", "fast", "default", *(n + PADDED for n in ("ar", "strict", "fast", "default")))


def _settings(name: str, gamma: int, max_new: int, shadow: bool = False, threads: int = 2):
    from vskip.engine.decode import DecodeConfig
    from vskip.engine.models.config import ModelConfig
    from vskip.engine.policy import PolicyConfig
    from vskip.engine.settings import Settings

    policy, params, decode, predictor = CONFIGS[name.removesuffix(PADDED)]
    cfg = DecodeConfig(**{"gamma": gamma, "max_new_tokens": max_new, "shadow": shadow, **decode})
    return Settings(PolicyConfig.make(policy, **params), cfg, ModelConfig(device="cpu", threads=threads, steps=1), predictor=predictor)


class Forwards:
    """Counts the forwards of a cell by their shape, wrapping the pair's calls: the verifier's calls
    (rows x positions, the longest row's block + 1), and where the verifier is vskip's own, each
    forward it ran as it ran it: padded (rows x the longest row's new positions, tokens committed
    by skips included) or packed (rows, and the positions they held in all); the drafter's calls
    (rows), and where the drafter is vskip's own, each forward by rows x query positions (padded to
    the longest row: its block, and the context its cache lacked). Also the seconds spent inside the verifier's and the drafter's calls: what the rest of
    the decode (policy, acceptance, bookkeeping) took is the cell's wall time less these."""

    def __init__(self, pair):
        self.verifier, self.drafter, self.rows, self.packed = {}, {}, {}, {}
        self.seconds = {"verifier": 0.0, "drafter": 0.0}
        v, d = pair.verifier, pair.drafter
        score_many, propose_many = v.score_many, d.propose_many

        def scored(calls):
            key = f"{len(calls)}x{max(len(c.block) for c in calls) + 1}"
            self.verifier[key] = self.verifier.get(key, 0) + 1
            t = time.perf_counter()
            try:
                return score_many(calls)
            finally:
                self.seconds["verifier"] += time.perf_counter() - t

        def proposed(requests, *args, **kw):
            self.drafter[str(len(requests))] = self.drafter.get(str(len(requests)), 0) + 1
            t = time.perf_counter()
            try:
                return propose_many(requests, *args, **kw)
            finally:
                self.seconds["drafter"] += time.perf_counter() - t

        v.score_many, d.propose_many = scored, proposed
        forward_rows = getattr(v, "_forward_rows", None)
        if forward_rows is not None:  # vskip's verifier: each forward as it runs

            def ran(rows, starts):
                news = [len(ids) - n for (_, ids, _), n in zip(rows, starts)]
                b, T = len(rows), max(news)
                if v.packed_forward(news):
                    c = self.packed.setdefault(str(b), [0, 0])
                    c[0], c[1] = c[0] + 1, c[1] + sum(news)
                else:
                    self.rows[f"{b}x{T}"] = self.rows.get(f"{b}x{T}", 0) + 1
                return forward_rows(rows, starts)

            v._forward_rows = ran
        self.counts_rows = forward_rows is not None
        self.drafted, self.drafted_packed = {}, {}
        net = getattr(d, "model", None)
        self.counts_drafts = isinstance(net, torch.nn.Module) and hasattr(d, "_first_hidden")
        if self.counts_drafts:  # vskip's drafter: each forward by rows x query positions, or packed

            def drafting(_module, args):
                pack = args[5] if len(args) > 5 else None
                if pack is not None:  # rows, and the query positions they held in all
                    c = self.drafted_packed.setdefault(str(pack[2]), [0, 0])
                    c[0], c[1] = c[0] + 1, c[1] + args[0].shape[1]
                    return
                key = "x".join(map(str, args[0].shape[:2]))
                self.drafted[key] = self.drafted.get(key, 0) + 1

            net.register_forward_pre_hook(drafting)

    def take(self) -> dict:
        out = {"verifier": dict(self.verifier), "drafter": dict(self.drafter)}
        if self.counts_rows:
            out.update({"verifier_rows": dict(self.rows), "verifier_packed": {k: list(v) for k, v in self.packed.items()},
                        "seconds": dict(self.seconds)})
        if self.counts_drafts:
            out["drafter_rows"] = dict(self.drafted)
            out["drafter_packed"] = {k: list(v) for k, v in self.drafted_packed.items()}
        for part in (self.verifier, self.drafter, self.rows, self.packed, self.drafted, self.drafted_packed):
            part.clear()
        self.seconds = {"verifier": 0.0, "drafter": 0.0}
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


def _run_cell(decoder, prompts, batch: int, forwards: Forwards, name: str = "") -> dict:
    from vskip.engine.decode import Job

    jobs = [Job(ids, task_id=tid) for tid, ids in prompts]
    for model in (decoder.pair.verifier, decoder.pair.drafter):
        if hasattr(model, "pack"):
            model.pack = not name.endswith(PADDED)
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


def _draft_costs(drafter, batches, gamma: int, texts: list[list[int]], reps: int = 6) -> tuple[dict, dict]:
    """Median seconds of one drafter call drafting a block of ``gamma`` for each of B sequences of
    real text (``texts`` as :func:`_forward_costs` reads them): by B, the rows' contexts cached
    (``drafter_call_seconds``); and by B x the query positions of the call's one forward
    (``drafter_forward_seconds``): ``B x (gamma + 1)`` (the last token and the block: the same calls)
    and ``B x 2 (gamma + 1)`` (each row's cache also lacks the gamma + 1 tokens a whole accepted
    block commits, encoded in the same forward, as in a decode)."""
    g1, calls, forwards = gamma + 1, {}, {}
    for B in batches:
        seqs = [texts[i % len(texts)][: len(texts[i % len(texts)]) - g1] for i in range(B)]
        for lacking in (0, g1):
            drafter.reset()
            drafter.propose_many([(i, s, gamma) for i, s in enumerate(seqs)])  # the contexts cached
            ts = []
            for _ in range(reps):
                if lacking:
                    drafter.propose_many([(i, s[:-lacking], gamma) for i, s in enumerate(seqs)])  # the caches cut back
                t = time.perf_counter()
                drafter.propose_many([(i, s, gamma) for i, s in enumerate(seqs)])
                ts.append(time.perf_counter() - t)
            forwards[f"{B}x{g1 + lacking}"] = statistics.median(ts)
        calls[str(B)] = forwards[f"{B}x{g1}"]
    drafter.reset()
    return calls, forwards


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
    marginal costs of one more row at B and A Strict SDD's tokens per call there.

    Where the cells counted the verifier's forwards as they ran (``verifier_rows``: padded, at the
    longest row's new positions; ``verifier_packed``: b rows holding N positions in all, costed as
    b rows of N / b positions, attention's padding aside), those are costed, and the seconds spent
    inside the models' calls are set beside the prediction: the cost model's own error
    (``calls_over_predicted``) apart from what the loop spends outside the models (``outside``).
    Otherwise each verifier call is costed at its rows x (the longest block + 1). Likewise where the
    cells counted the drafter's forwards by rows x query positions (``drafter_rows``; and
    ``drafter_packed``: b rows holding N query positions in all, costed as b rows of N / b) and the
    table has calls of two query lengths (``drafter_forward_seconds``: gamma + 1, and twice that),
    each forward is costed at its shape (linear in the positions, a call of one forward each: one
    reveal step); otherwise each drafter call at c_D(b) of a block of gamma with its context cached."""
    g1 = record["gamma"] + 1
    cv = record["verifier_forward_seconds"]
    cd = record["drafter_call_seconds"]
    bs = sorted({int(k.split("x")[0]) for k in cv})

    def one(b):
        return _interp(bs, [cv[f"{x}x1"] for x in bs], b)

    def slope(b):  # per position beyond the first
        return (_interp(bs, [cv[f"{x}x{g1}"] for x in bs], b) - one(b)) / (g1 - 1)

    def c_V(b, n):
        return one(b) + slope(b) * (n - 1)

    def c_D(b):
        return _interp(bs, [cd[str(x)] for x in bs], b)

    cdf = record.get("drafter_forward_seconds")

    def c_D_at(b, n, k=1):  # k drafter calls of b rows whose one forward ran n query positions per row, in all
        short, long_ = (_interp(bs, [cdf[f"{x}x{m}"] for x in bs], b) for m in (g1, 2 * g1))
        return k * short + (long_ - short) * (n - k * g1) / g1

    cells = {}
    for r in record.get("model_rows") or record["rows"]:
        f = r.get("forwards")
        if not f:
            continue
        if "verifier_rows" in f:
            tv = sum(k * c_V(*map(int, key.split("x"))) for key, k in f["verifier_rows"].items())
            tv += sum(k * one(int(b)) + slope(int(b)) * (n / int(b) - k) for b, (k, n) in f["verifier_packed"].items())
        else:
            tv = sum(k * c_V(*map(int, key.split("x"))) for key, k in f["verifier"].items())
        drafts_counted = "drafter_rows" in f and cdf is not None
        if drafts_counted:
            td = sum(k * c_D_at(*map(int, key.split("x"))) for key, k in f["drafter_rows"].items())
            td += sum(c_D_at(int(b), n / int(b), k) for b, (k, n) in f.get("drafter_packed", {}).items())
        else:
            td = sum(k * c_D(int(b)) for b, k in f["drafter"].items())
        t = tv + td
        wall = r.get("wall") or r["tokens"] / r["throughput"]
        cell = {"predicted_wall": t, "predicted_throughput": r["tokens"] / t, "measured_over_predicted": t / wall,
                "predicted_verifier": tv, "predicted_drafter": td, "forwards_counted": "verifier_rows" in f,
                "drafts_counted": drafts_counted}
        if "seconds" in f:
            inside = f["seconds"]["verifier"] + f["seconds"]["drafter"]
            cell.update({"seconds": f["seconds"], "calls_over_predicted": inside / t, "outside": 1 - inside / wall,
                         "verifier_over_predicted": f["seconds"]["verifier"] / tv if tv else None,
                         "drafter_over_predicted": f["seconds"]["drafter"] / td if td else None})
        cells[f"{r['config']}@{r['batch']}"] = cell
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
                     f"{r['throughput_max']:.2f} | {_num(r['x_ar_same_batch'], '.3f')} | {_num(r['x_batch1'], '.2f')} | "
                     f"{r['latency_median']:.2f} | {r.get('equal_ar1', '-')}/{r.get('n', '-')} |")
    return "\n".join(lines + _footer(record, machine_id(record["machine"]))) + "\n"


def _num(x, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def _footer(record: dict, machine: str) -> list[str]:
    """The lines under a results table: the gaps of outputs unlike batch-1 ``ar``, the cost tables,
    Eq. 7 and Eq. 8 at batch B, memory, shadow verification, and the machine line."""
    lines = []
    gaps = [f"{r['config']} at B={r['batch']}, {k}: top-two gap {g:.2e}" for r in record["rows"]
            for k, g in (r.get("gaps") or {}).items() if g is not None]
    lines += ["", "Outputs unlike ar at B=1 (float64 gap at the first differing token): " + ("; ".join(gaps) or "none")]
    if "verifier_forward_seconds" not in record:
        return lines + ["", "Cost tables: not measured on this machine yet", "", f"Machine: {machine}"]
    costs = record["verifier_forward_seconds"]
    one = costs["1x1"]
    lines += ["", "Verifier forward, cost against 1x1: " + ", ".join(f"{k} {v / one:.2f}" for k, v in costs.items())]
    if "drafter_call_seconds" in record:
        lines += ["", "Drafter call (a block for each of B rows), cost against the verifier's 1x1: "
                  + ", ".join(f"{k} {v / one:.2f}" for k, v in record["drafter_call_seconds"].items())]
        if "drafter_forward_seconds" in record:
            lines += ["", "Drafter call by its forward's rows x query positions (the context cached; each row also "
                      "encoding a whole block's committed tokens), cost against the verifier's 1x1: "
                      + ", ".join(f"{k} {v / one:.2f}" for k, v in record["drafter_forward_seconds"].items())]
        model = cost_model(record)
        cells = model["cells"]
        counted = all(v["forwards_counted"] for v in cells.values()) and cells
        which = ("each verifier forward as it ran, packed or padded" + (
            f", in chunks {', '.join(map(str, record['model_chunks']))}" if "model_chunks" in record else "")
            if counted else "each verifier call at its rows x (longest block + 1)")
        if cells and all(v["drafts_counted"] for v in cells.values()):
            which += "; each drafter forward at its rows x query positions"
        lines += ["", f"Eq. 7 at batch B (the forwards each cell ran, at the costs above; {which}): measured over "
                  "predicted throughput: " + ", ".join(f"{k} {v['measured_over_predicted']:.2f}" for k, v in cells.items())]
        if all("seconds" in v for v in cells.values()) and cells:
            def over(x):
                return "-" if x is None else f"{x:.2f}"

            lines += ["", "Inside the models' calls, seconds measured over predicted: all calls (the verifier's, the "
                      "drafter's; the share of the wall time spent outside the calls): " + ", ".join(
                          f"{k} {v['calls_over_predicted']:.2f} ({over(v['verifier_over_predicted'])}, "
                          f"{over(v['drafter_over_predicted'])}; {100 * v['outside']:.0f}%)" for k, v in cells.items())]
        lines += [
                  "", "Eq. 8 at batch B: one more row's cost (ms) and K*(B) = A dc_D / (dc_D + dc_V): "
                  + "; ".join(f"B={b}: dc_V {1000 * m['dc_V']:.1f}, dc_D {1000 * m['dc_D']:.1f}, A "
                              f"{'-' if m['A'] is None else format(m['A'], '.2f')}, K* "
                              f"{'-' if m['K_star'] is None else format(m['K_star'], '.2f')}"
                              for b, m in model["marginal"].items())]
    if "planned_mb" in record:
        peak = {}
        for r in record["rows"]:
            peak[r["batch"]] = max(peak.get(r["batch"], 0.0), r["peak_rss_mb"] - record["loaded_rss_mb"])
        when = ("at B: each configuration's lowest peak over its cells at B (a cell's peak holds what the allocator "
                "kept from the larger batches the process ran before it: an upper bound), the highest of the "
                "configurations" if "chunks" in record else "at its peak in the first "
                "repeat, which runs the batch sizes in increasing order (the allocator keeps what it took)")
        lines += ["", f"Resident memory above the loaded, warmed-up pair (MB) {when}, beside what vskip plan "
                  "plans for its caches and activations: " + "; ".join(
                      f"B={b}: {peak[b]:.0f} measured, {p['cache'] + p['activations']:.0f} planned"
                      for b, p in ((int(k), v) for k, v in record["planned_mb"].items()))]
    if "shadow" in record:  # (the first records, all shadow-verified, say nothing of it)
        lines += ["", f"Shadow verification of skipped rounds: {'on' if record['shadow'] else 'off'}"]
    lines += ["", f"Machine: {machine}"]
    return lines


# --------------------------------------------------------------------------- the full protocol, in chunks
#
# A study of hundreds of prompts at every batch size takes longer than a sitting: ``--chunk-size N``
# cuts the prompts into contiguous chunks of about N and runs every (configuration, batch size)
# cell on one chunk, in an order that rotates from chunk to chunk, before the next chunk. Each
# cell is a line of OUT/cells.jsonl as soon as it ends, so a killed or ``--until``-stopped run goes
# on from the cells it has; a chunk begun on another machine is begun again (its clocks would be
# set against this machine's). The summary pools the complete chunks of each machine: tokens/s as
# the sum of tokens over the sum of wall times, each ratio with a 95% bootstrap interval over chunks
# (the chunk is the unit a batch's throughput is measured on), per-sequence latency over prompts,
# equality with batch-1 ``ar`` over prompts.

PROTOCOL = "protocol.json"
CELLS = "cells.jsonl"
GAPS = "gaps.jsonl"
COSTS = "costs.json"
#: the settings a protocol directory keeps; a run that differs in one is refused
PROTOCOL_KEYS = ("task", "ids_file", "limit", "max_new_tokens", "gamma", "batch", "configs", "repeats", "shadow",
                 "chunk_size", "threads")


def chunks_of(items: list, size: int) -> list[list]:
    """``items`` in ceil(n / size) contiguous chunks whose sizes differ by one at most."""
    if size < 1:
        raise ValueError(f"--chunk-size must be >= 1, got {size}")
    n = len(items)
    k = max(1, -(-n // size))
    return [items[i * n // k: (i + 1) * n // k] for i in range(k)]


def cell_order(names: list[str], batches: list[int], chunk: int, repeat: int, repeats: int) -> list[tuple[str, int]]:
    """The (configuration, batch size) cells of one chunk's repeat, the first one rotating with
    each chunk and repeat so that drift within a chunk falls on every cell alike."""
    cells = [(n, b) for b in batches for n in names]
    k = (chunk * repeats + repeat) % len(cells)
    return cells[k:] + cells[:k]


def _read_jsonl(path: Path) -> list[dict]:
    """The whole rows of PATH, or of PATH.gz as committed where PATH is absent (a last line cut by
    a kill is dropped: its cell runs again)."""
    from vskip.files import read_jsonl

    gz = path.with_name(path.name + ".gz")
    return read_jsonl(path if path.exists() or not gz.exists() else gz)


def _protocol_record(a) -> dict:
    return {k: getattr(a, k) for k in PROTOCOL_KEYS}


def _open_protocol(a, out: Path) -> dict:
    """OUT/protocol.json: written by the first run, and every later run must ask for the same."""
    want = _protocol_record(a)
    path = out / PROTOCOL
    if path.exists():
        have = json.loads(path.read_text())
        diff = [f"--{k.replace('_', '-')} {want[k]!r} (the directory has {have.get(k)!r})" for k in PROTOCOL_KEYS
                if have.get(k) != want[k]]
        if diff:
            raise SystemExit(f"{out} holds another protocol: this run asks for {', '.join(diff)}")
        return have
    out.mkdir(parents=True, exist_ok=True)
    want["command"] = " ".join(["python", "benchmarks/bench_batch.py", *sys.argv[1:]])  # the first run's
    write_json(path, want)
    return want


def engine_digest(root: Path | None = None) -> str:
    """What a cell's clock depends on besides the machine: the decode's code (a digest of the
    sources under vskip/engine, or ``root``), so that cells of a loop made faster since are not
    pooled with the new ones."""
    import hashlib

    import vskip.engine

    root = root or Path(vskip.engine.__file__).parent
    h = hashlib.sha256()
    for f in sorted(root.rglob("*.py")):
        h.update(str(f.relative_to(root)).encode() + b"\0" + f.read_bytes())
    return h.hexdigest()[:12]


def _clock(c: dict) -> tuple:
    """The machine and the decode's code a cell was timed with (cells before the code was recorded: None)."""
    return c["machine"], c.get("engine")


def _kept_cells(out: Path, here: tuple, chunks: list[list], protocol: dict) -> list[dict]:
    """The cells already measured; a chunk not complete whose cells came from another machine or
    another decode (``here``: this run's :func:`_clock`) is dropped (the chunk runs again here),
    and a cell of other prompts than its chunk's is refused."""
    cells = _read_jsonl(out / CELLS)
    ids = [[tid for tid, _ in c] for c in chunks]
    for c in cells:
        if c["chunk"] >= len(ids) or c["ids"] != ids[c["chunk"]]:
            raise SystemExit(f"{out / CELLS}: chunk {c['chunk']} was made of other prompts than this run's")
    per = {}
    for c in cells:
        per.setdefault(c["chunk"], set()).add(_clock(c))
    mixed = {k for k, m in per.items() if m != {here}}
    full = _complete_chunks(cells, protocol)
    drop = sorted(k for k in mixed if k not in full)
    if drop:
        print(f"bench_batch: chunks {drop} were begun on another machine or decode; they run again here",
              file=sys.stderr)
    kept = [c for c in cells if c["chunk"] not in drop]
    write_jsonl(out / CELLS, kept)  # whole lines only
    (out / (CELLS + ".gz")).unlink(missing_ok=True)  # (as committed: the run goes on in the plain file)
    return kept


def _complete_chunks(cells: list[dict], protocol: dict | None = None) -> set[int]:
    """Chunks with every cell of every repeat measured on one machine."""
    by = {}
    for c in cells:
        by.setdefault(c["chunk"], []).append(c)
    if protocol is None:
        return {k for k, cs in by.items() if len({_clock(c) for c in cs}) == 1}
    need = len(protocol["configs"].split(",")) * len(protocol["batch"].split(",")) * protocol["repeats"]
    return {k for k, cs in by.items() if len({(c["config"], c["batch"], c["repeat"]) for c in cs}) == need
            and len({_clock(c) for c in cs}) == 1}


def run_protocol(a, pair, decoders, prompts, forwards, host: str, machine_info: dict, loaded_rss: int) -> Path:
    """Measure every cell of every chunk not yet measured (until ``--until``), then each chunk's
    gaps and this machine's cost tables where they are missing."""
    from tqdm import tqdm

    from vskip.study.jobs import deadline

    out = Path(a.out)
    protocol = _open_protocol(a, out)
    until = deadline(a.until)
    chunks = chunks_of(prompts, a.chunk_size)
    if "chunks" not in protocol:  # how many the whole protocol has (the summary's "of N")
        protocol["chunks"] = len(chunks)
        write_json(out / PROTOCOL, protocol)
    names, batches = a.configs.split(","), [int(b) for b in a.batch.split(",")]
    here = (host, engine_digest())
    cells = _kept_cells(out, here, chunks, protocol)
    done = {(c["chunk"], c["config"], c["batch"], c["repeat"]) for c in cells}
    todo = [(k, r, n, b) for k in range(len(chunks)) for r in range(a.repeats)
            for n, b in cell_order(names, batches, k, r, a.repeats) if (k, n, b, r) not in done]
    gapped = {g["chunk"] for g in _read_jsonl(out / GAPS)}
    with tqdm(total=len(todo), desc=f"{a.task} cells", file=sys.stderr) as bar, open(out / CELLS, "a") as f:
        for k, r, n, b in todo:
            if until is not None and time.time() >= until:
                print(f"bench_batch: --until {a.until}: stopped with {bar.n} of {len(todo)} cells run", file=sys.stderr)
                break
            res = _run_cell(decoders[n], chunks[k], b, forwards, n)
            cell = {"chunk": k, "ids": [tid for tid, _ in chunks[k]], "config": n, "batch": b, "repeat": r,
                    "machine": host, "engine": here[1], **res}
            cells.append(cell)
            f.write(json.dumps(cell) + "\n")
            f.flush()
            bar.update(1)
    for k in sorted(_complete_chunks(cells, protocol) - gapped):
        _chunk_gaps(out, pair, k, [c for c in cells if c["chunk"] == k], dict(chunks[k]))
    costs = json.loads((out / COSTS).read_text()) if (out / COSTS).exists() else {}
    key = " | ".join(map(str, here))
    if key not in costs and _complete_chunks(cells, protocol):  # once per machine and decode, stopped or not
        texts = _texts(decoders, pair, prompts[:16], a.gamma)
        sizes = sorted({1, *batches})  # (the tables read against one row's forward)
        calls, forwards = _draft_costs(pair.drafter, sizes, a.gamma, texts)
        costs[key] = {"machine": machine_info, "verifier_forward_seconds": _forward_costs(pair.verifier, sizes,
                                                                                          a.gamma, texts),
                       "drafter_call_seconds": calls, "drafter_forward_seconds": forwards,
                       "loaded_rss_mb": loaded_rss / 1e6,
                       "planned_mb": {str(b): _planned_mb(a, max(len(ids) for _, ids in prompts), b) for b in batches}}
        write_json(out / COSTS, costs)
    return out


def _chunk_gaps(out: Path, pair, chunk: int, cells: list[dict], prompts: dict) -> None:
    """Where a lossless configuration's output differs from batch-1 ``ar``'s in a complete chunk:
    the verifier's top-two gap in float64 at the first differing token (OUT/gaps.jsonl)."""
    ref = next((c for c in cells if c["config"] == "ar" and c["batch"] == 1 and c["repeat"] == 0), None)
    rows = []
    if ref is not None:
        for c in cells:
            if c["config"] in LOSSLESS:
                for tid, toks in c["outputs"].items():
                    if toks != ref["outputs"][tid]:
                        rows.append({"chunk": chunk, "config": c["config"], "batch": c["batch"], "repeat": c["repeat"],
                                     "task_id": tid, "gap": _gap(pair.verifier.model, prompts[tid],
                                                                 ref["outputs"][tid], toks)})
    rows = rows or [{"chunk": chunk, "config": None}]  # a chunk checked, nothing differed
    with open(out / GAPS, "a") as f:
        f.write("".join(json.dumps(r) + "\n" for r in rows))


def _ratio_ci(num: np.ndarray, den: np.ndarray, seed: int = 0, n_boot: int = 2000):
    """Ratio of throughputs (tokens over wall time, each a [chunks, 2] array of sums) with a 95%
    bootstrap interval over chunks; the chunks' own ratios for their spread."""
    from vskip.stats import percentile_interval, resample_indices

    def ratio(n, d):
        return (n[..., 0].sum(-1) / n[..., 1].sum(-1)) / (d[..., 0].sum(-1) / d[..., 1].sum(-1))

    idx = next(resample_indices(len(num), n_boot, seed))
    each = (num[:, 0] / num[:, 1]) / (den[:, 0] / den[:, 1])
    return float(ratio(num, den)), percentile_interval(ratio(num[idx], den[idx])), (float(each.min()), float(each.max()))


def protocol_summary(out: Path) -> dict:
    """results.json of a protocol directory: for each machine its complete chunks pooled, one row
    per (configuration, batch size), the cost model at batch B from that machine's cost tables."""
    protocol = json.loads((out / PROTOCOL).read_text())
    cells = _read_jsonl(out / CELLS)
    costs = json.loads((out / COSTS).read_text()) if (out / COSTS).exists() else {}
    gaps = [g for g in _read_jsonl(out / GAPS) if g.get("config")]
    full = _complete_chunks(cells, protocol)
    names, batches = protocol["configs"].split(","), [int(b) for b in protocol["batch"].split(",")]
    machines = {}
    for c in cells:
        if c["chunk"] in full:
            machines.setdefault(_clock(c), []).append(c)
    record = {"protocol": protocol, "chunks_total": protocol.get("chunks"), "machines": []}
    for (host, engine), cs in machines.items():
        key = " | ".join(map(str, (host, engine)))
        ks = sorted({c["chunk"] for c in cs})
        ids = [tid for k in ks for tid in next(c["ids"] for c in cs if c["chunk"] == k)]

        def sums(n, b):  # [chunks, (tokens, wall)], the repeats pooled
            return np.array([[sum(c["tokens"] for c in cs if c["chunk"] == k and c["config"] == n and c["batch"] == b),
                              sum(c["wall"] for c in cs if c["chunk"] == k and c["config"] == n and c["batch"] == b)]
                             for k in ks], np.float64)

        rows = []
        for b in batches:
            for n in names:
                mine = [c for c in cs if c["config"] == n and c["batch"] == b]
                s = sums(n, b)
                row = {"config": n, "batch": b, "throughput": float(s[:, 0].sum() / s[:, 1].sum()),
                       "tokens": int(s[:, 0].sum()), "wall": float(s[:, 1].sum()),
                       "calls": sum(c["calls"] for c in mine), "skipped": sum(c["skipped"] for c in mine),
                       "latency_median": float(np.median([x for c in mine for x in c["latency"].values()])),
                       "latency_p90": float(np.quantile([x for c in mine for x in c["latency"].values()], 0.9)),
                       # a cell's peak holds what the allocator kept from the cells before it in the
                       # process (larger batches of an earlier chunk): the lowest over the chunks is the tightest
                       "peak_rss_mb": min(c["peak_rss"] for c in mine) / 1e6,
                       "forwards": _summed([c["forwards"] for c in mine])}
                if "ar" in names:
                    row["x_ar_same_batch"], row["x_ar_ci95"], row["x_ar_chunks"] = _ratio_ci(s, sums("ar", b))
                if 1 in batches:
                    row["x_batch1"], row["x_batch1_ci95"], _ = _ratio_ci(s, sums(n, 1))
                ref = {tid: t for c in cs if c["config"] == "ar" and c["batch"] == 1 and c["repeat"] == 0
                       for tid, t in c["outputs"].items()}
                if ref:
                    first = [c for c in mine if c["repeat"] == 0]
                    row["equal_ar1"] = sum(c["outputs"][t] == ref[t] for c in first for t in c["outputs"])
                    row["n"] = sum(len(c["outputs"]) for c in first)
                    row["gaps"] = {g["task_id"]: g["gap"] for g in gaps if g["config"] == n and g["batch"] == b
                                   and g["chunk"] in ks and g["repeat"] == 0}
                if n + PADDED in names:  # what packing bought: against the same decode padded, paired per repeat
                    pad = sums(n + PADDED, b)
                    row["x_padded"] = float(s[:, 0].sum() / s[:, 1].sum() / (pad[:, 0].sum() / pad[:, 1].sum()))
                    row["x_padded_repeats"] = sorted(
                        c["throughput"] / p["throughput"] for c in mine for p in cs
                        if (p["config"], p["batch"], p["chunk"], p["repeat"]) == (n + PADDED, b, c["chunk"], c["repeat"]))
                    twin = {t: o for p in cs if (p["config"], p["batch"], p["repeat"]) == (n + PADDED, b, 0)
                            for t, o in p["outputs"].items()}
                    first = [c for c in mine if c["repeat"] == 0]
                    row["equal_padded"] = sum(c["outputs"][t] == twin[t] for c in first for t in c["outputs"])
                rows.append(row)
        m = {"machine": host, "engine": engine, "chunks": ks, "complete_chunks": len(ks), "prompts": len(ids), "rows": rows,
             "gamma": protocol["gamma"]}
        counted = [k for k in ks if all("verifier_rows" in c["forwards"] for c in cs if c["chunk"] == k)]
        if counted:  # the cost model on the chunks whose forwards were counted as they ran
            m["model_chunks"] = counted
            m["model_rows"] = []
            for b in batches:
                for n in names:
                    mine = [c for c in cs if c["config"] == n and c["batch"] == b and c["chunk"] in counted]
                    m["model_rows"].append({"config": n, "batch": b, "tokens": sum(c["tokens"] for c in mine),
                                            "wall": sum(c["wall"] for c in mine),
                                            "forwards": _summed([c["forwards"] for c in mine])})
        if key in costs or host in costs:  # (costs of a run before the decode's code was recorded: by machine)
            table = costs.get(key, costs.get(host))
            m.update({k: table[k] for k in ("verifier_forward_seconds", "drafter_call_seconds", "drafter_forward_seconds",
                                            "loaded_rss_mb", "planned_mb") if k in table})
            m["machine_info"] = table["machine"]
            m["cost_model"] = cost_model(m)
        record["machines"].append(m)
    return record


def _summed(dicts: list[dict]) -> dict:
    """Forward counts (and seconds) summed over cells; the parts only some cells have, left out."""
    def add(x, y):
        if isinstance(x, dict):
            return {k: add(x[k], y[k]) if k in x and k in y else x.get(k, y.get(k)) for k in {**x, **y}}
        if isinstance(x, list):
            return [add(a, b) for a, b in zip(x, y)]
        return x + y

    parts = set.intersection(*(set(d) for d in dicts)) if dicts else set()
    out: dict = {}
    for d in dicts:
        out = add(out, {k: v for k, v in d.items() if k in parts})
    return out


def protocol_figure(record: dict, path: Path) -> Path | None:
    """OUT/throughput.png: for each (machine, decode) pooled, every configuration's throughput
    against batched ``ar`` at the same B (with its 95% interval over chunks, where there are
    several) and its tokens/s, over the batch sizes."""
    if not record["machines"]:
        return None
    from vskip.files import save_figure
    from vskip.report.figures import _pyplot

    plt = _pyplot()
    ms = record["machines"]
    fig, axes = plt.subplots(len(ms), 2, figsize=(11, 4 * len(ms)), squeeze=False)
    for (left, right), m in zip(axes, ms):
        names = list(dict.fromkeys(r["config"] for r in m["rows"]))
        for i, n in enumerate(names):
            rs = sorted((r for r in m["rows"] if r["config"] == n), key=lambda r: r["batch"])
            bs = [r["batch"] for r in rs]
            right.plot(bs, [r["throughput"] for r in rs], "o-", color=f"C{i}", label=n)
            if n == "ar":
                continue
            x = [r["x_ar_same_batch"] for r in rs]
            lo = [r["x_ar_same_batch"] - r["x_ar_ci95"][0] for r in rs]
            hi = [r["x_ar_ci95"][1] - r["x_ar_same_batch"] for r in rs]
            left.errorbar(bs, x, yerr=[lo, hi] if len(m["chunks"]) > 1 else None, fmt="o-", color=f"C{i}",
                          capsize=3, label=n)
        left.axhline(1.0, color="grey", lw=0.8, ls="--")
        left.set(xscale="log", xlabel="batch size B", ylabel="tok/s against batched ar at B",
                 title=f"{record['protocol']['task']}: {m['prompts']} prompts, {len(m['chunks'])} "
                       f"chunk{'s' if len(m['chunks']) != 1 else ''}")
        right.set(xscale="log", xlabel="batch size B", ylabel="generated tok/s (all sequences)",
                  title=f"decode code {m.get('engine') or 'not recorded'}")
        for ax in (left, right):
            ax.set_xticks(bs, [str(b) for b in bs])
            ax.minorticks_off()
            ax.legend(fontsize=8)
    fig.text(0.5, 0.005, f"Machine: {ms[0]['machine']}" if len(ms) == 1 else "", ha="center", fontsize=8)
    fig.tight_layout(rect=(0, 0.02, 1, 1))
    out = save_figure(fig, path)
    plt.close(fig)
    return out


def protocol_table(record: dict) -> str:
    """results.md of a protocol directory: a table per machine, each ending with its cost lines and machine."""
    p = record["protocol"]
    lines = [f"Protocol: {p['task']}, {p['max_new_tokens']} new tokens, gamma {p['gamma']}, chunks of about "
             f"{p['chunk_size']} prompts, {p['repeats']} repeat{'s' if p['repeats'] != 1 else ''} per chunk, "
             f"{p['threads']} thread{'s' if p['threads'] != 1 else ''}, shadow verification "
             f"{'on' if p['shadow'] else 'off'}"]
    if not record["machines"]:
        return "\n".join(lines + ["", "No chunk is complete yet."]) + "\n"
    for m in record["machines"]:
        lines += ["", f"{m['prompts']} prompts in {len(m['chunks'])} complete chunks of {record['chunks_total']} "
                      f"(95% intervals: bootstrap over chunks; chunk range: the chunks' own ratios); decode code "
                      f"{m.get('engine') or 'not recorded'}", "",
                  "| config | B | tok/s | x ar at B | 95% interval | chunk range | x B=1 | latency s (median, p90) "
                  "| = ar at B=1 | skipped rounds |", "|---|---|---|---|---|---|---|---|---|---|"]
        def num(x, fmt=".3f"):
            return "-" if x is None else format(x, fmt)

        def span(pair):
            return "-" if not pair else f"{pair[0]:.3f}-{pair[1]:.3f}"

        for r in m["rows"]:
            lines.append(f"| {r['config']} | {r['batch']} | {r['throughput']:.2f} | {num(r.get('x_ar_same_batch'))} | "
                         f"{span(r.get('x_ar_ci95'))} | {span(r.get('x_ar_chunks'))} | {num(r.get('x_batch1'), '.2f')} | "
                         f"{r['latency_median']:.2f}, {r['latency_p90']:.2f} | {r.get('equal_ar1', '-')}/{r.get('n', '-')} "
                         f"| {r['skipped']} |")
        packed = [r for r in m["rows"] if "x_padded" in r]
        if packed:
            lines += ["", "Packed rows against the same decode padded to the longest (tok/s ratio; each repeat's): " + "; ".join(
                f"{r['config']} at B={r['batch']} {r['x_padded']:.3f} ({', '.join(f'{x:.3f}' for x in r['x_padded_repeats'])}; "
                f"the same outputs on {r['equal_padded']})" for r in packed)]
        lines += _footer({**m, "machine": m.get("machine_info")}, m["machine"])
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
    p.add_argument("--chunk-size", type=int,
                   help="the full protocol: the prompts in chunks of about N, every cell run on a chunk before the "
                        "next one, each cell kept in OUT/cells.jsonl as it ends (resumable)")
    p.add_argument("--until", help="with --chunk-size: start no cell after this local time (HH:MM)")
    p.add_argument("--threads", type=int, default=2, help="threads of the models' forwards")
    a = p.parse_args(argv)
    if a.until and not a.chunk_size:
        p.error("--until needs --chunk-size (only the protocol resumes)")
    for flag, value in (("--chunk-size", a.chunk_size), ("--threads", a.threads), ("--repeats", a.repeats),
                        ("--limit", a.limit), ("--max-new-tokens", a.max_new_tokens)):
        if value is not None and value < 1:
            p.error(f"{flag} must be >= 1, got {value}")
    try:
        from vskip.study.jobs import deadline

        deadline(a.until)
    except ValueError as e:
        p.error(str(e))
    unknown = [n for n in a.configs.split(",") if n.removesuffix(PADDED) not in CONFIGS]
    if unknown:
        p.error(f"--configs: unknown {', '.join(unknown)}; known: {', '.join(CONFIGS)} (each also as NAME{PADDED})")
    if a.summary and (Path(a.out) / PROTOCOL).exists():
        record = protocol_summary(Path(a.out))
        write_json(Path(a.out) / "results.json", record)
        text = protocol_table(record)
        write_atomic(Path(a.out) / "results.md", text)
        protocol_figure(record, Path(a.out) / "throughput.png")
        print(text, end="")
        return 0
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
    base = _settings("strict", a.gamma, a.max_new_tokens, a.shadow, a.threads)
    pair = open_models(base.models, True)
    ids = Path(a.ids_file).read_text().strip().split(",") if a.ids_file else None
    problems = tasks.load_task(a.task, ids=ids)[: a.limit]
    prompts = [(pr.task_id, tasks.encode_problem(pair.tokenizer, pr)) for pr in problems]
    decoders = {n: open_decoder(_settings(n, a.gamma, a.max_new_tokens, a.shadow, a.threads), pair=pair) for n in names}
    forwards = Forwards(pair)
    decoders[names[0]].warmup(prompts[0][1])
    loaded_rss = _rss()  # the pair loaded and warmed up
    if a.chunk_size:
        from vskip.engine.runtime import machine_id

        info = machine(pair.runtime)
        out = run_protocol(a, pair, decoders, prompts, forwards, machine_id(info), info, loaded_rss)
        return main(["--summary", "--out", str(out)])
    if a.recost:
        out = Path(a.out)
        record = json.loads((out / "results.json").read_text())
        batches = sorted({r["batch"] for r in record["rows"]})
        texts = _texts(decoders, pair, prompts, a.gamma)
        record["verifier_forward_seconds"] = _forward_costs(pair.verifier, batches, a.gamma, texts)
        record["drafter_call_seconds"], record["drafter_forward_seconds"] = _draft_costs(pair.drafter, batches,
                                                                                         a.gamma, texts)
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
                results[f"{n}@{b}"].append(_run_cell(decoders[n], prompts, b, forwards, n))
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
               "throughputs": thr, "wall": runs[0]["wall"],  # (the cost model reads the first repeat, whose forwards these are)
               "forwards": runs[0]["forwards"], "peak_rss_mb": runs[0]["peak_rss"] / 1e6}  # the first repeat runs the batch sizes in increasing order
        if ref is not None:
            outs = runs[0]["outputs"]
            same = [k for k in outs if outs[k] == ref["outputs"][k]]
            row["equal_ar1"] = len(same)
            row["n"] = len(outs)
            row["gaps"] = {k: _gap(pair.verifier.model, dict(prompts)[k], ref["outputs"][k], outs[k])
                           for k in outs if k not in same and n in LOSSLESS}
        rows.append(row)
    for row in rows:
        same_b = next((r for r in rows if r["config"] == "ar" and r["batch"] == row["batch"]), None)
        one = next((r for r in rows if r["config"] == row["config"] and r["batch"] == 1), None)
        row["x_ar_same_batch"] = row["throughput"] / same_b["throughput"] if same_b else None
        row["x_batch1"] = row["throughput"] / one["throughput"] if one else None
    texts = _texts(decoders, pair, prompts, a.gamma)
    costs = _forward_costs(pair.verifier, batches, a.gamma, texts)
    draft_costs, draft_forwards = _draft_costs(pair.drafter, batches, a.gamma, texts)
    longest = max(len(ids) for _, ids in prompts)
    planned = {str(b): _planned_mb(a, longest, b) for b in batches}
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    record = {"command": " ".join(["python", "benchmarks/bench_batch.py", *(argv or sys.argv[1:])]),
              "machine": machine(pair.runtime), "threads": torch.get_num_threads(), "task": a.task, "limit": a.limit,
              "max_new_tokens": a.max_new_tokens, "gamma": a.gamma, "repeats": a.repeats, "rows": rows,
              "verifier_forward_seconds": costs, "drafter_call_seconds": draft_costs,
              "drafter_forward_seconds": draft_forwards, "shadow": a.shadow,
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
