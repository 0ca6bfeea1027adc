"""The full lossless check: on N HumanEval prompts with the embedded pair, Strict SDD must produce
token for token the verifier's own greedy output (``ar``), with the verifier cache on and off.
A thin caller of ``vskip compare --configs ar,strict,strict+cache=off``: it prints the comparison
and the first divergence of any mismatch, and exits 1 if there is one. Usage::

    python scripts/check_lossless.py --limit 20 --max-new-tokens 128
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from vskip.cli import main as vskip
from vskip.study.compare_summary import rows_of, summarize_comparison


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--limit", type=int, default=20)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--gamma", type=int, default=16)
    ap.add_argument("--threads", type=int)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--drafter")
    ap.add_argument("--out", help="keep the comparison's rows here (default: a temporary directory)")
    a = ap.parse_args(argv)

    with tempfile.TemporaryDirectory() as tmp:
        out = a.out or tmp
        cmd = ["compare", "--task", "humaneval", "--limit", str(a.limit), "--configs", "ar,strict,strict+cache=off",
               "--max-new-tokens", str(a.max_new_tokens), "--gamma", str(a.gamma), "--dtype", a.dtype, "--out", out]
        cmd += ["--threads", str(a.threads)] if a.threads else []
        cmd += ["--drafter", a.drafter] if a.drafter else []
        rc = vskip(cmd)
        if rc:
            return rc
        s = summarize_comparison(rows_of(Path(out)))
    bad = 0
    for name, d in s["configs"].items():
        if d["same_as_ar"] != s["n_prompts"]:
            bad += 1
            div = d["first_divergence"]
            print(f"MISMATCH {name}: {s['n_prompts'] - d['same_as_ar']} of {s['n_prompts']} outputs differ from ar's "
                  f"(first divergence at token {div['min']} at the earliest)")
    print(f"{'every' if not bad else 'not every'} Strict SDD output equals ar's on {s['n_prompts']} prompts, "
          "verifier cache on and off")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
