"""bench_batch's summary of a protocol directory (its results.json): the complete chunks of each
machine and decode pooled, one row per (configuration, batch size), each ratio with a 95% bootstrap
interval over chunks, and the cost model at batch B from that machine's cost tables."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from batch_costs import cost_model  # (benchmarks/ on the path: see bench_batch.py)
from batch_protocol import CELLS, GAPS, PROTOCOL, _clock, _complete_chunks, _costs_key, _read_costs, _read_jsonl
from batch_workload import PADDED, batch_sizes


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
    costs = _read_costs(out)
    gaps = [g for g in _read_jsonl(out / GAPS) if g.get("config")]
    full = _complete_chunks(cells, protocol)
    names, batches = protocol["configs"].split(","), batch_sizes(protocol["batch"])
    machines = {}
    for c in cells:
        if c["chunk"] in full:
            machines.setdefault(_clock(c), []).append(c)
    record = {"protocol": protocol, "chunks_total": protocol.get("chunks"), "machines": []}
    for (host, engine), cs in machines.items():
        key = _costs_key((host, engine))
        ks = sorted({c["chunk"] for c in cs})
        ids = [tid for k in ks for tid in next(c["ids"] for c in cs if c["chunk"] == k)]

        def sums(n, b):  # [chunks, (tokens, wall)], the repeats pooled
            cell = [c for c in cs if c["config"] == n and c["batch"] == b]
            return np.array([[sum(c["tokens"] for c in cell if c["chunk"] == k),
                              sum(c["wall"] for c in cell if c["chunk"] == k)] for k in ks], np.float64)

        ref = {tid: t for c in cs if c["config"] == "ar" and c["batch"] == 1 and c["repeat"] == 0
               for tid, t in c["outputs"].items()}
        rows = []
        for b in batches:
            for n in names:
                mine = [c for c in cs if c["config"] == n and c["batch"] == b]
                first = [c for c in mine if c["repeat"] == 0]
                latency = [x for c in mine for x in c["latency"].values()]
                s = sums(n, b)
                row = {"config": n, "batch": b, "throughput": float(s[:, 0].sum() / s[:, 1].sum()),
                       "tokens": int(s[:, 0].sum()), "wall": float(s[:, 1].sum()),
                       "calls": sum(c["calls"] for c in mine), "skipped": sum(c["skipped"] for c in mine),
                       "latency_median": float(np.median(latency)), "latency_p90": float(np.quantile(latency, 0.9)),
                       # a cell's peak holds what the allocator kept from the cells before it in the
                       # process (larger batches of an earlier chunk): the lowest over the chunks is the tightest
                       "peak_rss_mb": min(c["peak_rss"] for c in mine) / 1e6,
                       "forwards": _summed([c["forwards"] for c in mine])}
                if "ar" in names:
                    row["x_ar_same_batch"], row["x_ar_ci95"], row["x_ar_chunks"] = _ratio_ci(s, sums("ar", b))
                if 1 in batches:
                    row["x_batch1"], row["x_batch1_ci95"], _ = _ratio_ci(s, sums(n, 1))
                if ref:
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

