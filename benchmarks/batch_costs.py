"""bench_batch's cost tables and cost model: the measured seconds of a verifier forward (B rows x n
new positions) and of a drafter call (B rows, with and without a block of context to encode) on
real text, the memory ``vskip plan`` plans at B, and Eq. 7 / Eq. 8 at batch B read off them."""

from __future__ import annotations

import statistics
import time

import numpy as np

from batch_workload import _settings  # (benchmarks/ on the path: see bench_batch.py)


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
        from vskip.engine.door import open_decoder

        dec = open_decoder(_settings("ar", gamma, 128), pair=pair)
    out = [list(j.prompt) + r.tokens for j, r in dec.decode_many([Job(ids, task_id=t) for t, ids in prompts],
                                                                  len(prompts))]
    return [t for t in out if len(t) > 2 * (gamma + 1)]


def planned_mb(a, prompts, batches) -> dict:
    """What ``vskip plan --batch-size B`` plans on this CPU for the decode's caches and activations
    (MB), by B, for the longest of ``prompts``."""
    from vskip.engine.models.drafter_files import resolve_drafter_dir
    from vskip.engine.models.verifiers import resolve_verifier_dir
    from vskip.engine.models.placement import plan_memory

    longest = max(len(ids) for _, ids in prompts)
    out = {}
    for b in batches:
        plan = plan_memory(resolve_verifier_dir(None), resolve_drafter_dir(None), verifier_device="cpu",
                           drafter_device="cpu", dtype="float32", drafter_dtype="float32", prompt_tokens=longest,
                           max_new_tokens=a.max_new_tokens, gamma=a.gamma, batch=b)
        d = plan.devices[0]
        out[str(b)] = {"cache": d.cache / 1e6, "activations": d.activations / 1e6}
    return out


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

