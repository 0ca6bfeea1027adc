"""pass@1 of the native runtime's greedy decode against the float32 transformers reference, paired
by task: the ``ar`` outputs of two ``vskip compare`` directories on the same task, prompts and new
tokens (the reference's rows committed with an earlier study, the native ones made since), scored
in the sandbox. Prints and writes each one's pass@1, the tasks one passes and the other fails, an
exact two-sided sign (McNemar) test of those, and a 95% bootstrap interval of the paired
difference over tasks. Usage::

    python benchmarks/runtime_quality.py --task humaneval --reference docs/results/speed/default-he164 \\
        --native docs/results/runtime/he164-512 --out docs/results/runtime/quality-he164.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np


def ar_outputs(directory: Path, config: str = "ar") -> dict[str, list[int]]:
    """Task id -> output ids of ``config``'s first repeat in a comparison directory."""
    from vskip.study.compare import read_rows

    out = {}
    for f in sorted(directory.glob("shard-*.jsonl*")):
        for r in read_rows(f):
            if r.config == config and r.repeat == 0 and r.tokens is not None:
                out[r.task_id] = r.tokens
    if not out:
        raise ValueError(f"{directory} holds no rows of {config}")
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--task", required=True)
    p.add_argument("--reference", type=Path, required=True, help="comparison directory of the float32 reference")
    p.add_argument("--native", type=Path, required=True, help="comparison directory of the native runtime")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--boot", type=int, default=10000)
    a = p.parse_args(argv)

    from scipy.stats import binomtest
    from transformers import AutoTokenizer

    from vskip.bench import scoring, tasks
    from vskip.engine.models.verifiers import resolve_verifier_dir
    from vskip.stats import bootstrap_means, percentile_interval

    settings = {}
    for name, d in (("reference", a.reference), ("native", a.native)):
        s = json.loads((d / "settings.json").read_text())["fixed"]
        settings[name] = {"task": s["task"], "max_new_tokens": s["max_new_tokens"],
                          "runtime": (s.get("runtime") or {}).get("verifier_runtime", "transformers")}
        if s["task"] != a.task:
            raise ValueError(f"{d} decoded {s['task']}, not {a.task}")
    if settings["reference"]["max_new_tokens"] != settings["native"]["max_new_tokens"]:
        raise ValueError("the two comparisons decoded to different lengths")
    ref, nat = ar_outputs(a.reference), ar_outputs(a.native)
    common = sorted(set(ref) & set(nat))
    tok = AutoTokenizer.from_pretrained(resolve_verifier_dir(None), local_files_only=True)
    problems = {q.task_id: q for q in tasks.load_task(a.task, ids=common)}
    passed = {}
    for name, outs in (("reference", ref), ("native", nat)):
        texts = [tok.decode(outs[t], skip_special_tokens=True) for t in common]
        res = scoring.score_many([problems[t] for t in common], texts, progress=False)
        passed[name] = np.array([bool(r.passed) for r in res])
    r, n = passed["reference"], passed["native"]
    gain, loss = int((n & ~r).sum()), int((~n & r).sum())
    diff = n.astype(float) - r.astype(float)
    lo, hi = percentile_interval(bootstrap_means(diff, a.boot, seed=0)) or (None, None)
    out = {"task": a.task, "tasks": len(common), "settings": settings,
           "reference": {"pass_at_1": float(r.mean()), "passed": int(r.sum())},
           "native": {"pass_at_1": float(n.mean()), "passed": int(n.sum())},
           "same_output": sum(ref[t] == nat[t] for t in common),
           "native_minus_reference": {"difference": float(diff.mean()), "ci95": [lo, hi],
                                      "native_only": gain, "reference_only": loss,
                                      "mcnemar_p": float(binomtest(gain, gain + loss).pvalue) if gain + loss else 1.0}}
    a.out.parent.mkdir(parents=True, exist_ok=True)
    from vskip.files import write_json

    write_json(a.out, out)
    d = out["native_minus_reference"]
    print(f"{a.task}, {len(common)} tasks: reference pass@1 {r.mean():.4f} ({r.sum()}), native {n.mean():.4f} ({n.sum()}); "
          f"native - reference {d['difference']:+.4f} [{lo:+.4f}, {hi:+.4f}], {gain} tasks passed by native alone, "
          f"{loss} by the reference alone (sign test p = {d['mcnemar_p']:.3f}); identical outputs on {out['same_output']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
