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

The script's parts, each a module beside it: ``batch_workload`` (the configurations, prompts and
batch sizes), ``batch_cells`` (one cell run and what it counts), ``batch_costs`` (the cost tables
and Eq. 7 / Eq. 8), ``batch_run`` (the run in rotating repeats, and ``--recost``), ``batch_protocol``
(the full protocol in chunks, ``--chunk-size``), ``batch_summary`` (a protocol directory pooled),
``batch_report`` (the results pages), ``batch_plots`` (the protocol's figure).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

if str(Path(__file__).parent) not in sys.path:  # its parts, also where it is loaded by path (the tests)
    sys.path.insert(0, str(Path(__file__).parent))

from vskip.files import write_atomic, write_json  # noqa: E402

# what main runs, and (the rest) the parts tests/test_bench_batch.py reaches through this script
from batch_cells import Forwards, _rss  # noqa: E402
from batch_costs import _draft_costs, cost_model  # noqa: E402, F401
from batch_plots import protocol_figure  # noqa: E402
from batch_protocol import (  # noqa: E402, F401
    CELLS,
    PROTOCOL,
    PROTOCOL_KEYS,
    _kept_cells,
    _open_protocol,
    _read_jsonl,
    chunks_of,
    engine_digest,
    run_protocol,
)
from batch_report import protocol_table, write_page  # noqa: E402
from batch_run import cell_order, recost, run_interleaved  # noqa: E402, F401
from batch_summary import _ratio_ci, protocol_summary  # noqa: E402, F401
from batch_workload import CONFIGS, LOSSLESS, PADDED, _settings, config_names, load_prompts, unknown_configs  # noqa: E402, F401


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
    unknown = unknown_configs(a.configs)
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
        write_page(Path(a.out), json.loads((Path(a.out) / "results.json").read_text()))
        return 0
    from vskip.engine.door import open_decoder, open_models

    names = config_names(a.configs)
    base = _settings("strict", a.gamma, a.max_new_tokens, a.shadow, a.threads)
    pair = open_models(base.models, True)
    prompts = load_prompts(a, pair.tokenizer)
    decoders = {n: open_decoder(_settings(n, a.gamma, a.max_new_tokens, a.shadow, a.threads), pair=pair) for n in names}
    forwards = Forwards(pair)
    decoders[names[0]].warmup(prompts[0][1])
    loaded_rss = _rss()  # the pair loaded and warmed up
    if a.chunk_size:
        from vskip.engine.runtime import machine, machine_id

        info = machine(pair.runtime)
        out = run_protocol(a, pair, decoders, prompts, forwards, machine_id(info), info, loaded_rss)
        return main(["--summary", "--out", str(out)])
    if a.recost:
        return recost(a, argv, pair, decoders, prompts)
    return run_interleaved(a, argv, pair, decoders, prompts, forwards, loaded_rss)


if __name__ == "__main__":
    sys.exit(main())
