"""Two drafters on the same prompts: the ratio of their tokens per verifier call, paired per prompt,
with a percentile bootstrap interval over prompts. Reads finished lossless `vskip run` directories
(same task, policy and budget; one per drafter), so nothing is decoded here::

    python benchmarks/paired_drafters.py --pair runs/v2/he64-net runs/v3/he64-net \
        --pair runs/v2/mbpp64-net runs/v3/mbpp64-net --out docs/results/drafter-v3/paired

A ratio above 1 means the second run drafts more tokens per call. Both runs must have committed
the same tokens on every shared prompt (lossless runs of one verifier do), so the ratio of tokens
per call is the inverse ratio of verifier calls.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np


def per_prompt(run_dir: Path) -> dict[str, tuple[int, int]]:
    """task id -> (generated tokens, verifier calls) of a finished run."""
    path = Path(run_dir) / "samples.jsonl"
    if not path.exists():
        raise SystemExit(f"paired_drafters: {run_dir} is not a finished `vskip run` directory (no samples.jsonl)")
    from vskip.files import read_jsonl

    return {s["task_id"]: (int(s["generated_tokens"]), int(s["verifier_calls"])) for s in read_jsonl(path)}


def paired_ratio(a: dict, b: dict, resamples: int = 10_000, seed: int = 0) -> dict:
    """Tokens per call of b over a's on their shared prompts, and a 95% bootstrap interval."""
    ids = sorted(set(a) & set(b))
    if not ids:
        raise SystemExit("paired_drafters: the two runs share no prompt")
    tok = np.array([a[i][0] for i in ids])
    if any(a[i][0] != b[i][0] for i in ids):
        raise SystemExit("paired_drafters: the runs generated different token counts on a shared prompt (not lossless?)")
    ca = np.array([a[i][1] for i in ids], dtype=float)
    cb = np.array([b[i][1] for i in ids], dtype=float)
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(ids), size=(resamples, len(ids)))
    boot = ca[idx].sum(1) / cb[idx].sum(1)
    lo, hi = np.quantile(boot, [0.025, 0.975])
    return {"prompts": len(ids), "tokens": int(tok.sum()), "tokens_per_call_a": float(tok.sum() / ca.sum()),
            "tokens_per_call_b": float(tok.sum() / cb.sum()), "ratio": float(ca.sum() / cb.sum()),
            "ci95": [float(lo), float(hi)], "prompts_b_fewer_calls": int((cb < ca).sum()),
            "prompts_b_more_calls": int((cb > ca).sum())}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pair", nargs=2, action="append", required=True, metavar=("A", "B"),
                    help="two run directories of the same prompts and settings (repeatable)")
    ap.add_argument("--resamples", type=int, default=10_000)
    ap.add_argument("--out", help="directory for results.json and results.md")
    a = ap.parse_args(argv)
    from tabulate import tabulate

    res = [{"a": A, "b": B} | paired_ratio(per_prompt(Path(A)), per_prompt(Path(B)), a.resamples) for A, B in a.pair]
    table = tabulate([[r["a"], r["b"], r["prompts"], f"{r['tokens_per_call_a']:.3f}", f"{r['tokens_per_call_b']:.3f}",
                       f"{r['ratio']:.3f}", f"[{r['ci95'][0]:.3f}, {r['ci95'][1]:.3f}]",
                       f"{r['prompts_b_fewer_calls']}/{r['prompts_b_more_calls']}"] for r in res],
                     headers=["A", "B", "prompts", "tok/call A", "tok/call B", "B / A", "95% CI (prompts)",
                              "B fewer/more calls"])
    print(table)
    if a.out:
        out = Path(a.out)
        out.mkdir(parents=True, exist_ok=True)
        cmd = "python benchmarks/paired_drafters.py " + " ".join(sys.argv[1:] if argv is None else argv)
        from vskip.files import write_atomic, write_json

        write_json(out / "results.json", {"command": cmd, "pairs": res})
        write_atomic(out / "results.md", f"`{cmd}`\n\n```\n{table}\n```\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
