"""Compare two directories written by `vskip report`, table by table, on everything but timing.

A rerun of the same sweep decodes the same tokens (the loop is deterministic on a CPU), so calls,
blocks, pass@1, agreement and A must come out the same; tokens/s and what is derived from it
(speedup, c_D, c_V, K*, the Eq. 8 prediction, the fastest pick) depend on the machine's load and
cannot. Prints one line per table and every cell that differs; exits 1 when any does.

    python scripts/compare_reports.py docs/results/harness REGENERATED [--common]
"""

from __future__ import annotations

import argparse
import csv
import math
import sys
from pathlib import Path

#: columns measured with a clock, or chosen or derived from one
TIMED = {"tokens/s", "speedup", "strict tokens/s", "c_D (ms/block)", "c_V (ms/call)", "K*", "K* (strict)",
         "predicted k_min", "best k_min", "agree", "best above K*", "dominated by raw"}
#: row picks made by speed (their configuration depends on timing)
TIMED_PICKS = ("fastest", "highest speedup")


def _rows(path: Path) -> tuple[list[str], dict[tuple, dict]]:
    with open(path, newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    cols = list(rows[0]) if rows else []
    if "pick" in cols:  # the matched-quality table: one row per (method, relation, pick)
        keys = [k for k in ("method", "pass@1 vs strict", "pick") if k in cols]
        rows = [r for r in rows if not any(p in r["pick"] for p in TIMED_PICKS)]
    elif "config" in cols:
        keys = ["config"] + [k for k in ("dataset", "gamma") if k in cols]
    else:
        keys = cols[:1]
    out = {}
    for r in rows:
        key = tuple(r[k] for k in keys)
        if key in out:
            raise SystemExit(f"compare_reports: {path.name}: two rows share the key {key}")
        out[key] = r
    return cols, out


def _same(a: str, b: str, rel: float) -> bool:
    if a == b:
        return True
    try:
        x, y = float(a), float(b)
    except ValueError:
        return False
    return (math.isnan(x) and math.isnan(y)) or math.isclose(x, y, rel_tol=rel, abs_tol=rel)


def compare(old: Path, new: Path, rel: float = 1e-9, common: bool = False) -> int:
    """Print the comparison; 1 when a cell differs (with ``common``, rows or tables present in one
    report only are listed but do not count)."""
    differ = 0
    names = sorted({p.name for p in old.glob("*.csv")} | {p.name for p in new.glob("*.csv")})
    if not names:
        raise SystemExit(f"compare_reports: no tables (*.csv) in {old} or {new}")
    for name in names:
        if not (old / name).exists() or not (new / name).exists():
            print(f"{name}: only in {old if (old / name).exists() else new}")
            differ += not common
            continue
        cols_a, a = _rows(old / name)
        cols_b, b = _rows(new / name)
        if cols_a != cols_b:
            print(f"{name}: columns differ: {cols_a} against {cols_b}")
            differ += 1
            continue
        checked = [c for c in cols_a if c not in TIMED]
        cells, alone = [], []
        for key in sorted(set(a) | set(b)):
            if key not in a or key not in b:
                alone.append(f"  row {key}: only in {old if key in a else new}")
                continue
            cells += [f"  row {key}, {c}: {a[key][c]!r} against {b[key][c]!r}"
                      for c in checked if not _same(a[key][c], b[key][c], rel)]
        both = len(set(a) & set(b))
        status = "same" if not cells else f"{len(cells)} cells differ"
        print(f"{name}: {both} rows in both, {len(checked)} of {len(cols_a)} columns compared (the rest are "
              f"timed): {status}")
        for line in cells + alone:
            print(line)
        differ += len(cells) + (0 if common else len(alone))
    return 1 if differ else 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("old", type=Path, help="a report directory (the committed one)")
    ap.add_argument("new", type=Path, help="the same report regenerated")
    ap.add_argument("--rel", type=float, default=1e-9, help="relative tolerance of numbers (default: 1e-9)")
    ap.add_argument("--common", action="store_true",
                    help="compare the rows both reports hold; rows or tables of one only are listed, not counted")
    a = ap.parse_args(argv)
    for d in (a.old, a.new):
        if not d.is_dir():
            raise SystemExit(f"compare_reports: {d} is not a directory")
    return compare(a.old, a.new, a.rel, a.common)


if __name__ == "__main__":
    sys.exit(main())
