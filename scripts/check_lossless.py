"""The full lossless check: on N HumanEval prompts with the embedded pair, Strict SDD must produce
token for token the verifier's own greedy output (``--policy ar``), with the verifier cache on and
off. Prints the first divergence of any mismatch; exits 1 if there is one. Usage::

    python scripts/check_lossless.py --limit 20 --max-new-tokens 128
"""

from __future__ import annotations

import argparse
import sys

from tqdm import tqdm

from vskip.bench import tasks
from vskip.bench.tasks import encode_problem
from vskip.engine.decode import DecodeConfig, decode
from vskip.engine.models.config import ModelConfig
from vskip.engine.models.load import open_pair
from vskip.engine.policy import PolicyConfig


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--limit", type=int, default=20)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--gamma", type=int, default=16)
    ap.add_argument("--threads", type=int)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--drafter")
    a = ap.parse_args(argv)

    pair = open_pair(ModelConfig(drafter=a.drafter, device="cpu", dtype=a.dtype, threads=a.threads))
    cfg = DecodeConfig(gamma=a.gamma, max_new_tokens=a.max_new_tokens, shadow=False)
    bad = checked = tokens = accepted = rounds = 0
    for p in tqdm(tasks.load_task("humaneval", limit=a.limit), unit="prompt"):
        ids = encode_problem(pair.tokenizer, p)
        pair.verifier.set_cache(True)
        ref = decode(ids, None, pair.verifier, PolicyConfig(name="ar"), cfg).tokens
        for cache in (True, False):
            pair.verifier.set_cache(cache)
            res = decode(ids, pair.drafter, pair.verifier, PolicyConfig(name="strict"), cfg)
            checked += 1
            tokens += len(res.tokens)
            accepted += sum(r.L for r in res.rounds)
            rounds += len(res.rounds)
            if res.tokens != ref:
                bad += 1
                i = next((k for k, (x, y) in enumerate(zip(res.tokens, ref)) if x != y), min(len(res.tokens), len(ref)))
                print(f"MISMATCH {p.task_id} cache={cache}: first divergence at token {i} "
                      f"(strict {res.tokens[i:i + 3]} vs ar {ref[i:i + 3]})")
    print(f"{checked - bad}/{checked} strict decodes equal ar ({tokens} tokens, mean accepted length "
          f"{accepted / max(rounds, 1):.2f}, drafter={pair.identity.get('drafter')})")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
