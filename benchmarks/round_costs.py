"""Where a round's time goes on the native runtime: the drafter's layers, its embedding of the
block, its head and reveal, the verifier's forward, and the Python of the loop around them.

Decodes ``--limit`` HumanEval prompts with each of ``--configs`` (default ``ar,strict``) through the
door ``vskip generate`` uses, the configurations interleaved, ``--repeats`` times, with timers
around the calls that do the arithmetic: the native forward of the drafter (``NativeBody``: its
layers), the drafter's embedding of its query rows, the drafter's reveal steps (head, softmax,
copy mixture, top-k: :meth:`DiffusionDrafter.step_output`), and the native forward of the
verifier. What the decode's clock holds beyond them is the loop's own Python (policy, commits,
records, the adapters' bookkeeping). Prints per round and per committed token, medians over
repeats, and writes ``costs.json``. Usage::

    python benchmarks/round_costs.py --limit 8 --max-new-tokens 256 --repeats 3 --out DIR
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

PARTS = ("drafter layers", "drafter embedding", "drafter head and reveal", "verifier forward")


class Timers:
    """Seconds spent inside wrapped callables, by part."""

    def __init__(self):
        self.s = {p: 0.0 for p in PARTS}

    def wrap(self, obj, name: str, part: str) -> None:
        fn = getattr(obj, name)

        def timed(*a, **k):
            t = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                self.s[part] += time.perf_counter() - t

        setattr(obj, name, timed)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--limit", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--configs", default="ar,strict")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", type=Path, default=None)
    a = p.parse_args(argv)

    from vskip.bench import tasks
    from vskip.commands import build_parser
    from vskip.commands.flags import settings
    from vskip.engine.door import open_decoder
    from vskip.engine.prompting import encode_chat

    configs = [c for c in a.configs.split(",") if c]
    decoders = {}
    for c in configs:
        s = settings(build_parser().parse_args(["generate", "x", "--policy", c, "--max-new-tokens",
                                                str(a.max_new_tokens), "--threads", str(a.threads)]))
        decoders[c] = open_decoder(s, pair=next(iter(decoders.values())).pair if decoders else None,
                                   drafter=True)
    pair = next(iter(decoders.values())).pair
    if pair.verifier.__class__.__name__ != "NativeVerifier":
        raise SystemExit("the verifier is not on the native runtime here")
    timers = Timers()
    body = pair.drafter.body
    timers.wrap(body.net, "forward", "drafter layers")
    timers.wrap(body, "_embed", "drafter embedding")
    timers.wrap(pair.drafter, "step_output", "drafter head and reveal")
    timers.wrap(pair.verifier.net, "forward", "verifier forward")
    problems = tasks.load_task("humaneval", limit=a.limit)
    prompts = [encode_chat(pair.tokenizer, tasks.user_prompt(q)) for q in problems]
    decoders[configs[0]].warmup(prompts[0])
    runs = {c: [] for c in configs}
    for rep in range(a.repeats):
        for c in configs if rep % 2 == 0 else configs[::-1]:
            dec = decoders[c]
            timers.s = {q: 0.0 for q in PARTS}
            wall = rounds = tokens = calls = 0
            for ids in prompts:
                pair.verifier.reset()
                pair.drafter.reset()
                r = dec.decode(ids)
                wall += r.decode_seconds
                rounds += len(r.rounds)
                tokens += len(r.tokens)
                calls += r.verifier_calls
            parts = dict(timers.s)
            parts["loop and adapters (Python)"] = wall - sum(parts.values())
            runs[c].append({"seconds": wall, "rounds": rounds, "tokens": tokens, "calls": calls, "parts": parts})
            print(f"{c} repeat {rep}: {tokens / wall:.1f} tok/s, {tokens / max(calls, 1):.2f} tokens/call", flush=True)
    out = {"settings": vars(a) | {"out": str(a.out)}, "runs": runs}
    for c in configs:
        rs = runs[c]
        med = lambda f: statistics.median(f(r) for r in rs)  # noqa: E731
        print(f"\n{c}: {med(lambda r: r['tokens'] / r['seconds']):.1f} tok/s; "
              f"{med(lambda r: r['tokens'] / max(r['calls'], 1)):.2f} tokens per verifier call; per round (ms):")
        for part in list(PARTS) + ["loop and adapters (Python)"]:
            ms = med(lambda r: 1e3 * r["parts"][part] / max(r["rounds"], 1))
            per_tok = med(lambda r: 1e3 * r["parts"][part] / max(r["tokens"], 1))
            print(f"  {part:28s} {ms:7.2f} ms/round  {per_tok:6.2f} ms/token")
        print(f"  {'all':28s} {med(lambda r: 1e3 * r['seconds'] / max(r['rounds'], 1)):7.2f} ms/round")
    if a.out:
        a.out.mkdir(parents=True, exist_ok=True)
        from vskip.files import write_json

        write_json(a.out / "costs.json", out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
