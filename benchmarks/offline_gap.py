"""Where the drafter's offline acceptance and its acceptance on an evaluation task part ways: the
held-out Strict SDD acceptance that training reports (random block starts anywhere in the held-out
answers), the same restricted to the first tokens of each answer, to answers that do not end in a
loop, by prompt source, and on an evaluation task's prompts with the verifier's own answers (taken
from a finished run). Everything offline, at the first reveal step, network alone (no copy prior)::

    python benchmarks/offline_gap.py --train runs/drafter-v2 --runs runs/v2/he64-net runs/v2/mbpp64-net \
        --first 64 --blocks 200 --out docs/results/drafter-v2/offline-gap
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np


def _truncate(data, first: int | None):
    from vskip.distill.rows import Data

    if first is None:
        return data
    return Data([r[: P + first] for r, P in zip(data.rows, data.prompt_lens)], data.prompt_lens, data.prompt_ids)


def _subset(data, keep):
    from vskip.distill.rows import Data

    idx = [i for i in range(len(data)) if keep(i)]
    return Data([data.rows[i] for i in idx], [data.prompt_lens[i] for i in idx], [data.prompt_ids[i] for i in idx])


def task_rows(run_dir: Path, tokenizer):
    """Rows of a finished `vskip run` (prompt ids through the chat template + the run's output,
    which for a lossless run is the verifier's own answer)."""
    from vskip.bench import tasks
    from vskip.distill.rows import Data
    from vskip.engine.prompting import encode_chat
    from vskip.study.rundir import SAMPLES, read_rows

    cfg = json.loads((run_dir / "config.json").read_text())["run"]
    problems = {p.task_id: p for p in tasks.load_task(cfg["task"], limit=cfg.get("limit"))}
    rows, plens, ids = [], [], []
    for s in read_rows(run_dir / SAMPLES):
        prompt = encode_chat(tokenizer, tasks.user_prompt(problems[s["task_id"]]))
        rows.append(np.asarray(list(prompt) + list(s["tokens"]), np.int64))
        plens.append(len(prompt))
        ids.append(s["task_id"])
    return cfg["task"], Data(rows, plens, ids)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--train", required=True, help="the drafter's training run (its held-out split)")
    ap.add_argument("--data", default="datasets/distill")
    ap.add_argument("--drafter", help="drafter directory (default: the embedded one)")
    ap.add_argument("--runs", nargs="*", default=[], metavar="DIR", help="finished lossless `vskip run` directories")
    ap.add_argument("--first", type=int, default=64, help="answer tokens of the restricted groups (default: 64)")
    ap.add_argument("--blocks", type=int, default=200)
    ap.add_argument("--by-source", action="store_true", help="also one group per prompt source")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out")
    a = ap.parse_args(argv)
    for d in a.runs:
        if not (Path(d) / "samples.jsonl").exists() or not (Path(d) / "config.json").exists():
            ap.error(f"--runs {d}: not a finished `vskip run` directory (no samples.jsonl or config.json)")
    if not (Path(a.train) / "config.json").exists():
        ap.error(f"--train {a.train}: not a drafter training run (no config.json)")

    import torch
    from tabulate import tabulate

    from vskip.distill.offline import acceptance
    from vskip.distill.rows import load_rows, split
    from vskip.distill.shards import ends_in_a_loop
    from vskip.engine.models.config import ModelConfig
    from vskip.engine.door import open_models

    cfg = json.loads((Path(a.train) / "config.json").read_text())["train"]
    pair = open_models(ModelConfig(drafter=a.drafter, device="cpu", dtype="float32", drafter_dtype="float32",
                                 threads=a.threads, copy_prior="off"))
    model = pair.drafter.model
    _, ho = split(load_rows(Path(a.data)), cfg["holdout"], cfg["seed"])
    loops = [ends_in_a_loop(r[P:]) for r, P in zip(ho.rows, ho.prompt_lens)]
    source = [pid.split("/", 1)[0] for pid in ho.prompt_ids]
    groups = {"held out, anywhere in the answer (as training reports)": ho,
              f"held out, first {a.first} answer tokens": _truncate(ho, a.first),
              f"held out, first {a.first}, answers not ending in a loop": _truncate(_subset(ho, lambda i: not loops[i]), a.first)}
    for src in sorted(set(source)) if a.by_source else []:
        groups[f"held out, first {a.first}, source {src}"] = _truncate(_subset(ho, lambda i, s=src: source[i] == s), a.first)
    for d in a.runs:
        task, data = task_rows(Path(d), pair.tokenizer)
        groups[f"{task} ({len(data)} prompts), first {a.first}, the verifier's answers"] = _truncate(data, a.first)
    res = {}
    for name, data in groups.items():
        r = acceptance(model, data, n_blocks=a.blocks)
        res[name] = {"rows": len(data), "blocks": r["n"], "first_step_top1": r["first_step_top1"],
                     "p_L_ge1": r["p_L_ge"][0], "tokens_per_call": r["tokens_per_call"]}
        print(name, res[name], file=sys.stderr)
    table = tabulate([[k, v["rows"], v["blocks"], f"{v['first_step_top1']:.3f}", f"{v['p_L_ge1']:.3f}",
                       f"{v['tokens_per_call']:.2f}"] for k, v in res.items()],
                     headers=["group", "answers", "blocks", "first-step top-1", "P(L>=1)", "tokens/call"])
    head = (f"gamma 8, one reveal step, network alone, float32; {a.blocks} random block starts per group; "
            f"held-out loop share {np.mean(loops):.3f}")
    print(table + "\n" + head)
    if a.out:
        out = Path(a.out)
        out.mkdir(parents=True, exist_ok=True)
        cmd = "python benchmarks/offline_gap.py " + " ".join(sys.argv[1:] if argv is None else argv)
        (out / "results.json").write_text(json.dumps({"command": cmd, "groups": res, "loop_share": float(np.mean(loops))},
                                                     indent=1))
        (out / "results.md").write_text(f"`{cmd}`\n\n```\n{table}\n{head}\n```\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
