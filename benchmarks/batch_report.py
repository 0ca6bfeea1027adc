"""bench_batch's results pages (results.md): the table of one run (:func:`table`) or of a protocol
directory, one per machine (:func:`protocol_table`), each ending with the same footer: the gaps of
outputs unlike batch-1 ``ar``, the cost tables, Eq. 7 and Eq. 8 at batch B, memory, shadow
verification and the machine."""

from __future__ import annotations

from pathlib import Path

from batch_costs import cost_model  # (benchmarks/ on the path: see bench_batch.py)


def _num(x, fmt: str = ".3f") -> str:
    return "-" if x is None else format(x, fmt)


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
            lines += ["", "Inside the models' calls, seconds measured over predicted: all calls (the verifier's, the "
                      "drafter's; the share of the wall time spent outside the calls): " + ", ".join(
                          f"{k} {v['calls_over_predicted']:.2f} ({_num(v['verifier_over_predicted'], '.2f')}, "
                          f"{_num(v['drafter_over_predicted'], '.2f')}; {100 * v['outside']:.0f}%)" for k, v in cells.items())]
        lines += ["", "Eq. 8 at batch B: one more row's cost (ms) and K*(B) = A dc_D / (dc_D + dc_V): "
                  + "; ".join(f"B={b}: dc_V {1000 * m['dc_V']:.1f}, dc_D {1000 * m['dc_D']:.1f}, A {_num(m['A'], '.2f')}, "
                              f"K* {_num(m['K_star'], '.2f')}" for b, m in model["marginal"].items())]
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

        def span(pair):
            return "-" if not pair else f"{pair[0]:.3f}-{pair[1]:.3f}"

        for r in m["rows"]:
            lines.append(f"| {r['config']} | {r['batch']} | {r['throughput']:.2f} | {_num(r.get('x_ar_same_batch'))} | "
                         f"{span(r.get('x_ar_ci95'))} | {span(r.get('x_ar_chunks'))} | {_num(r.get('x_batch1'), '.2f')} | "
                         f"{r['latency_median']:.2f}, {r['latency_p90']:.2f} | {r.get('equal_ar1', '-')}/{r.get('n', '-')} "
                         f"| {r['skipped']} |")
        packed = [r for r in m["rows"] if "x_padded" in r]
        if packed:
            lines += ["", "Packed rows against the same decode padded to the longest (tok/s ratio; each repeat's): " + "; ".join(
                f"{r['config']} at B={r['batch']} {r['x_padded']:.3f} ({', '.join(f'{x:.3f}' for x in r['x_padded_repeats'])}; "
                f"the same outputs on {r['equal_padded']})" for r in packed)]
        lines += _footer({**m, "machine": m.get("machine_info")}, m["machine"])
    return "\n".join(lines) + "\n"


def write_page(out: Path, record: dict) -> None:
    """OUT/results.md: a run's :func:`table`, printed too."""
    text = table(record)
    (out / "results.md").write_text(text)
    print(text, end="")
