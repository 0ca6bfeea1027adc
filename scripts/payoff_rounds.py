"""Where the default decode's time goes: its rounds by source, and what a round costs by its rows.

Decodes the first ``--limit`` prompts of ``--task`` with the default decode (Strict SDD, each
round's draft from the copy hint, the drafter or none, as the measured costs say pays;
``--drafts payoff``) and writes, as JSON: each source's rounds, committed tokens and scored rows;
the costs the decoder's chooser measured (rows: block length + 1, a trimmed drafter block
scores fewer) (a round's seconds by the rows it scores, a drafter call
per sequence, the drafter's yield per copy-match bucket); and, in a separate measurement after the
decodes, the verifier's forward by rows at the mean context of the decodes, the sizes rotated
through ``--repeats`` times (median, min and max), beside the machine, the runtime and the
variant. Usage::

    python scripts/payoff_rounds.py --task humaneval --limit 40 --out docs/results/payoff/rounds-he40.json
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

from tqdm import tqdm

from vskip.bench.tasks import encode_problem, load_task
from vskip.commands import build_parser
from vskip.commands.flags import settings
from vskip.engine.door import open_decoder
from vskip.engine.runtime import machine
from vskip.files import write_json

#: the rows of the forwards timed after the decodes (one scored position, and drafts of 1 to 8 and 16)
ROWS = (1, 2, 3, 4, 5, 6, 7, 8, 9, 17)


def source_of(r) -> str:
    """A round's source, from its record: the copy hint, the drafter or the verifier alone."""
    return "copy" if r.reason == "copy" else ("drafter" if r.gamma else "alone")


def forward_costs(verifier, ids: list[int], repeats: int) -> dict:
    """The verifier's scoring call after ``ids`` by the rows it scores, in ms: sizes rotated."""
    seen = defaultdict(list)
    for rep in range(repeats):
        order = ROWS[rep % len(ROWS):] + ROWS[: rep % len(ROWS)]
        for n in order:
            t = time.perf_counter()
            verifier.score(ids, [int(x) for x in ids[-(n - 1):]] if n > 1 else [])
            seen[n].append(1000 * (time.perf_counter() - t))
    return {str(n): {"median": round(statistics.median(v), 3), "min": round(min(v), 3), "max": round(max(v), 3)}
            for n, v in seen.items()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--task", default="humaneval")
    ap.add_argument("--limit", type=int, default=40)
    ap.add_argument("--max-new-tokens", type=int, default=512)
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    s = settings(build_parser().parse_args(["generate", "x", "--max-new-tokens", str(a.max_new_tokens)]))
    dec = open_decoder(s)
    problems = load_task(a.task, limit=a.limit)
    prompts = [encode_problem(dec.pair.tokenizer, p) for p in problems]
    dec.warmup(prompts[0])
    by = defaultdict(lambda: {"rounds": 0, "tokens": 0, "rows": 0, "accepted": 0})
    seconds = defaultdict(float)
    contexts = []
    for ids in tqdm(prompts, desc="decode", unit="prompt", file=sys.stderr):
        res = dec.decode(ids)
        for part in ("decode", "draft", "verify"):
            seconds[part] += getattr(res, f"{part}_seconds")
        for r in res.rounds:
            b = by[source_of(r)]
            b["rounds"] += 1
            b["tokens"] += r.committed
            b["accepted"] += r.accepted
            b["rows"] += r.gamma + 1  # a trimmed drafter block scores fewer
        contexts.append(len(ids) + len(res.tokens) // 2)
    costs = dec.chooser.costs()
    ms = lambda x: None if x is None else round(1000 * x, 3)  # noqa: E731
    tokens = sum(b["tokens"] for b in by.values())
    rounds = sum(b["rounds"] for b in by.values())
    middle = prompts[0] + [0] * max(0, int(statistics.mean(contexts)) - len(prompts[0]))
    out = {
        "command": f"python scripts/payoff_rounds.py --task {a.task} --limit {a.limit} --out {a.out}",
        "machine": machine(dec.runtime), "task": a.task, "n_prompts": len(prompts),
        "max_new_tokens": a.max_new_tokens, "tokens": tokens, "rounds": rounds,
        "tokens_per_round": round(tokens / rounds, 4), "tokens_per_s": round(tokens / seconds["decode"], 2),
        "seconds": {k: round(v, 3) for k, v in seconds.items()},
        "sources": {k: {**v, "share_of_rounds": round(v["rounds"] / rounds, 4),
                        "tokens_per_round": round(v["tokens"] / v["rounds"], 4)} for k, v in sorted(by.items())},
        "chooser": {"round_ms_by_rows": {str(n): ms(c) for n, c in enumerate(costs.by_rows, 1) if c is not None},
                    "line_ms": {"base": ms(costs.base), "per_row": ms(costs.per_row)},
                    "drafter_call_ms": ms(costs.draft),
                    "drafter_yield_by_bucket": [dec.chooser.drafter_yield(b)
                                                for b in range(len(dec.chooser.odds.length_edges) + 1)]},
        "forward_ms_by_rows": {"context": len(middle), "repeats": a.repeats,
                               "ms": forward_costs(dec.pair.verifier, middle, a.repeats)},
    }
    write_json(Path(a.out), out)
    print(f"{len(prompts)} prompts: {tokens} tokens in {rounds} rounds ({out['tokens_per_round']} a round), "
          f"{out['tokens_per_s']} tokens/s; by source: "
          + ", ".join(f"{k} {v['rounds']} rounds {v['tokens_per_round']} tokens each" for k, v in out["sources"].items()),
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
