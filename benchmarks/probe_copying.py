"""How much of the verifier's output is a copy of its context, and whether the drafter copies it.

Reads the verifier's own greedy answers from a finished ``vskip run --policy ar`` (or any lossless
run) directory and reports two things:

1. copy-continuation: at every position of every answer, continue from the most recent earlier
   occurrence of the last two tokens (prompt-lookup style) and count how many of the next gamma
   verifier tokens that continuation matches: an estimate of what a drafter that copies could be
   accepted;
2. the drafter: at ``--per-prompt`` random positions per prompt, its draft block's strict accepted
   length, split by whether the verifier's next token is an induction copy (the bigram
   (previous, next) already occurs earlier in the sequence). Usage::

    python benchmarks/probe_copying.py runs/he164/ar [--drafter DIR] [--per-prompt 8] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
from tqdm import tqdm

from vskip.bench import tasks
from vskip.engine.models.config import ModelConfig
from vskip.engine.door import open_models
from vskip.engine.prompting import encode_chat
from vskip.study.rundir import SAMPLES, read_rows


def accepted(draft, ref, g: int) -> int:
    L = 0
    while L < len(draft) and g + L < len(ref) and draft[L] == ref[g + L]:
        L += 1
    return L


def lookup_length(seq: list[int], ref: list[int], g: int, gamma: int) -> int:
    key = seq[-2:]
    for i in range(len(seq) - 3, -1, -1):
        if seq[i:i + 2] == key:
            return accepted(seq[i + 2:i + 2 + gamma], ref, g)
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", help="run directory whose samples.jsonl holds the verifier's tokens")
    ap.add_argument("--drafter")
    ap.add_argument("--gamma", type=int, default=16)
    ap.add_argument("--per-prompt", type=int, default=8)
    ap.add_argument("--threads", type=int)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    run = Path(a.run)
    task = json.loads((run / "config.json").read_text())["run"]["task"]
    samples = {s["task_id"]: s["tokens"] for s in read_rows(run / SAMPLES)}
    pair = open_models(ModelConfig(drafter=a.drafter, device="cpu", dtype="float32", threads=a.threads))
    problems = [p for p in tasks.load_task(task) if p.task_id in samples]
    rng = np.random.default_rng(a.seed)
    lookup, split = [], {True: [], False: []}
    for p in tqdm(problems, desc="probe", unit="prompt", file=sys.stderr):
        ids = list(encode_chat(pair.tokenizer, tasks.user_prompt(p)))
        ref = samples[p.task_id]
        lookup += [lookup_length(ids + ref[:g], ref, g, a.gamma) for g in range(len(ref))]
        if len(ref) < 3:
            continue
        for g in sorted(rng.choice(np.arange(1, len(ref) - 1), size=min(a.per_prompt, len(ref) - 2), replace=False)):
            seq = ids + ref[:g]
            copy = any(seq[i] == seq[-1] and seq[i + 1] == ref[g] for i in range(len(seq) - 1))
            split[copy].append(accepted(pair.drafter.propose(seq, a.gamma).tokens.tolist(), ref, g))
    L = np.array(lookup)
    print(f"{len(problems)} prompts, {len(L)} positions, gamma {a.gamma}")
    print(f"copy-continuation: P(L>=1) {np.mean(L >= 1):.3f}  P(L>=4) {np.mean(L >= 4):.3f}  mean L {L.mean():.2f}")
    for copy in (True, False):
        x = np.array(split[copy])
        print(f"drafter, next token {'is' if copy else 'is not'} an induction copy: n {len(x)}  "
              f"P(L>=1) {np.mean(x >= 1):.3f}  mean L {x.mean():.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
