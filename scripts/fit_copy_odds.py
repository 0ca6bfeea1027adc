"""Fit the copy odds and write the corpus the payoff chooser ships with (``vskip/assets/copy_odds.json``,
``vskip/assets/copy_corpus.json``).

The corpus is the embedded verifier's own greedy answers to MBPP problems outside every
evaluation set (the 300 after the first 200, which MBPP200 takes), decoded by ``vskip run
--policy ar`` into ``--run`` (resumable; a directory that holds the answers already is read as
it is). The odds are how often a hint's first j tokens are all the verifier's greedy tokens, per
source (the sequence itself, or the corpus) and match length
(:func:`vskip.engine.models.copy.fit_copy_odds`), fitted on the same answers, each answer's hints
from the corpus leaving that answer out. Usage::

    python scripts/fit_copy_odds.py --run runs/copy-odds-ar
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

from vskip.bench.tasks import encode_problem, load_task
from vskip.cli import main as vskip
from vskip.engine.chooser import CORPUS_FILE, ODDS_FILE
from vskip.engine.models.copy import Corpus, fit_copy_odds, tokenizer_fingerprint
from vskip.engine.models.verifiers import resolve_verifier_dir, verifier_tokenizer
from vskip.files import write_json

#: the MBPP problems the odds are fitted on: after the first 200 (MBPP200, the evaluation set)
HELD_OUT = slice(200, 500)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", required=True, help="the ar run directory (decoded here unless it holds the answers)")
    ap.add_argument("--out", default=str(ODDS_FILE), help="where the odds go (default: the shipped file)")
    ap.add_argument("--corpus", default=str(CORPUS_FILE), help="where the corpus goes (default: the shipped file)")
    ap.add_argument("--max-new-tokens", type=int, default=512)
    a = ap.parse_args(argv)
    problems = load_task("mbpp")[HELD_OUT]
    run = Path(a.run)
    decode = ["run", "--task", "mbpp", "--ids", ",".join(p.task_id for p in problems), "--policy", "ar",
              "--max-new-tokens", str(a.max_new_tokens), "--no-score", "--quiet", "--out", str(run)]
    samples = run / "samples.jsonl"
    if not samples.exists() or sum(1 for _ in samples.open()) < len(problems):
        if vskip(decode) != 0:
            return 1
    answers = {r["task_id"]: r["tokens"] for r in map(json.loads, samples.read_text().splitlines())}
    tok = verifier_tokenizer(resolve_verifier_dir(None))
    pairs = [(encode_problem(tok, p), answers[p.task_id]) for p in problems if p.task_id in answers]
    source = {"prompts": len(pairs), "task": "mbpp", "problems": f"{HELD_OUT.start}..{HELD_OUT.stop - 1}",
              "answers": f"vskip {shlex.join(decode[:4])} <the {len(problems)} ids> {shlex.join(decode[5:-2])}",
              "command": "python scripts/fit_copy_odds.py --run DIR"}
    corpus = Corpus.of_answers([ans for _, ans in pairs], tokenizer_fingerprint(tok), source)
    odds = fit_copy_odds(pairs, corpus=corpus)
    write_json(Path(a.corpus), corpus.to_json(), indent=None)
    write_json(Path(a.out), odds.to_json() | {"meta": {**odds.meta, **source}})
    first = {src: [round(row[0], 3) for row in rows] for src, rows in (("context", odds.survival),
                                                                         ("corpus", odds.corpus))}
    print(f"copy odds from {len(pairs)} answers ({len(corpus.tokens)} corpus tokens), {odds.meta['positions']} "
          f"matched positions; P(first token right) by match bucket {list(odds.length_edges)}: {first}",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
