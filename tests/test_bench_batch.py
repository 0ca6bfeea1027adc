"""benchmarks/bench_batch.py's full protocol: chunks, the rotating order of cells, resuming, and the
summary pooled per machine over complete chunks (no model is loaded)."""

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from scripts import load_script
from vskip.engine.models.verifier import HFVerifier


bb = load_script("bench_batch")


@given(st.integers(0, 300), st.integers(1, 50))
def test_chunks_cover_the_prompts_in_order_with_sizes_within_one(n, size):
    items = list(range(n))
    chunks = bb.chunks_of(items, size)
    assert [x for c in chunks for x in c] == items
    assert len(chunks) == max(1, -(-n // size))
    sizes = [len(c) for c in chunks]
    assert max(sizes) - min(sizes) <= 1 and max(sizes) <= size


def test_chunk_size_must_be_positive():
    with pytest.raises(ValueError, match="--chunk-size"):
        bb.chunks_of([1, 2], 0)


@given(st.integers(0, 20), st.integers(1, 3))
def test_each_chunk_runs_every_cell_once_starting_elsewhere(chunk, repeats):
    names, batches = ["ar", "strict", "raw"], [1, 4]
    orders = [bb.cell_order(names, batches, chunk, r, repeats) for r in range(repeats)]
    for o in orders:
        assert sorted(o) == sorted((n, b) for n in names for b in batches)
    nxt = bb.cell_order(names, batches, chunk + 1, 0, repeats)
    assert nxt[0] != orders[0][0]


def _cell(chunk, config, batch, tokens, wall, machine="m1", ids=("a", "b"), outputs=None, repeat=0, engine="e1"):
    outputs = outputs or {t: [1, 2, 3] for t in ids}
    return {"chunk": chunk, "ids": list(ids), "config": config, "batch": batch, "repeat": repeat, "machine": machine,
            "engine": engine,
            "wall": wall, "tokens": tokens, "throughput": tokens / wall, "latency": {t: wall / 2 for t in ids},
            "outputs": outputs, "calls": 3, "skipped": 1 if config == "raw" else 0,
            "forwards": {"verifier": {"1x9": 2}, "drafter": {"1": 2}}, "peak_rss": 1e8}


def _protocol(out: Path, configs="ar,strict", batch="1,2", chunks=2):
    out.mkdir(parents=True, exist_ok=True)
    (out / bb.PROTOCOL).write_text(json.dumps({"task": "humaneval", "ids_file": None, "limit": 4, "max_new_tokens": 8,
                                               "gamma": 8, "batch": batch, "configs": configs, "repeats": 1,
                                               "shadow": False, "chunk_size": 2, "threads": 1, "chunks": chunks}))


def _write(out: Path, cells):
    (out / bb.CELLS).write_text("".join(json.dumps(c) + "\n" for c in cells))


def test_summary_pools_complete_chunks_of_one_machine(tmp_path):
    _protocol(tmp_path)
    cells = []
    for k, ids in enumerate([("a", "b"), ("c", "d")]):
        for b in (1, 2):
            cells.append(_cell(k, "ar", b, 100, 10.0 / b, ids=ids))
            cells.append(_cell(k, "strict", b, 100, (5.0 if k == 0 else 8.0) / b, ids=ids,
                               outputs={ids[0]: [1, 2, 3], ids[1]: [9]}))
    cells.append(_cell(2, "ar", 1, 100, 1.0, ids=("e",)))  # a chunk begun, not complete: left out
    _write(tmp_path, cells)
    rec = bb.protocol_summary(tmp_path)
    (m,) = rec["machines"]
    assert m["chunks"] == [0, 1] and m["prompts"] == 4
    rows = {(r["config"], r["batch"]): r for r in m["rows"]}
    assert rows["ar", 1]["throughput"] == pytest.approx(200 / 20.0)
    # the ratio of sums, not the mean of the chunks' ratios (2.0 and 1.25)
    assert rows["strict", 1]["x_ar_same_batch"] == pytest.approx((200 / 13.0) / (200 / 20.0))
    assert rows["strict", 1]["x_ar_chunks"] == pytest.approx((1.25, 2.0))
    lo, hi = rows["strict", 1]["x_ar_ci95"]
    assert 1.25 <= lo <= rows["strict", 1]["x_ar_same_batch"] <= hi <= 2.0
    assert rows["strict", 2]["x_batch1"] == pytest.approx(2.0)
    assert (rows["ar", 2]["equal_ar1"], rows["ar", 2]["n"]) == (4, 4)
    assert (rows["strict", 2]["equal_ar1"], rows["strict", 2]["n"]) == (2, 4)
    assert rows["strict", 1]["forwards"] == {"verifier": {"1x9": 4}, "drafter": {"1": 4}}
    assert "No chunk" not in bb.protocol_table(rec) and "| strict | 2 |" in bb.protocol_table(rec)
    png = bb.protocol_figure(rec, tmp_path / "throughput.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert bb.protocol_figure({**rec, "machines": []}, tmp_path / "none.png") is None


def test_summary_keeps_machines_apart(tmp_path):
    _protocol(tmp_path, batch="1")
    cells = [_cell(0, "ar", 1, 100, 10.0), _cell(0, "strict", 1, 100, 5.0),
             _cell(1, "ar", 1, 100, 20.0, machine="m2", ids=("c", "d")),
             _cell(1, "strict", 1, 100, 5.0, machine="m2", ids=("c", "d"))]
    _write(tmp_path, cells)
    rec = bb.protocol_summary(tmp_path)
    assert {m["machine"]: m["rows"][1]["x_ar_same_batch"] for m in rec["machines"]} == {"m1": 2.0, "m2": 4.0}
    assert bb.protocol_table(rec).count("Machine: ") == 2
    # the same machine, the decode's code changed between chunks: not pooled either
    _write(tmp_path, cells[:2] + [{**c, "machine": "m1", "engine": "e2"} for c in cells[2:]])
    assert [(m["machine"], m["engine"]) for m in bb.protocol_summary(tmp_path)["machines"]] == [("m1", "e1"), ("m1", "e2")]


def test_resume_begins_again_a_chunk_another_machine_began(tmp_path):
    chunks = [[("a", [1]), ("b", [2])], [("c", [3]), ("d", [4])], [("e", [5]), ("f", [6])]]
    _protocol(tmp_path, configs="ar,strict", batch="1", chunks=3)
    protocol = json.loads((tmp_path / bb.PROTOCOL).read_text())
    done = [_cell(0, c, 1, 10, 1.0, machine="other") for c in ("ar", "strict")]  # complete elsewhere: kept
    begun = _cell(1, "ar", 1, 10, 1.0, machine="other", ids=("c", "d"))  # begun elsewhere: goes
    mixed = [_cell(2, "ar", 1, 10, 1.0, machine="other", ids=("e", "f")),  # two machines, not complete: goes
             _cell(2, "strict", 1, 10, 1.0, machine="here", ids=("e", "f"))]
    mine = _cell(1, "strict", 1, 10, 1.0, machine="here", ids=("c", "d"))
    _write(tmp_path, [*done, begun, *mixed])
    with open(tmp_path / bb.CELLS, "a") as f:
        f.write('{"chunk": 1, "cut by a kill')
    kept = bb._kept_cells(tmp_path, ("here", "e1"), chunks, protocol)
    assert kept == done
    assert bb._read_jsonl(tmp_path / bb.CELLS) == done
    _write(tmp_path, [*done, mine])  # a chunk begun here is kept
    assert bb._kept_cells(tmp_path, ("here", "e1"), chunks, protocol) == [*done, mine]


def test_resume_refuses_cells_of_other_prompts(tmp_path):
    _protocol(tmp_path, configs="ar", batch="1")
    _write(tmp_path, [_cell(0, "ar", 1, 10, 1.0, ids=("x", "y"))])
    with pytest.raises(SystemExit, match="other prompts"):
        bb._kept_cells(tmp_path, ("m1", "e1"), [[("a", [1]), ("b", [2])]], json.loads((tmp_path / bb.PROTOCOL).read_text()))


def test_a_directory_refuses_another_protocol(tmp_path):
    import argparse

    a = argparse.Namespace(**{k: None for k in bb.PROTOCOL_KEYS})
    a.task, a.max_new_tokens, a.chunk_size = "humaneval", 8, 2
    bb._open_protocol(a, tmp_path)
    assert json.loads((tmp_path / bb.PROTOCOL).read_text())["chunk_size"] == 2
    a.max_new_tokens = 16
    with pytest.raises(SystemExit, match="--max-new-tokens 16"):
        bb._open_protocol(a, tmp_path)


def test_ratio_interval_is_the_ratio_when_chunks_agree():
    num = np.array([[10.0, 1.0], [20.0, 2.0]])
    den = np.array([[5.0, 1.0], [10.0, 2.0]])
    r, ci, spread = bb._ratio_ci(num, den)
    assert r == pytest.approx(2.0) and ci == pytest.approx((2.0, 2.0)) and spread == pytest.approx((2.0, 2.0))


def test_cells_committed_gzipped_are_read_and_resumed_plain(tmp_path):
    import gzip

    _protocol(tmp_path, configs="ar", batch="1")
    cell = _cell(0, "ar", 1, 10, 1.0)
    (tmp_path / (bb.CELLS + ".gz")).write_bytes(gzip.compress((json.dumps(cell) + "\n").encode()))
    assert bb.protocol_summary(tmp_path)["machines"][0]["rows"][0]["tokens"] == 10
    protocol = json.loads((tmp_path / bb.PROTOCOL).read_text())
    assert bb._kept_cells(tmp_path, ("m1", "e1"), [[("a", [1]), ("b", [2])], [("c", [3])]], protocol) == [cell]
    assert (tmp_path / bb.CELLS).exists() and not (tmp_path / (bb.CELLS + ".gz")).exists()


def test_the_engine_digest_follows_the_decode_code(tmp_path):
    assert len(bb.engine_digest()) == 12
    (tmp_path / "models").mkdir()
    (tmp_path / "decode.py").write_text("a = 1\n")
    (tmp_path / "models" / "verifier.py").write_text("b = 2\n")
    (tmp_path / "notes.md").write_text("not code")
    d = bb.engine_digest(tmp_path)
    (tmp_path / "notes.md").write_text("still not code")
    assert bb.engine_digest(tmp_path) == d
    (tmp_path / "models" / "verifier.py").write_text("b = 3\n")
    assert bb.engine_digest(tmp_path) != d


class _FakeVerifier:
    """What Forwards reads of vskip's verifier: score_many running its forwards through _forward_rows,
    and the verifier's own test of which forwards go packed."""
    use_cache, packs = True, True
    packed_forward = HFVerifier.packed_forward

    def score_many(self, calls):
        return calls

    def _forward_rows(self, rows, starts):
        return [len(ids) for _, ids, _ in rows]


class _FakeDrafter:
    def propose_many(self, requests):
        return list(requests)


class _Pair:
    def __init__(self):
        self.verifier, self.drafter = _FakeVerifier(), _FakeDrafter()


def test_forwards_counts_each_verifier_forward_packed_or_padded():
    pair = _Pair()
    f = bb.Forwards(pair)
    assert pair.verifier._forward_rows([(0, [1, 2, 3], 1), (1, [1], 1)], [0, 0]) == [3, 1]  # ragged: packed
    pair.verifier._forward_rows([(0, [1, 2], 1), (1, [1, 2], 1)], [0, 0])  # equal rows: padded, nothing to pack
    pair.verifier._forward_rows([(0, [1, 2, 3, 4, 5], 1)], [1])  # one row of 4 new positions
    pair.drafter.propose_many([1, 2])
    got = f.take()
    assert got["verifier_rows"] == {"2x2": 1, "1x4": 1}
    assert got["verifier_packed"] == {"2": [1, 4]}
    assert got["drafter"] == {"2": 1} and got["seconds"]["drafter"] >= 0.0
    assert f.take()["verifier_rows"] == {}  # taken: counted afresh
    pair.verifier.packs = False
    pair.verifier._forward_rows([(0, [1, 2, 3], 1), (1, [1], 1)], [0, 0])
    assert f.take()["verifier_rows"] == {"2x3": 1}


def _costed(forwards, wall=1.0):
    record = {"gamma": 2, "verifier_forward_seconds": {"1x1": 1.0, "1x3": 2.0, "2x1": 1.5, "2x3": 3.5},
              "drafter_call_seconds": {"1": 0.5, "2": 0.75},
              "rows": [{"config": "strict", "batch": 2, "tokens": 10, "wall": wall, "calls": 2, "forwards": forwards}]}
    return bb.cost_model(record)["cells"]["strict@2"]


def test_cost_model_costs_packed_forwards_by_the_positions_they_hold():
    # c_V(2, n) = 1.5 + 1.0 (n - 1); a packed forward of 2 rows holding 5 positions: c_V(2, 2.5) = 3.0
    cell = _costed({"verifier": {"2x9": 7}, "drafter": {"2": 2}, "verifier_rows": {"2x3": 1},
                    "verifier_packed": {"2": [1, 5]}, "seconds": {"verifier": 5.0, "drafter": 1.0}}, wall=8.0)
    assert cell["forwards_counted"]
    assert cell["predicted_verifier"] == pytest.approx(3.5 + 3.0)
    assert cell["predicted_drafter"] == pytest.approx(1.5)
    assert cell["measured_over_predicted"] == pytest.approx(8.0 / 8.0)
    assert cell["calls_over_predicted"] == pytest.approx(6.0 / 8.0)
    assert cell["outside"] == pytest.approx(0.25)
    assert (cell["verifier_over_predicted"], cell["drafter_over_predicted"]) == pytest.approx((5.0 / 6.5, 1.0 / 1.5))
    # counted per call (cells from before): each call at its rows x (longest block + 1)
    old = _costed({"verifier": {"2x3": 2}, "drafter": {"2": 2}})
    assert not old["forwards_counted"] and old["predicted_verifier"] == pytest.approx(7.0) and "outside" not in old


def test_summary_models_costs_only_on_chunks_whose_forwards_were_counted(tmp_path):
    _protocol(tmp_path, batch="1")
    new = {"verifier": {"1x9": 2}, "drafter": {"1": 2}, "verifier_rows": {"1x9": 2}, "verifier_packed": {},
           "seconds": {"verifier": 1.0, "drafter": 0.5}}
    cells = [_cell(0, "ar", 1, 100, 10.0), _cell(0, "strict", 1, 100, 5.0),
             {**_cell(1, "ar", 1, 100, 10.0, ids=("c", "d")), "forwards": new},
             {**_cell(1, "strict", 1, 100, 4.0, ids=("c", "d")), "forwards": new}]
    _write(tmp_path, cells)
    (m,) = bb.protocol_summary(tmp_path)["machines"]
    assert m["model_chunks"] == [1]
    rows = {r["config"]: r for r in m["model_rows"]}
    assert rows["strict"]["wall"] == 4.0 and rows["strict"]["forwards"]["seconds"] == {"verifier": 1.0, "drafter": 0.5}
    # the pooled rows sum only what every cell counted
    assert {r["config"]: r for r in m["rows"]}["strict"]["forwards"] == {"verifier": {"1x9": 4}, "drafter": {"1": 4}}


def test_strict_trace_is_strict_collecting_the_traces():
    """The configuration that measures what tracing costs differs from Strict SDD by the trace alone,
    and is held to batch-1 ar's outputs like it."""
    plain, traced = bb._settings("strict", 8, 64), bb._settings("strict-trace", 8, 64)
    assert traced.decode.trace and not plain.decode.trace
    assert traced.policy == plain.policy and traced.decode == plain.decode.__class__(
        **{**plain.decode.__dict__, "trace": True})
    assert "strict-trace" in bb.LOSSLESS


def test_cost_model_costs_each_drafter_forward_by_its_query_positions():
    # gamma 2: calls of 3 query positions (context cached) and of 6 (a block's tokens encoded too);
    # c_D(2, n) = 0.75 + (1.25 - 0.75) (n - 3) / 3, read beyond 6 along the same line
    forwards = {"verifier": {"2x3": 1}, "drafter": {"2": 3}, "drafter_rows": {"2x3": 1, "2x6": 1, "2x9": 1},
                "drafter_packed": {"2": [2, 18]}}  # two packed forwards, 9 query positions per row in all
    record = {"gamma": 2, "verifier_forward_seconds": {"1x1": 1.0, "1x3": 2.0, "2x1": 1.5, "2x3": 3.5},
              "drafter_call_seconds": {"1": 0.5, "2": 0.75},
              "drafter_forward_seconds": {"1x3": 0.5, "1x6": 0.8, "2x3": 0.75, "2x6": 1.25},
              "rows": [{"config": "strict", "batch": 2, "tokens": 10, "wall": 1.0, "calls": 1, "forwards": forwards}]}
    cell = bb.cost_model(record)["cells"]["strict@2"]
    # the packed ones as two forwards of 2 x 4.5 positions: 2 (0.75 + 0.5 * 1.5 / 3)
    assert cell["drafts_counted"] and cell["predicted_drafter"] == pytest.approx(0.75 + 1.25 + 1.75 + 2.0)
    del record["drafter_forward_seconds"]  # a table without query lengths: each call at c_D(b)
    cell = bb.cost_model(record)["cells"]["strict@2"]
    assert not cell["drafts_counted"] and cell["predicted_drafter"] == pytest.approx(3 * 0.75)


def test_the_drafter_table_times_calls_whose_rows_lack_a_block_of_context():
    """_draft_costs times calls with the contexts cached (gamma + 1 query positions) and calls whose
    one forward also runs the gamma + 1 tokens each row's cache lacks (2 (gamma + 1)), one row alone
    and rows together, and Forwards counts the drafter's forwards by those shapes."""
    from test_copy import tiny_drafter

    d = tiny_drafter()
    d.steps = 1
    pair = _Pair()
    pair.drafter = d
    f = bb.Forwards(pair)
    texts = [list(range(2, 30)), list(range(5, 40))]
    calls, got = bb._draft_costs(d, [1, 2], 3, texts, reps=2)
    assert set(got) == {"1x4", "1x8", "2x4", "2x8"} and all(v > 0 for v in got.values())
    assert calls == {"1": got["1x4"], "2": got["2x4"]}
    rows = f.take()["drafter_rows"]
    assert rows["1x8"] == 2 and rows["2x8"] == 2  # each timed call lacking: 4 context tokens, the last token and 3 masks
    assert rows["1x4"] >= 2 and rows["2x4"] >= 2  # the cached calls, and the untimed ones that cut the caches back


@pytest.mark.parametrize("padded", [False, True])
def test_forwards_counts_the_drafters_packed_forwards_by_rows_and_positions(padded):
    """Two rows lacking different amounts of context draft in one forward: packed, it is counted as
    2 rows holding their real query positions; padded (a :padded configuration), as 2 x the longest."""
    from test_copy import tiny_drafter

    d = tiny_drafter()
    d.steps = 1
    d.pack = not padded
    pair = _Pair()
    pair.drafter = d
    f = bb.Forwards(pair)
    seqs = [list(range(2, 12)), list(range(3, 20))]
    d.propose_many([(0, seqs[0], 3), (1, seqs[1], 3)])  # the prompts: 9 and 16 context tokens + 4
    got = f.take()
    if padded:
        assert got["drafter_rows"] == {"2x20": 1} and got["drafter_packed"] == {}
    else:
        assert got["drafter_rows"] == {} and got["drafter_packed"] == {"2": [1, 13 + 20]}
