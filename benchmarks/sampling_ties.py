"""Why a sampled configuration that commits `ar`'s own draws drew another token than `ar`.

With the coupled rule (the default under sampling) Strict SDD commits, at every position, the
verifier's inverse-CDF draw with that position's uniform number: `ar`'s tokens, up to rounding.
A verification of 9 positions, in a batch, and a 1-position `ar` step round their float32 logits
differently, and near a boundary of the cumulative sum that is enough to draw a neighbouring id.
For each prompt of a `vskip compare` directory where CONFIG's output leaves `ar`'s, this recomputes
in float64 the verifier's warped distribution at the first differing position, given the prefix
both committed, and writes the margin of that position's uniform number: how far it lies from the
cumulative sum's intervals of the two ids, the larger distance (`vskip.engine.policy.sampling.
tie_margin`), and which id float64 draws.
Rounding ties have margins of the order of float32 rounding of a cumulative sum (1e-6 here);
a margin near the spacing of the distribution's mass would mean the forwards did not compute one
distribution, a bug.

    python benchmarks/sampling_ties.py docs/results/sampling/he164-T1.0 --config strict

writes DIR/ties.json: one row per differing prompt, their largest and median margins, the
largest probability either drawn token had, and the ties per draw compared (the draws both made
up to and including each first difference).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch


def first_difference(ref: list[int], got: list[int]) -> int | None:
    """The first position where ``got`` leaves ``ref`` (None: equal, or one a prefix of the other)."""
    return next((i for i, (a, b) in enumerate(zip(ref, got)) if a != b), None)


def ties(directory: Path, config: str = "strict", progress: bool = True) -> dict:
    from tqdm import tqdm
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from vskip.bench import tasks
    from vskip.engine.models.verifiers import resolve_verifier_dir
    from vskip.engine.models.sampling import warped_probs
    from vskip.engine.policy import Sampling, prompt_key
    from vskip.engine.policy.sampling import inverse_cdf, tie_margin
    from vskip.files import read_json
    from vskip.study.compare import read_rows, settings_task

    settings = read_json(directory / "settings.json", "comparison settings")
    if config not in settings.get("configs", {}) or "ar" not in settings["configs"]:
        raise ValueError(f"{directory} compares no {config!r} with ar")
    s = Sampling(**settings["configs"][config]["decode"]["sampling"])
    if s.greedy or s.speculative:
        raise ValueError(f"{config} in {directory} does not commit ar's draws (greedy, or the standard rule)")
    out = {}
    for f in sorted(directory.glob("shard-*.jsonl")) + sorted(directory.glob("shard-*.jsonl.gz")):
        for r in read_rows(f):
            if r.repeat == 0 and r.config in ("ar", config):
                out.setdefault(r.task_id, {})[r.config] = r.tokens
    pairs = {t: (c["ar"], c[config]) for t, c in out.items() if "ar" in c and config in c}
    if any(a is None or b is None for a, b in pairs.values()):
        raise ValueError(f"{directory}: rows without their output tokens; nothing to compare")
    differ = {t: p for t, p in pairs.items() if p[0] != p[1]}
    # the tokens drawn in both before a difference (and the differing one): the draws at risk of a tie
    at_risk = sum(min(len(a), len(b)) if (t := first_difference(a, b)) is None else t + 1 for a, b in pairs.values())

    where = resolve_verifier_dir((settings.get("fixed", {}).get("models") or {}).get("verifier"))
    tok = AutoTokenizer.from_pretrained(where)
    from vskip.engine.models.source import transformers_dir

    model = AutoModelForCausalLM.from_pretrained(transformers_dir(str(where)), dtype=torch.float64).eval()
    problems = {p.task_id: p for p in tasks.load_task(settings_task(directory), ids=sorted(differ))}
    rows = []
    for tid, (ref, got) in tqdm(sorted(differ.items()), desc="float64", disable=not progress):
        t = first_difference(ref, got)
        if t is None:
            rows.append({"task_id": tid, "position": None, "why": "one output is a prefix of the other"})
            continue
        prompt = tasks.encode_problem(tok, problems[tid])
        with torch.inference_mode():
            z = model(input_ids=torch.tensor([prompt + ref[:t]])).logits[0, -1:]
        p = warped_probs(z, s)[0].numpy()
        u = float(s.uniforms(prompt_key(tid, prompt), t, 1)[0])
        rows.append({"task_id": tid, "position": t, "ar": ref[t], config: got[t], "float64": inverse_cdf(p, u),
                     "margin": tie_margin(p, u, ref[t], got[t]), "p_ar": float(p[ref[t]]), f"p_{config}": float(p[got[t]])})
    margins = [r["margin"] for r in rows if "margin" in r]
    return {"directory": str(directory), "config": config, "sampling": settings["configs"][config]["decode"]["sampling"],
            "prompts": len(pairs), "equal": len(pairs) - len(differ), "differ": len(differ),
            "draws_compared": at_risk, "ties_per_draw": len(differ) / at_risk if at_risk else None,
            "max_margin": max(margins) if margins else None,
            "median_margin": float(np.median(margins)) if margins else None,
            "max_probability": max((max(r["p_ar"], r[f"p_{config}"]) for r in rows if "margin" in r), default=None),
            "float64_draws_one_of_the_two": sum(r["float64"] in (r["ar"], r[config]) for r in rows if "margin" in r),
            "rows": rows}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("directory", type=Path, help="a vskip compare directory with settings.json and shard rows")
    ap.add_argument("--config", default="strict", help="the configuration to set against ar (default: strict)")
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args(argv)
    from vskip.files import write_json

    torch.set_num_threads(a.threads)
    res = ties(a.directory, a.config)
    write_json(a.directory / "ties.json", res)
    print(f"{a.config} = ar on {res['equal']} of {res['prompts']} prompts; {res['differ']} differ, largest float64 "
          f"margin {res['max_margin']}; float64 draws one of the two tokens on {res['float64_draws_one_of_the_two']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
