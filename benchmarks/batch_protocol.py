"""bench_batch's full protocol, in chunks (``--chunk-size``), and the files of its directory.

A study of hundreds of prompts at every batch size takes longer than a sitting: ``--chunk-size N``
cuts the prompts into contiguous chunks of about N and runs every (configuration, batch size)
cell on one chunk, in an order that rotates from chunk to chunk, before the next chunk. Each
cell is a line of OUT/cells.jsonl as soon as it ends, so a killed or ``--until``-stopped run goes
on from the cells it has; a chunk begun on another machine is begun again (its clocks would be
set against this machine's). The summary (:mod:`batch_summary`) pools the complete chunks of each
machine: tokens/s as the sum of tokens over the sum of wall times, each ratio with a 95% bootstrap
interval over chunks (the chunk is the unit a batch's throughput is measured on), per-sequence
latency over prompts, equality with batch-1 ``ar`` over prompts."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from vskip.files import write_json, write_jsonl

from batch_cells import _gap, _run_cell  # (benchmarks/ on the path: see bench_batch.py)
from batch_costs import _draft_costs, _forward_costs, _texts, planned_mb
from batch_run import cell_order
from batch_workload import LOSSLESS, batch_sizes, command_line

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
    want["command"] = command_line()  # the first run's
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


def _costs_key(clock: tuple) -> str:
    """A clock's key in OUT/costs.json: its machine and its decode's code."""
    return " | ".join(map(str, clock))


def _read_costs(out: Path) -> dict:
    """OUT/costs.json: the cost tables measured, by :func:`_costs_key` ({} before any)."""
    return json.loads((out / COSTS).read_text()) if (out / COSTS).exists() else {}


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
    names, batches = a.configs.split(","), batch_sizes(a.batch)
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
    costs = _read_costs(out)
    key = _costs_key(here)
    if key not in costs and _complete_chunks(cells, protocol):  # once per machine and decode, stopped or not
        texts = _texts(decoders, pair, prompts[:16], a.gamma)
        sizes = sorted({1, *batches})  # (the tables read against one row's forward)
        calls, draft_forwards = _draft_costs(pair.drafter, sizes, a.gamma, texts)
        costs[key] = {"machine": machine_info, "verifier_forward_seconds": _forward_costs(pair.verifier, sizes,
                                                                                          a.gamma, texts),
                       "drafter_call_seconds": calls, "drafter_forward_seconds": draft_forwards,
                       "loaded_rss_mb": loaded_rss / 1e6,
                       "planned_mb": planned_mb(a, prompts, batches)}
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

