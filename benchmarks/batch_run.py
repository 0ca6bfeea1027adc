"""bench_batch's run without chunks: every (configuration, batch size) cell on all the prompts, in
an order that rotates from repeat to repeat, summed up as one row per cell (median throughput over
the repeats, equality with batch-1 ``ar`` and the gaps where it fails), with the cost tables measured
after; and ``--recost``, the cost tables measured again for a run's results.json."""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

import torch

from batch_cells import _gap, _run_cell  # (benchmarks/ on the path: see bench_batch.py)
from batch_costs import _draft_costs, _forward_costs, _texts, cost_model, planned_mb
from batch_report import write_page
from batch_workload import LOSSLESS, batch_sizes, command_line, config_names


def cell_order(names: list[str], batches: list[int], chunk: int, repeat: int, repeats: int) -> list[tuple[str, int]]:
    """The (configuration, batch size) cells of one chunk's repeat, the first one rotating with
    each chunk and repeat so that drift within a chunk falls on every cell alike."""
    cells = [(n, b) for b in batches for n in names]
    k = (chunk * repeats + repeat) % len(cells)
    return cells[k:] + cells[:k]


def _write_record(out: Path, record: dict) -> None:
    (out / "results.json").write_text(json.dumps(record, indent=1) + "\n")


def _rows(results: dict, pair, prompts) -> list[dict]:
    """One row per cell from its repeats (``results``: "config@B" -> each repeat's cell): the median
    throughput and its range, the first repeat's counts, equality with batch-1 ``ar``, and the
    throughput against batched ``ar`` at the same B and against the configuration at B = 1."""
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
    return rows


def run_interleaved(a, argv, pair, decoders, prompts, forwards, loaded_rss: int) -> int:
    """Every cell ``--repeats`` times in a rotating order, then the cost tables; OUT/results.json,
    OUT/config.json and OUT/results.md (printed)."""
    from tqdm import tqdm

    from vskip.engine.runtime import machine

    names, batches = config_names(a.configs), batch_sizes(a.batch)
    cells = [(n, b) for b in batches for n in names]
    results: dict = {f"{n}@{b}": [] for n, b in cells}
    with tqdm(total=len(cells) * a.repeats, file=sys.stderr) as bar:
        for rep in range(a.repeats):
            for n, b in cell_order(names, batches, 0, rep, a.repeats):
                results[f"{n}@{b}"].append(_run_cell(decoders[n], prompts, b, forwards, n))
                bar.update(1)
    rows = _rows(results, pair, prompts)
    texts = _texts(decoders, pair, prompts, a.gamma)
    costs = _forward_costs(pair.verifier, batches, a.gamma, texts)
    draft_costs, draft_forwards = _draft_costs(pair.drafter, batches, a.gamma, texts)
    planned = planned_mb(a, prompts, batches)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    record = {"command": command_line(argv),
              "machine": machine(pair.runtime), "threads": torch.get_num_threads(), "task": a.task, "limit": a.limit,
              "max_new_tokens": a.max_new_tokens, "gamma": a.gamma, "repeats": a.repeats, "rows": rows,
              "verifier_forward_seconds": costs, "drafter_call_seconds": draft_costs,
              "drafter_forward_seconds": draft_forwards, "shadow": a.shadow,
              "loaded_rss_mb": loaded_rss / 1e6, "planned_mb": planned}
    record["cost_model"] = cost_model(record)
    _write_record(out, record)
    (out / "config.json").write_text(json.dumps({"command": record["command"], "machine": record["machine"]},
                                                indent=1) + "\n")  # where the machine of these clocks is read
    write_page(out, record)
    return 0


def recost(a, argv, pair, decoders, prompts) -> int:
    """``--recost``: the cost tables of OUT/results.json measured again (on real text), its cost
    model with them, and OUT/results.md again."""
    out = Path(a.out)
    record = json.loads((out / "results.json").read_text())
    batches = sorted({r["batch"] for r in record["rows"]})
    texts = _texts(decoders, pair, prompts, a.gamma)
    record["verifier_forward_seconds"] = _forward_costs(pair.verifier, batches, a.gamma, texts)
    record["drafter_call_seconds"], record["drafter_forward_seconds"] = _draft_costs(pair.drafter, batches,
                                                                                     a.gamma, texts)
    record["cost_model"] = cost_model(record)
    record["recost_command"] = command_line(argv)
    _write_record(out, record)
    write_page(out, record)
    return 0
